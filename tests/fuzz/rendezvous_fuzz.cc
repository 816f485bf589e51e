// Fuzz target: the start-up rendezvous messages (src/cluster/rendezvous.h):
// the root's parse of a Hello and a joiner's parse of an Answer. Input: u8
// selector, then the message bytes (for an Answer: the 24-byte big-endian
// header, then the body). Oracle: an accepted Answer's lists have the
// counts its header gives and its index lies inside its role.
#include <cstdint>

#include "src/cluster/rendezvous.h"
#include "tests/fuzz/fuzz_util.h"

namespace in = rdmaps::internal;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::QuietLogs();
  rdmaps::fuzz::Bytes bytes(data, size);
  const std::uint8_t which = bytes.Take<std::uint8_t>();
  if (which % 2 == 0) {
    auto hello = in::ParseRendezvousHello(bytes.Rest());
    if (hello.ok() && hello->has_value()) {
      RDMAPS_FUZZ_ASSERT((*hello)->address.size() <= in::kMaxRendezvousAddress);
    }
    return 0;
  }
  char header[sizeof(in::AnswerHeader)] = {};
  const std::string_view rest = bytes.Rest();
  if (!rest.empty()) std::memcpy(header, rest.data(), std::min(rest.size(), sizeof(header)));
  in::AnswerHeader h = in::DecodeAnswerHeader(header);
  const std::string_view body = rest.size() > sizeof(header) ? rest.substr(sizeof(header)) : "";
  h.body_len = static_cast<std::uint32_t>(body.size());  // as RunJoin reads it
  auto r = in::ParseRendezvousAnswer(h, body, "fuzzed root");
  if (!r.ok()) return 0;
  RDMAPS_FUZZ_ASSERT(r->servers.size() == h.num_servers && r->workers.size() == h.num_workers);
  const std::size_t of = r->role == rdmaps::Role::kServer ? r->servers.size() : r->workers.size();
  RDMAPS_FUZZ_ASSERT(r->index >= 0 && static_cast<std::size_t>(r->index) < of);
  return 0;
}

// Fuzz target: the start-up rendezvous messages (src/cluster/rendezvous.h):
// a joiner's parse of the root's Challenge, the root's parse of a Hello, and
// a joiner's parse of an Answer and of what it carries. Input: u8 selector
// (mod 3: challenge, hello, answer), then exactly the message's bytes (for an
// Answer: the 56-byte big-endian header, then the body). Oracle: an accepted
// Hello's address fits its limit; an accepted Answer's lists have the counts
// its header gives and its index lies inside its role.
#include <cstdint>

#include "src/cluster/rendezvous.h"
#include "tests/fuzz/fuzz_util.h"

namespace in = rdmaps::internal;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::QuietLogs();
  rdmaps::fuzz::Bytes bytes(data, size);
  const std::uint8_t which = bytes.Take<std::uint8_t>() % 3;
  const std::string_view rest = bytes.Rest();
  const auto span = std::as_bytes(std::span<const char>(rest.data(), rest.size()));
  if (which == 0) {
    (void)in::ParseRendezvousChallenge(span);
    return 0;
  }
  if (which == 1) {
    auto hello = in::ParseRendezvousHello(span);
    if (hello.ok()) RDMAPS_FUZZ_ASSERT(hello->address.size() <= in::kMaxRendezvousAddress);
    return 0;
  }
  auto answer = in::ParseRendezvousAnswer(span);
  if (!answer.ok()) return 0;
  RDMAPS_FUZZ_ASSERT(answer->body.size() == answer->header.body_len);
  auto r = in::RendezvousResultOf(answer->header, answer->body, "fuzzed root");
  if (!r.ok()) return 0;
  const in::AnswerHeader& h = answer->header;
  RDMAPS_FUZZ_ASSERT(r->servers.size() == h.num_servers && r->workers.size() == h.num_workers);
  const std::size_t of = r->role == rdmaps::Role::kServer ? r->servers.size() : r->workers.size();
  RDMAPS_FUZZ_ASSERT(r->index >= 0 && static_cast<std::size_t>(r->index) < of);
  return 0;
}

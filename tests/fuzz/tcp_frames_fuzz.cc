// Fuzz target: the tcp backend's parsers of a peer's frames: the handshake
// (transport/tcp/tcp_handshake.h: Hello, Challenge, Proof, HelloReply), a
// target's Request against a registered region and an initiator's Response
// (tcp_frames.h). Input: u8 selector (for the handshake, then u8 picking
// the message) then the frame bytes. Oracle: an accepted Request is served
// inside its region (ASan catches a byte outside); an accepted handshake
// message has in-range lengths and re-encodes to the bytes it came from.
#include <cstdint>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "transport/tcp/tcp_frames.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/transport.h"

namespace tcp = rdmaps::transport::tcp;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::Bytes in(data, size);
  const std::uint8_t which = in.Take<std::uint8_t>();
  switch (which % 3) {
    case 0: {
      const std::uint8_t message = in.Take<std::uint8_t>() % 4;
      const std::string_view rest = in.Rest();
      const auto bytes = std::as_bytes(std::span<const char>(rest.data(), rest.size()));
      if (message == 0) {
        auto h = tcp::ParseHello(bytes);
        if (h.ok())
          RDMAPS_FUZZ_ASSERT(h->user_data.size() <= rdmaps::transport::kMaxHandshakeUserData);
      } else if (message == 1) {
        auto c = tcp::ParseChallenge(bytes);
        if (c.ok()) RDMAPS_FUZZ_ASSERT(tcp::EncodeChallenge(*c).size() == rest.size());
      } else if (message == 2) {
        auto p = tcp::ParseProof(bytes);
        if (p.ok()) RDMAPS_FUZZ_ASSERT(tcp::EncodeProof(*p).size() == rest.size());
      } else {
        auto r = tcp::ParseHelloReply(bytes);
        if (r.ok())
          RDMAPS_FUZZ_ASSERT(sizeof(tcp::HelloReplyWire) + r->message.size() == rest.size());
      }
      break;
    }
    case 1: {
      // A region of 256 bytes at a base the input picks.
      const std::uint64_t base = in.Take<std::uint64_t>() & ~std::uint64_t{7};
      const tcp::RequestWire req = in.Take<tcp::RequestWire>();
      if (!tcp::CheckRequest(req).ok()) break;
      std::vector<std::uint8_t> region(256);
      const std::uint64_t addr = req.remote_addr.get(), len = req.length.get();
      if (!tcp::RegionContains(base, region.size(), addr, len)) break;
      RDMAPS_FUZZ_ASSERT(len <= tcp::kMaxOpBytes);
      std::vector<std::uint8_t> copy(
          region.begin() + static_cast<std::ptrdiff_t>(addr - base),
          region.begin() + static_cast<std::ptrdiff_t>(addr - base + len));
      break;
    }
    case 2: {
      tcp::ExpectedResponse want;
      want.opcode = 1 + in.Take<std::uint8_t>() % 5;
      want.length = in.Take<std::uint16_t>();
      const tcp::ResponseWire r = in.Take<tcp::ResponseWire>();
      if (tcp::CheckResponse(r, want) == nullptr && r.status != 0) {
        RDMAPS_FUZZ_ASSERT(r.length.get() <= tcp::kMaxMessageBytes);
      }
      break;
    }
  }
  return 0;
}

// Fuzz target: the tcp backend's checks of a peer's frames
// (transport/tcp/tcp_frames.h): the acceptor's Hello, a target's Request
// against a registered region, an initiator's Response. Input: u8 selector
// then the frame bytes. Oracle: an accepted Request is served inside its
// region (ASan catches a byte outside), an accepted Hello's token lies in
// the bytes read.
#include <cstdint>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "transport/tcp/tcp_frames.h"

namespace tcp = rdmaps::transport::tcp;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::Bytes in(data, size);
  const std::uint8_t which = in.Take<std::uint8_t>();
  switch (which % 3) {
    case 0: {
      const std::uint16_t version = in.Take<std::uint8_t>() % 4;
      const std::string_view bytes = in.Rest();
      tcp::HelloWire h{};
      std::string_view token;
      if (tcp::ParseHello(bytes, version, &h, &token) == tcp::HelloParse::kComplete) {
        RDMAPS_FUZZ_ASSERT(token.size() <= tcp::kMaxTokenBytes);
        RDMAPS_FUZZ_ASSERT(token.data() >= bytes.data() &&
                           token.data() + token.size() <= bytes.data() + bytes.size());
        RDMAPS_FUZZ_ASSERT(h.user_data_len <= sizeof(h.user_data));
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

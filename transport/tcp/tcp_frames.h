// The tcp backend's checks of the data-path frames that arrive from a peer
// (tcp_wire.h), as pure functions over the bytes: the target's Request and
// the initiator's Response, and the region bounds a request is served
// within (the handshake's parsers are in tcp_handshake.h). The progress threads call them before acting on any
// number of a frame; tests/fuzz/tcp_frames_fuzz.cc drives them with
// arbitrary bytes.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "rdmaps/status.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaps::transport::tcp {

// OK when `req` may be executed: known magic and opcode, length within
// kMaxOpBytes and exactly 8 for atomics. InvalidArgument naming the fault
// otherwise (the target then closes the socket).
Status CheckRequest(const RequestWire& req);

// True when [addr, addr + len) lies inside the region [base, base + size),
// computed without wrapping.
bool RegionContains(std::uint64_t base, std::uint64_t size, std::uint64_t addr, std::uint64_t len);

// What the initiator expects of the response to its oldest pending op.
struct ExpectedResponse {
  std::uint8_t opcode = 0;   // WireOp of the request
  std::uint32_t length = 0;  // bytes a READ asked for
};

// nullptr when `r` is a well-formed response to `want`; else the reason
// (the initiator then fails the connection).
const char* CheckResponse(const ResponseWire& r, const ExpectedResponse& want);

}  // namespace rdmaps::transport::tcp

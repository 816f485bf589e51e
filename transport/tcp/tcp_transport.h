// The tcp backend: the one-sided semantics of transport/transport.h over TCP
// sockets. A progress thread per Endpoint serves peers' ops against the
// registered regions; a Connection drives its own socket from the calling
// thread. Wire protocol: tcp_wire.h and docs/tcp-protocol.md.
//
// Thread safety: as transport/transport.h says for every backend.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/transport.h"

namespace rdmaps::transport::tcp {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options);

// Tests only: makes `endpoint` (a tcp one) announce and require `version` in
// its handshakes, to exercise the version-mismatch path.
Status TEST_SetProtocolVersion(Endpoint& endpoint, std::uint16_t version);

// Tests only: what the progress thread of a tcp endpoint counted.
struct TcpStats {
  std::uint64_t accept_errors = 0;        // accept4 failures (EMFILE included)
  std::uint64_t fd_exhaustion_sheds = 0;  // connections taken and closed at EMFILE
  std::uint64_t handshakes_dropped = 0;   // oldest pre-auth handshakes dropped at the cap
  std::uint64_t handshakes_refused = 0;   // bad secret, version or format
  std::uint64_t acks_held = 0;            // WRITE acknowledgements held for the next payload
};
Result<TcpStats> TEST_GetTcpStats(Endpoint& endpoint);

}  // namespace rdmaps::transport::tcp

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

}  // namespace rdmaps::transport::tcp

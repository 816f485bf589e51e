// The verbs backend: libibverbs + librdmacm, RC queue pairs. This header
// includes no verbs header, so the registry can include it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace rdmaps::transport::verbs {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options);

// True when a device with an ACTIVE port exists; otherwise `why` says why.
bool DeviceUsable(std::string* why);

// Test hook: makes a verbs `endpoint` announce (and expect) `version` in its
// handshakes. InvalidArgument when `endpoint` is not a verbs endpoint.
Status TEST_SetProtocolVersion(Endpoint& endpoint, std::uint16_t version);

// Test hook: `hook` runs on the thread of every later Connect of a verbs
// `endpoint` once the acceptor has confirmed the handshake (the connection
// is up at the peer, which may post to it), before Connect returns; an
// empty function removes it. InvalidArgument when `endpoint` is not a verbs
// endpoint.
Status TEST_AfterProofAccepted(Endpoint& endpoint, std::function<void()> hook);

// Test hooks: the RDMA device a verbs endpoint opened, and the source GID
// index its connection's queue pair uses (ibv_query_qp). InvalidArgument for
// another backend's objects.
Result<std::string> TEST_DeviceName(const Endpoint& endpoint);
Result<int> TEST_SourceGidIndex(const Connection& connection);

}  // namespace rdmaps::transport::verbs

// The tcp backend: one-sided semantics over TCP sockets (see tcp_transport.cc
// for the wire protocol).
#pragma once

#include <memory>

#include "transport/transport.h"

namespace rdmaps::transport::tcp {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options);

}  // namespace rdmaps::transport::tcp

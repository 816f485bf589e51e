#include "transport/tcp/tcp_transport.h"

namespace rdmaps::transport::tcp {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions&) {
  return NotSupportedError("tcp backend: not implemented yet");
}

}  // namespace rdmaps::transport::tcp

#include "transport/fake/fake_transport.h"

namespace rdmaps::transport::fake {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions&) {
  return NotSupportedError("fake backend: not implemented yet");
}

}  // namespace rdmaps::transport::fake

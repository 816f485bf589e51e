#include "transport/verbs/verbs_transport.h"

namespace rdmaps::transport::verbs {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions&) {
  return NotSupportedError("verbs backend: not implemented yet");
}

bool DeviceUsable(std::string* why) {
  if (why) *why = "verbs backend: not implemented yet";
  return false;
}

}  // namespace rdmaps::transport::verbs

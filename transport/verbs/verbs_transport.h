// The verbs backend: libibverbs + librdmacm, RC queue pairs. This header
// includes no verbs header, so the registry can include it.
#pragma once

#include <memory>
#include <string>

#include "transport/transport.h"

namespace rdmaps::transport::verbs {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options);

// True when a device with an ACTIVE port exists; otherwise `why` says why.
bool DeviceUsable(std::string* why);

}  // namespace rdmaps::transport::verbs

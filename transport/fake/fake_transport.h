// The fake backend: in-process, deterministic, really moves bytes, with fault
// knobs for tests.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace rdmaps::transport::fake {

Result<std::unique_ptr<Endpoint>> CreateEndpoint(const EndpointOptions& options);

}  // namespace rdmaps::transport::fake

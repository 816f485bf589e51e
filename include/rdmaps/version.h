// The library's version, for logs and handshakes.
#pragma once

#include <string_view>

#define RDMAPS_VERSION_STRING "0.1.0"

namespace rdmaps {

std::string_view Version();

}  // namespace rdmaps

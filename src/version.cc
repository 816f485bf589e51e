#include "rdmaps/version.h"

namespace rdmaps {

std::string_view Version() { return RDMAPS_VERSION_STRING; }

}  // namespace rdmaps

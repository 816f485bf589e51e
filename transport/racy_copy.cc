#include "transport/racy_copy.h"

#include <cstring>

namespace rdmaps::transport {

// noinline keeps the function's name in every stack that TSan prints, which
// is what the suppression matches.
__attribute__((noinline)) void RacyCopyFrom(void* dst, const void* src, std::size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

__attribute__((noinline)) void RacyCopyTo(void* dst, const void* src, std::size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

}  // namespace rdmaps::transport

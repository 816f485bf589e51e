#include "transport/racy_copy.h"

#include <cstring>

namespace rdmaps::transport {

#ifdef RDMAPS_TSAN
namespace {
// Volatile accesses keep the compiler from turning the loop back into a
// memcpy call, which TSan would intercept. Slow, and only in TSan builds.
__attribute__((no_sanitize("thread"), noinline)) void UninstrumentedCopy(void* dst,
                                                                         const void* src,
                                                                         std::size_t n) {
  auto* d = static_cast<volatile unsigned char*>(dst);
  const auto* s = static_cast<const volatile unsigned char*>(src);
  for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
}
}  // namespace
#endif

// noinline keeps the function's name in every stack TSan prints, which is what
// tests/tsan.supp matches when TSan does see an access.
__attribute__((noinline)) void RacyCopyFrom(void* dst, const void* src, std::size_t n) {
#ifdef RDMAPS_TSAN
  UninstrumentedCopy(dst, src, n);
#else
  if (n != 0) std::memcpy(dst, src, n);
#endif
}

__attribute__((noinline)) void RacyCopyTo(void* dst, const void* src, std::size_t n) {
#ifdef RDMAPS_TSAN
  UninstrumentedCopy(dst, src, n);
#else
  if (n != 0) std::memcpy(dst, src, n);
#endif
}

}  // namespace rdmaps::transport

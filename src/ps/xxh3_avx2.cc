// XXH3_64bits_withSeed compiled for AVX2 (XXH_AVX2), inlined from Debian's
// xxhash.h: the same hash values as libxxhash's SSE2 build, about twice as
// fast per byte where the CPU has AVX2 (wire.cc times the builds and
// chooses). This file alone is compiled with -mavx2 (src/CMakeLists.txt),
// and it includes nothing but xxhash.h and <cstdint>/<cstddef>, so no inline
// function of a shared header is emitted here with AVX2 instructions for the
// linker to pick for other files. Xxh3Avx2WithSeed is called only after
// Xxh3Avx2Available() said yes.
#include <cstddef>
#include <cstdint>

#if defined(__AVX2__)
#define XXH_INLINE_ALL
#define XXH_VECTOR 2  // XXH_AVX2
#include <xxhash.h>
#endif

namespace rdmaps::internal {

std::uint64_t Xxh3Avx2WithSeed(const void* data, std::size_t bytes, std::uint64_t seed);
bool Xxh3Avx2Available();

#if defined(__AVX2__)
std::uint64_t Xxh3Avx2WithSeed(const void* data, std::size_t bytes, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}
bool Xxh3Avx2Available() { return __builtin_cpu_supports("avx2"); }
#else
std::uint64_t Xxh3Avx2WithSeed(const void*, std::size_t, std::uint64_t) { return 0; }
bool Xxh3Avx2Available() { return false; }
#endif

}  // namespace rdmaps::internal

// XXH3_64bits_withSeed compiled for plain 64-bit integer code (XXH_SCALAR),
// inlined from Debian's xxhash.h: the same hash values as libxxhash's SSE2
// build (XXH3 is defined independently of the vector width), for machines
// where vector code is slower than scalar (emulated CPUs). wire.cc chooses.
#define XXH_INLINE_ALL
#define XXH_VECTOR 0  // XXH_SCALAR
#include <xxhash.h>

#include "src/ps/wire.h"

namespace rdmaps::internal {

std::uint64_t Xxh3ScalarWithSeed(const void* data, std::size_t bytes, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}

}  // namespace rdmaps::internal

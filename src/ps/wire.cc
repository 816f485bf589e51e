#include "src/ps/wire.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>

namespace rdmaps::internal {

namespace {

using HashFn = std::uint64_t (*)(const void*, std::size_t, std::uint64_t);

// XXH3 takes its vector (or scalar) long-input path above this many bytes.
constexpr std::size_t kXxh3MidsizeMax = 240;

struct LongHash {
  HashFn fn;
  const char* name;
};

// The fastest build over 4 KiB (a 1024-float row), by the minimum of 8
// alternating timings of each, so that a preempted timing does not decide.
LongHash ChooseLongHash() {
  constexpr std::size_t kBytes = 4096;
  alignas(64) static std::byte sample[kBytes];  // zeros: the speed does not depend on them
  using Clock = std::chrono::steady_clock;
  volatile std::uint64_t sink = 0;  // keeps the calls
  struct Candidate {
    LongHash hash;
    Clock::duration best = Clock::duration::max();
  };
  Candidate candidates[3] = {{{&Xxh3LibraryWithSeed, "libxxhash"}},
                             {{&Xxh3ScalarWithSeed, "scalar"}},
                             {{&Xxh3Avx2WithSeed, "avx2"}}};
  const std::size_t n = Xxh3Avx2Available() ? 3 : 2;
  for (int i = 0; i < 8; ++i) {
    for (std::size_t c = 0; c < n; ++c) {
      const auto t0 = Clock::now();
      sink = candidates[c].hash.fn(sample, kBytes, sink);
      candidates[c].best = std::min(candidates[c].best, Clock::now() - t0);
    }
  }
  const Candidate* fastest = &candidates[0];
  for (std::size_t c = 1; c < n; ++c) {
    if (candidates[c].best < fastest->best) fastest = &candidates[c];
  }
  return fastest->hash;
}

const LongHash& ChosenLongHash() {
  static const LongHash chosen = ChooseLongHash();
  return chosen;
}

}  // namespace

std::uint64_t Xxh3LibraryWithSeed(const void* data, std::size_t bytes, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, bytes, seed);
}

const char* BlockHashBuild() { return ChosenLongHash().name; }

std::uint64_t BlockChecksum(std::uint64_t version, const void* payload, std::size_t bytes) {
  const std::uint64_t seed = version ^ kChecksumSalt;
  if (bytes <= kXxh3MidsizeMax) return XXH3_64bits_withSeed(payload, bytes, seed);
  return ChosenLongHash().fn(payload, bytes, seed);
}

void SealBlock(void* block, std::uint64_t version, std::size_t payload_bytes) {
  auto* bytes = static_cast<std::byte*>(block);
  BlockHeader h{version, BlockChecksum(version, bytes + sizeof(BlockHeader), payload_bytes)};
  std::memcpy(block, &h, sizeof(h));
}

bool VerifyBlock(const void* block, std::size_t payload_bytes) {
  BlockHeader h;
  std::memcpy(&h, block, sizeof(h));
  const auto* bytes = static_cast<const std::byte*>(block);
  return h.checksum == BlockChecksum(h.version, bytes + sizeof(BlockHeader), payload_bytes);
}

void SealRow(BlockHeader* header, std::uint64_t version, const void* payload, std::size_t bytes) {
  const BlockHeader h{version, BlockChecksum(version, payload, bytes)};
  std::memcpy(header, &h, sizeof(h));
}

bool VerifyRow(const BlockHeader& header, const void* payload, std::size_t bytes) {
  return header.checksum == BlockChecksum(header.version, payload, bytes);
}

}  // namespace rdmaps::internal

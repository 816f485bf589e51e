#include "src/ps/initializer.h"

#include <cmath>
#include <numbers>

namespace rdmaps::internal {
namespace {

std::uint64_t SplitMix(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits.
float Unit(std::uint64_t& state) {
  return static_cast<float>(SplitMix(state) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace

void InitRow(const Initializer& init, std::uint32_t table, std::uint64_t row, float* out,
             std::uint32_t dim) {
  std::uint64_t state = init.seed;
  state = SplitMix(state) ^ (std::uint64_t{table} << 32);
  state = SplitMix(state) ^ row;
  switch (init.kind) {
    case Initializer::Kind::kZeros:
      for (std::uint32_t i = 0; i < dim; ++i) out[i] = 0.0f;
      return;
    case Initializer::Kind::kConstant:
      for (std::uint32_t i = 0; i < dim; ++i) out[i] = init.value;
      return;
    case Initializer::Kind::kUniform:
      for (std::uint32_t i = 0; i < dim; ++i) {
        out[i] = init.low + (init.high - init.low) * Unit(state);
      }
      return;
    case Initializer::Kind::kNormal:
      for (std::uint32_t i = 0; i < dim; ++i) {
        const double u1 = (SplitMix(state) >> 11) * 0x1.0p-53 + 0x1.0p-54;  // (0, 1)
        const double u2 = (SplitMix(state) >> 11) * 0x1.0p-53;
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
        out[i] = init.mean + init.stddev * static_cast<float>(z);
      }
      return;
  }
}

}  // namespace rdmaps::internal

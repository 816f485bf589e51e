#include "src/ps/optimizer.h"

#include <Eigen/Core>
#include <cmath>
#include <cstring>

namespace rdmaps::internal {
namespace {

using Vec = Eigen::Map<Eigen::ArrayXf>;
using CVec = Eigen::Map<const Eigen::ArrayXf>;

std::size_t StateFloats(const OptimizerOptions& o, std::uint32_t dim) {
  switch (o.kind) {
    case OptimizerOptions::Kind::kSgd:
      return 0;
    case OptimizerOptions::Kind::kMomentum:
    case OptimizerOptions::Kind::kAdagrad:
      return dim;
    case OptimizerOptions::Kind::kAdam:
      return 2 * std::size_t{dim} + 1;  // m, v, step counter (u32 bits)
  }
  return 0;
}

}  // namespace

Optimizer::Optimizer(const OptimizerOptions& options, std::uint32_t dim)
    : options_(options), dim_(dim), state_floats_(StateFloats(options, dim)) {}

void Optimizer::InitState(float* state) const {
  if (state_floats_ == 0) return;
  const float v =
      options_.kind == OptimizerOptions::Kind::kAdagrad ? options_.initial_accumulator : 0.0f;
  Vec(state, static_cast<Eigen::Index>(state_floats_)).setConstant(v);
  if (options_.kind == OptimizerOptions::Kind::kAdam) {
    const std::uint32_t zero = 0;
    std::memcpy(state + 2 * std::size_t{dim_}, &zero, sizeof(zero));
  }
}

void Optimizer::Apply(float* w_ptr, float* state, const float* g_ptr) const {
  const auto n = static_cast<Eigen::Index>(dim_);
  Vec w(w_ptr, n);
  CVec g(g_ptr, n);
  const float lr = options_.learning_rate;
  switch (options_.kind) {
    case OptimizerOptions::Kind::kSgd:
      w -= lr * g;
      return;
    case OptimizerOptions::Kind::kMomentum: {
      Vec v(state, n);
      v = options_.momentum * v + g;
      w -= lr * v;
      return;
    }
    case OptimizerOptions::Kind::kAdagrad: {
      Vec a(state, n);
      a += g.square();
      w -= lr * g / (a.sqrt() + options_.epsilon);
      return;
    }
    case OptimizerOptions::Kind::kAdam: {
      Vec m(state, n);
      Vec v(state + n, n);
      std::uint32_t t;
      std::memcpy(&t, state + 2 * n, sizeof(t));
      ++t;
      std::memcpy(state + 2 * n, &t, sizeof(t));
      const float b1 = options_.beta1, b2 = options_.beta2;
      m = b1 * m + (1.0f - b1) * g;
      v = b2 * v + (1.0f - b2) * g.square();
      const double c1 = 1.0 - std::pow(double{b1}, double(t));
      const double c2 = 1.0 - std::pow(double{b2}, double(t));
      // lr * (m / c1) / (sqrt(v / c2) + eps), with the bias corrections
      // folded into two scalars: one sqrt and one division per element.
      const auto step = static_cast<float>(lr / c1);
      const auto inv_sqrt_c2 = static_cast<float>(1.0 / std::sqrt(c2));
      w -= step * m / (v.sqrt() * inv_sqrt_c2 + options_.epsilon);
      return;
    }
  }
}

}  // namespace rdmaps::internal

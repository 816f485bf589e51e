// Each server-side optimizer against a plain scalar reference.
#include "src/ps/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace rdmaps::internal {
namespace {

// Scalar reference implementations, straight from the formulas in table.h.
struct Reference {
  OptimizerOptions o;
  std::vector<double> w, s1, s2;
  int t = 0;
  void Step(const std::vector<float>& g) {
    ++t;
    for (std::size_t i = 0; i < w.size(); ++i) {
      switch (o.kind) {
        case OptimizerOptions::Kind::kSgd:
          w[i] -= o.learning_rate * g[i];
          break;
        case OptimizerOptions::Kind::kMomentum:
          s1[i] = o.momentum * s1[i] + g[i];
          w[i] -= o.learning_rate * s1[i];
          break;
        case OptimizerOptions::Kind::kAdagrad:
          s1[i] += double{g[i]} * g[i];
          w[i] -= o.learning_rate * g[i] / (std::sqrt(s1[i]) + o.epsilon);
          break;
        case OptimizerOptions::Kind::kAdam: {
          s1[i] = o.beta1 * s1[i] + (1 - o.beta1) * g[i];
          s2[i] = o.beta2 * s2[i] + (1 - o.beta2) * double{g[i]} * g[i];
          const double mh = s1[i] / (1 - std::pow(double{o.beta1}, t));
          const double vh = s2[i] / (1 - std::pow(double{o.beta2}, t));
          w[i] -= o.learning_rate * mh / (std::sqrt(vh) + o.epsilon);
          break;
        }
      }
    }
  }
};

void CheckAgainstReference(const OptimizerOptions& o, std::uint32_t dim) {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Optimizer opt(o, dim);
  std::vector<float> w(dim), state(opt.state_floats() + 1, -7.0f);
  for (auto& x : w) x = nd(rng);
  opt.InitState(state.data());
  Reference ref{o, std::vector<double>(w.begin(), w.end()), std::vector<double>(dim, 0.0),
                std::vector<double>(dim, 0.0)};
  if (o.kind == OptimizerOptions::Kind::kAdagrad) ref.s1.assign(dim, o.initial_accumulator);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> g(dim);
    for (auto& x : g) x = nd(rng);
    opt.Apply(w.data(), state.data(), g.data());
    ref.Step(g);
  }
  EXPECT_EQ(state.back(), -7.0f) << "optimizer wrote past its state";
  for (std::uint32_t i = 0; i < dim; ++i) {
    EXPECT_NEAR(w[i], ref.w[i], 1e-4 * (1 + std::abs(ref.w[i])))
        << OptimizerKindName(o.kind) << " element " << i;
  }
}

TEST(OptimizerTest, SgdMatchesReference) { CheckAgainstReference(OptimizerOptions::Sgd(0.1f), 37); }
TEST(OptimizerTest, MomentumMatchesReference) {
  CheckAgainstReference(OptimizerOptions::Momentum(0.05f, 0.9f), 37);
}
TEST(OptimizerTest, AdagradMatchesReference) {
  auto o = OptimizerOptions::Adagrad(0.1f, 1e-6f);
  o.initial_accumulator = 0.1f;
  CheckAgainstReference(o, 37);
}
TEST(OptimizerTest, AdamMatchesReference) {
  CheckAgainstReference(OptimizerOptions::Adam(0.01f), 37);
  CheckAgainstReference(OptimizerOptions::Adam(0.01f, 0.5f, 0.9f, 1e-6f), 1);
}

TEST(OptimizerTest, StateSizes) {
  EXPECT_EQ(Optimizer(OptimizerOptions::Sgd(1), 10).state_floats(), 0u);
  EXPECT_EQ(Optimizer(OptimizerOptions::Momentum(1), 10).state_floats(), 10u);
  EXPECT_EQ(Optimizer(OptimizerOptions::Adagrad(1), 10).state_floats(), 10u);
  EXPECT_EQ(Optimizer(OptimizerOptions::Adam(1), 10).state_floats(), 21u);
}

}  // namespace
}  // namespace rdmaps::internal

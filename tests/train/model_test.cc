// The models: parameter table shapes, gradients against central finite
// differences (in double), and the pixel standardisation.
#include "tools/train/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tools/train/tables.h"

namespace rdmaps::train {
namespace {

TEST(ParameterTablesTest, OneWeightAndOneBiasTablePerLayer) {
  ModelSpec spec{784, {128, 64}, 10};
  std::vector<TableShape> t = ParameterTables(spec);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[0].name, "w0");
  EXPECT_EQ(t[0].rows, 784u);
  EXPECT_EQ(t[0].dim, 128u);
  EXPECT_EQ(t[1].name, "b0");
  EXPECT_EQ(t[1].rows, 1u);
  EXPECT_EQ(t[1].dim, 128u);
  EXPECT_EQ(t[2].rows, 128u);
  EXPECT_EQ(t[2].dim, 64u);
  EXPECT_EQ(t[4].rows, 64u);
  EXPECT_EQ(t[4].dim, 10u);
  EXPECT_NEAR(t[0].init_stddev, std::sqrt(2.0 / 784), 1e-12);
  EXPECT_NEAR(t[4].init_stddev, std::sqrt(1.0 / 64), 1e-12);
  EXPECT_EQ(t[1].init_stddev, 0.0);
  // Softmax regression: one layer, zero-initialised.
  std::vector<TableShape> s = ParameterTables(ModelSpec{784, {}, 10});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].size(), 7840u);
  EXPECT_EQ(s[0].init_stddev, 0.0);
}

struct Problem {
  std::vector<double> x;
  std::vector<std::uint8_t> y;
};

Problem RandomProblem(const ModelSpec& spec, std::size_t batch, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  Problem p;
  p.x.resize(batch * static_cast<std::size_t>(spec.inputs));
  for (double& v : p.x) v = normal(rng);
  for (std::size_t i = 0; i < batch; ++i) {
    p.y.push_back(static_cast<std::uint8_t>(rng() % static_cast<std::uint64_t>(spec.classes)));
  }
  return p;
}

class GradientCheckTest : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(GradientCheckTest, MatchesFiniteDifferences) {
  const ModelSpec spec{7, GetParam(), 4};
  constexpr std::size_t kBatch = 5;
  Problem prob = RandomProblem(spec, kBatch, 3);
  // The servers' initial values (as a float run starts), in double.
  Result<Params<float>> initial = InitialParams(ModelTables(spec, OptimizerOptions{}, 11, kBsp));
  ASSERT_TRUE(initial.ok()) << initial.status();
  Params<double> params;
  for (const auto& t : *initial) params.emplace_back(t.begin(), t.end());
  // Non-zero biases and weights everywhere, so every path is exercised.
  std::mt19937_64 rng(5);
  std::normal_distribution<double> small(0.0, 0.3);
  for (auto& t : params) {
    for (double& v : t) v += small(rng);
  }
  Mlp<double> model(spec);
  Params<double> grads;
  const double loss = model.ForwardBackward(params, prob.x.data(), prob.y.data(), kBatch, grads);
  EXPECT_GT(loss, 0.0);
  EXPECT_NEAR(model.Loss(params, prob.x.data(), prob.y.data(), kBatch), loss, 1e-12);
  ASSERT_EQ(grads.size(), params.size());
  constexpr double kEps = 1e-6;
  double max_err = 0;
  std::size_t checked = 0;
  for (std::size_t t = 0; t < params.size(); ++t) {
    ASSERT_EQ(grads[t].size(), params[t].size());
    for (std::size_t i = 0; i < params[t].size(); ++i) {
      const double saved = params[t][i];
      params[t][i] = saved + kEps;
      const double up = model.Loss(params, prob.x.data(), prob.y.data(), kBatch);
      params[t][i] = saved - kEps;
      const double down = model.Loss(params, prob.x.data(), prob.y.data(), kBatch);
      params[t][i] = saved;
      const double numeric = (up - down) / (2 * kEps);
      const double err = std::abs(numeric - grads[t][i]) /
                         std::max(1e-6, std::abs(numeric) + std::abs(grads[t][i]));
      max_err = std::max(max_err, err);
      EXPECT_LT(err, 1e-5) << "table " << t << " index " << i << ": analytic " << grads[t][i]
                           << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

INSTANTIATE_TEST_SUITE_P(Models, GradientCheckTest,
                         ::testing::Values(std::vector<int>{}, std::vector<int>{6},
                                           std::vector<int>{6, 5}),
                         [](const auto& param_info) {
                           return param_info.param.empty()
                                      ? std::string("softmax")
                                      : "mlp" + std::to_string(param_info.param.size());
                         });

TEST(PixelsToFeaturesTest, StandardisesWithFashionMnistStatistics) {
  const std::uint8_t px[2] = {0, 255};
  float out[2];
  PixelsToFeatures(px, 2, out);
  EXPECT_NEAR(out[0], -0.2860 / 0.3530, 1e-5);
  EXPECT_NEAR(out[1], (1 - 0.2860) / 0.3530, 1e-5);
}

}  // namespace
}  // namespace rdmaps::train

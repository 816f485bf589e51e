// The model's tables: shapes, initialisation and optimizer as rdmaps tables,
// the servers' initial values, and the trainer's optimizer and staleness
// flags.
#include "tools/train/tables.h"

#include <gtest/gtest.h>

#include <vector>

namespace rdmaps::train {
namespace {

TEST(ModelTablesTest, OneTablePerParameterTensorWithTheOptimizer) {
  std::vector<TableOptions> t =
      ModelTables(ModelSpec{784, {32}, 10}, OptimizerOptions::Adam(0.002f), 5, 2);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0].id, 1u);
  EXPECT_EQ(t[0].name, "w0");
  EXPECT_EQ(t[0].rows, 784u);
  EXPECT_EQ(t[0].dim, 32u);
  EXPECT_EQ(t[0].init.kind, Initializer::Kind::kNormal);
  EXPECT_EQ(t[1].init.kind, Initializer::Kind::kZeros);
  EXPECT_EQ(t[3].name, "b1");
  EXPECT_EQ(t[3].staleness, 2u);
  EXPECT_EQ(t[2].optimizer.kind, OptimizerOptions::Kind::kAdam);
  EXPECT_FLOAT_EQ(t[2].optimizer.learning_rate, 0.002f);
}

TEST(InitialParamsTest, SameSeedSameParameters) {
  ModelSpec spec{6, {5}, 3};
  auto initial = [&](std::uint64_t seed) {
    Result<Params<float>> p = InitialParams(ModelTables(spec, OptimizerOptions{}, seed, kBsp));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : Params<float>{};
  };
  EXPECT_EQ(initial(7), initial(7));
  EXPECT_NE(initial(7), initial(8));
  // Shaped like the model's parameters: weights drawn, biases zero.
  const Params<float> p = initial(7);
  const std::vector<TableShape> shapes = ParameterTables(spec);
  ASSERT_EQ(p.size(), shapes.size());
  for (std::size_t t = 0; t < p.size(); ++t) EXPECT_EQ(p[t].size(), shapes[t].size());
  EXPECT_NE(p[0], std::vector<float>(p[0].size(), 0.0f));
  EXPECT_EQ(p[1], std::vector<float>(p[1].size(), 0.0f));
}

TEST(TrainOptimizerTest, ParsesNamesAndRejectsUnknownOnes) {
  EXPECT_EQ(TrainOptimizer("adam", 0, false)->kind, OptimizerOptions::Kind::kAdam);
  EXPECT_EQ(TrainOptimizer("sgd", 0, false)->kind, OptimizerOptions::Kind::kSgd);
  EXPECT_EQ(TrainOptimizer("momentum", 0, false)->kind, OptimizerOptions::Kind::kMomentum);
  EXPECT_EQ(TrainOptimizer("adagrad", 0, false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainOptimizer("lamb", 0, false).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainOptimizer("adam", -1, false).status().code(), StatusCode::kInvalidArgument);
}

TEST(TrainOptimizerTest, ZeroLearningRatePicksTheDefault) {
  EXPECT_FLOAT_EQ(TrainOptimizer("adam", 0, false)->learning_rate, 1e-3f);
  EXPECT_FLOAT_EQ(TrainOptimizer("adam", 0, true)->learning_rate, 2e-4f);
  EXPECT_FLOAT_EQ(TrainOptimizer("momentum", 0, false)->learning_rate, 0.01f);
  EXPECT_FLOAT_EQ(TrainOptimizer("sgd", 0, true)->learning_rate, 0.05f);
  EXPECT_FLOAT_EQ(TrainOptimizer("sgd", 0.5f, true)->learning_rate, 0.5f);
  EXPECT_FLOAT_EQ(TrainOptimizer("adam", 0.25f, true)->learning_rate, 0.25f);
}

TEST(ParseStalenessTest, AcceptsBspAspAndNumbers) {
  EXPECT_EQ(*ParseStaleness("bsp"), kBsp);
  EXPECT_EQ(*ParseStaleness("asp"), kAsp);
  EXPECT_EQ(*ParseStaleness("3"), 3u);
  EXPECT_EQ(ParseStaleness("-1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseStaleness("3x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseStaleness("").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rdmaps::train

// Short training runs without the parameter server: the loop, the
// partitioning, LocalStore with each optimizer on a tiny problem, and (on the
// real Fashion-MNIST when installed) that loss falls and accuracy clears a
// floor far above chance on a CI-sized subset.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <set>

#include "tests/train/train_test_util.h"
#include "tools/train/idx.h"
#include "tools/train/local_store.h"
#include "tools/train/model.h"
#include "tools/train/tables.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {
namespace {

TEST(PartitionTest, WorkersGetDisjointEqualSlices) {
  constexpr std::size_t kN = 1003;
  std::set<std::uint32_t> seen;
  for (int w = 0; w < 4; ++w) {
    std::vector<std::uint32_t> p = PartitionIndices(kN, 42, w, 4);
    EXPECT_EQ(p.size(), kN / 4);
    for (std::uint32_t i : p) {
      EXPECT_LT(i, kN);
      EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " in two partitions";
    }
  }
  EXPECT_EQ(seen.size(), 4 * (kN / 4));
  // Deterministic in the seed, and the seed matters.
  EXPECT_EQ(PartitionIndices(kN, 42, 1, 4), PartitionIndices(kN, 42, 1, 4));
  EXPECT_NE(PartitionIndices(kN, 42, 1, 4), PartitionIndices(kN, 43, 1, 4));
}

TEST(LocalTrainTest, LearnsASyntheticProblem) {
  Dataset train = Synthetic(600);
  Dataset test = Synthetic(100);
  TrainOptions o;
  o.model = ModelSpec{784, {16}, 10};
  o.epochs = 5;
  o.batch_size = 32;
  o.target_accuracy = 0.9;
  Result<std::unique_ptr<LocalStore>> store =
      LocalStore::Create(ModelTables(o.model, OptimizerOptions::Adam(0.003f), 1, kBsp));
  ASSERT_TRUE(store.ok()) << store.status();
  int progress_calls = 0;
  o.progress_interval = std::chrono::milliseconds(0);
  Result<TrainReport> r = Train(o, train, test, **store, [&](const Progress& p) {
    ++progress_calls;
    EXPECT_LE(p.step, p.total_steps);
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->steps, 5u * (600 / 32));
  EXPECT_EQ(progress_calls, static_cast<int>(r->steps));
  EXPECT_EQ(r->epoch_loss.size(), 5u);
  EXPECT_LT(r->last_epoch_loss, r->first_epoch_loss);
  EXPECT_GE(r->test_accuracy, 0.95);
  EXPECT_EQ(r->curve.size(), 5u);  // one point per epoch
  EXPECT_GE(r->time_to_target_seconds, 0.0);
  EXPECT_EQ(r->store.pushes, r->steps);
  EXPECT_EQ(r->store.pulls, r->steps + 5 + 1);  // + per-epoch evals + final
}

TEST(LocalTrainTest, RejectsOptionsThatCannotWork) {
  Dataset d = Synthetic(100);
  TrainOptions o;
  o.model = ModelSpec{784, {}, 10};
  Result<std::unique_ptr<LocalStore>> created =
      LocalStore::Create(ModelTables(o.model, OptimizerOptions::Adam(1e-3f), 1, kBsp));
  ASSERT_TRUE(created.ok()) << created.status();
  LocalStore& store = **created;
  o.batch_size = 64;
  o.num_workers = 2;  // 50 samples each: less than a batch.
  Result<TrainReport> r = Train(o, d, d, store);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--batch_size"), std::string::npos);
  o.num_workers = 1;
  o.worker_index = 1;
  EXPECT_EQ(Train(o, d, d, store).status().code(), StatusCode::kInvalidArgument);
  o.worker_index = 0;
  o.model.inputs = 100;
  EXPECT_EQ(Train(o, d, d, store).status().code(), StatusCode::kInvalidArgument);
}

TEST(LocalStoreTest, PushOfTheWrongShapeIsInvalidArgument) {
  ModelSpec spec{4, {}, 2};
  Result<std::unique_ptr<LocalStore>> store =
      LocalStore::Create(ModelTables(spec, OptimizerOptions::Adam(1e-3f), 1, kBsp));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Push({{1.0f}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Push({std::vector<float>(8), std::vector<float>(3)}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE((*store)->Push(ZeroParams<float>(spec)).ok());
}

TEST(LocalStoreTest, RefusesTablesTheServersWouldRefuse) {
  std::vector<TableOptions> tables =
      ModelTables(ModelSpec{4, {}, 2}, OptimizerOptions::Sgd(0.1f), 1, kBsp);
  tables[0].optimizer.learning_rate = 0;
  EXPECT_EQ(LocalStore::Create(tables).status().code(), StatusCode::kInvalidArgument);
}

// A tiny problem every model can fit: the class is the index of the largest
// of the first `classes` inputs.
struct FloatProblem {
  std::vector<float> x;
  std::vector<std::uint8_t> y;
};

FloatProblem Separable(const ModelSpec& spec, std::size_t n) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal;
  FloatProblem p;
  const auto in = static_cast<std::size_t>(spec.inputs);
  p.x.resize(n * in);
  for (float& v : p.x) v = normal(rng);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t best = 0;
    for (std::size_t c = 1; c < static_cast<std::size_t>(spec.classes); ++c) {
      if (p.x[i * in + c] > p.x[i * in + best]) best = c;
    }
    p.y.push_back(static_cast<std::uint8_t>(best));
  }
  return p;
}

// Each optimizer the trainer offers, through a LocalStore (the servers'
// optimizer code), fits the problem.
class OptimizerTest : public ::testing::TestWithParam<OptimizerOptions::Kind> {};

TEST_P(OptimizerTest, TrainingLowersLossAndLearnsTheRule) {
  const ModelSpec spec{8, {16}, 3};
  constexpr std::size_t kN = 256;
  FloatProblem prob = Separable(spec, kN);
  Mlp<float> model(spec);
  OptimizerOptions o;
  o.kind = GetParam();
  o.learning_rate = GetParam() == OptimizerOptions::Kind::kAdam       ? 0.01f
                    : GetParam() == OptimizerOptions::Kind::kMomentum ? 0.05f
                                                                      : 0.3f;
  Result<std::unique_ptr<LocalStore>> store = LocalStore::Create(ModelTables(spec, o, 1, kBsp));
  ASSERT_TRUE(store.ok()) << store.status();
  Params<float> params;
  Params<float> grads;
  ASSERT_TRUE((*store)->Pull(params).ok());
  const float before = model.Loss(params, prob.x.data(), prob.y.data(), kN);
  for (int step = 0; step < 300; ++step) {
    ASSERT_TRUE((*store)->Pull(params).ok());
    model.ForwardBackward(params, prob.x.data(), prob.y.data(), kN, grads);
    ASSERT_TRUE((*store)->Push(grads).ok());
  }
  ASSERT_TRUE((*store)->Pull(params).ok());
  const float after = model.Loss(params, prob.x.data(), prob.y.data(), kN);
  EXPECT_LT(after, 0.5f * before) << "before " << before << " after " << after;
  // Chance is 1/3; the rule is easy.
  EXPECT_GT(model.CountCorrect(params, prob.x.data(), prob.y.data(), kN), kN * 9 / 10);
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerTest,
                         ::testing::Values(OptimizerOptions::Kind::kSgd,
                                           OptimizerOptions::Kind::kMomentum,
                                           OptimizerOptions::Kind::kAdam),
                         [](const auto& param_info) {
                           return std::string(OptimizerKindName(param_info.param));
                         });

class FashionMnistLocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<Dataset> train = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
    if (train.status().code() == StatusCode::kNotFound) {
      GTEST_SKIP() << train.status();
    }
    ASSERT_TRUE(train.ok()) << train.status();
    Result<Dataset> test = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
    ASSERT_TRUE(test.ok()) << test.status();
    train_ = std::move(*train);
    test_ = std::move(*test);
    Truncate(train_, 4000);
    Truncate(test_, 2000);
  }
  Dataset train_;
  Dataset test_;
};

TEST_F(FashionMnistLocalTest, SoftmaxAndMlpClearAFloorOnASubset) {
  for (const auto& hidden : {std::vector<int>{}, std::vector<int>{64}}) {
    SCOPED_TRACE(hidden.empty() ? "softmax" : "mlp");
    TrainOptions o;
    o.model = ModelSpec{784, hidden, 10};
    o.epochs = 2;
    o.batch_size = 32;
    Result<std::unique_ptr<LocalStore>> store =
        LocalStore::Create(ModelTables(o.model, OptimizerOptions::Adam(1e-3f), 1, kBsp));
    ASSERT_TRUE(store.ok()) << store.status();
    Result<TrainReport> r = Train(o, train_, test_, **store);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->last_epoch_loss, r->first_epoch_loss);
    // Chance is 10 %; 4000 samples and 2 epochs reach about 78-80 %.
    EXPECT_GE(r->test_accuracy, 0.72);
  }
}

}  // namespace
}  // namespace rdmaps::train

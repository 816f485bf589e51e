// Short training runs without the parameter server: the loop, the
// partitioning, and (on the real Fashion-MNIST when installed) that loss falls
// and accuracy clears a floor far above chance on a CI-sized subset.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "tools/train/idx.h"
#include "tools/train/model.h"
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

// A synthetic 28x28 data set: class c lights up pixel row c.
Dataset Synthetic(std::size_t n) {
  Dataset d;
  d.n = n;
  d.rows = 28;
  d.cols = 28;
  d.pixels.assign(n * 784, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<std::uint8_t>(i % 10);
    d.labels.push_back(c);
    for (std::size_t k = 0; k < 28; ++k) d.pixels[i * 784 + c * 28 + k] = 200;
    d.pixels[i * 784 + 783 - i % 50] = 255;  // noise
  }
  return d;
}

TEST(LocalTrainTest, LearnsASyntheticProblem) {
  Dataset train = Synthetic(600);
  Dataset test = Synthetic(100);
  TrainOptions o;
  o.model = ModelSpec{784, {16}, 10};
  o.epochs = 5;
  o.batch_size = 32;
  o.target_accuracy = 0.9;
  OptimizerOptions adam;
  adam.learning_rate = 0.003f;
  LocalStore store(InitParams<float>(o.model, 1), adam);
  int progress_calls = 0;
  o.progress_interval = std::chrono::milliseconds(0);
  Result<TrainReport> r = Train(o, train, test, store, [&](const Progress& p) {
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
  LocalStore store(InitParams<float>(o.model, 1), OptimizerOptions{});
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
  LocalStore store(InitParams<float>(spec, 1), OptimizerOptions{});
  EXPECT_EQ(store.Push({{1.0f}}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Push({std::vector<float>(8), std::vector<float>(3)}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(store.Push(ZeroParams<float>(spec)).ok());
}

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
    LocalStore store(InitParams<float>(o.model, 1), OptimizerOptions{});
    Result<TrainReport> r = Train(o, train_, test_, store);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LT(r->last_epoch_loss, r->first_epoch_loss);
    // Chance is 10 %; 4000 samples and 2 epochs reach about 78-80 %.
    EXPECT_GE(r->test_accuracy, 0.72);
  }
}

}  // namespace
}  // namespace rdmaps::train

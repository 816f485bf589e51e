// Training through the parameter server: 2 servers and 2 workers (threads of
// this process, each with its own Client) over tcp on loopback, on a
// CI-sized subset of Fashion-MNIST: loss falls, accuracy clears a floor far
// above chance, and the observed staleness respects the bound of each mode.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdmaps/server.h"
#include "rdmaps/table.h"
#include "tools/train/idx.h"
#include "tools/train/inproc_job.h"
#include "tools/train/ps_store.h"
#include "tools/train/tables.h"

namespace rdmaps::train {
namespace {

TEST(PsStoreTest, RefusesServersHoldingAnotherModel) {
  ServerOptions so;
  so.transport.job_token = "train-test";
  so.tables = ModelTables(ModelSpec{784, {}, 10}, OptimizerOptions::Adam(1e-3f), 1, kBsp);
  so.num_workers = 1;
  Result<std::unique_ptr<Server>> server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions co;
  co.transport.job_token = "train-test";
  co.servers = {(*server)->address()};
  co.connect_timeout = std::chrono::seconds(20);
  Result<std::unique_ptr<PsStore>> store = PsStore::Connect(co, ModelSpec{784, {16}, 10});
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), ::testing::HasSubstr("same model"));
  (*server)->Stop();
}

class PsTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<Dataset> train = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTrain);
    if (train.status().code() == StatusCode::kNotFound) GTEST_SKIP() << train.status();
    ASSERT_TRUE(train.ok()) << train.status();
    Result<Dataset> test = LoadFashionMnist(kDefaultFashionMnistDir, Split::kTest);
    ASSERT_TRUE(test.ok()) << test.status();
    train_ = std::move(*train);
    test_ = std::move(*test);
    Truncate(train_, 4000);
    Truncate(test_, 2000);
  }

  InProcessJob Job(std::vector<int> hidden, std::uint32_t staleness) {
    InProcessJob job;
    job.servers = 2;
    job.workers = 2;
    job.transport = "tcp";
    job.train.model = ModelSpec{784, std::move(hidden), 10};
    job.train.epochs = 2;
    job.train.batch_size = 32;
    job.optimizer = OptimizerOptions::Adam(1e-3f);
    job.staleness = staleness;
    job.evaluate_on_every_worker = true;
    job.wait_timeout = std::chrono::seconds(60);
    return job;
  }

  void ExpectLearned(const std::vector<TrainReport>& reports) {
    ASSERT_EQ(reports.size(), 2u);
    for (const TrainReport& r : reports) {
      EXPECT_EQ(r.steps, 2u * (2000 / 32));
      EXPECT_LT(r.last_epoch_loss, r.first_epoch_loss);
      // Chance is 10 %.
      EXPECT_GE(r.test_accuracy, 0.72);
      EXPECT_GT(r.store.bytes_pulled, 0u);
      EXPECT_GT(r.store.bytes_pushed, 0u);
      // PsStore registers its buffers: pushes are zero-copy, and so are pulls
      // except of the tables the auto layout made inline (shards of at most
      // 64 KiB, rows under 1 KiB), which are staged. Staged pushes would
      // push this past the bytes pulled.
      EXPECT_LE(r.store.bytes_staged, r.store.bytes_pulled) << "PsStore should push zero-copy";
    }
  }

  Dataset train_;
  Dataset test_;
};

TEST_F(PsTrainTest, SoftmaxUnderBspLearnsWithZeroStaleness) {
  Result<std::vector<TrainReport>> r = RunInProcessJob(Job({}, kBsp), train_, test_);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectLearned(*r);
  for (const TrainReport& report : *r) EXPECT_EQ(report.store.staleness_max, 0u);
}

TEST_F(PsTrainTest, MlpUnderSspStaysWithinItsBoundWithAStraggler) {
  InProcessJob job = Job({32}, 2);
  job.slow_worker = 1;
  job.slow_factor = 3;
  job.train.slow_mode = SlowMode::kCompute;
  Result<std::vector<TrainReport>> r = RunInProcessJob(job, train_, test_);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectLearned(*r);
  for (const TrainReport& report : *r) EXPECT_LE(report.store.staleness_max, 2u);
}

TEST_F(PsTrainTest, MlpUnderAspLearns) {
  // 784x128 weights (200 KiB per shard): dense, pulled zero-copy; the other
  // tables are small, inline and staged: a small part of the bytes.
  Result<std::vector<TrainReport>> r = RunInProcessJob(Job({128}, kAsp), train_, test_);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectLearned(*r);
  for (const TrainReport& report : *r) {
    EXPECT_GT(report.store.bytes_staged, 0u);
    EXPECT_LT(report.store.bytes_staged * 20, report.store.bytes_pulled);
  }
}

}  // namespace
}  // namespace rdmaps::train

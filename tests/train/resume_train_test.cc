// rdmaps-train resumed from a checkpoint takes the steps an uninterrupted
// run takes: the same batches in the same order from the checkpoint's clock
// on, on the restored parameters and Adam state. One worker and one server
// (the server applies the pushes in the order they were sent), so the
// comparison is bitwise. The checkpoint is taken mid-epoch (clock 10 of
// epochs of 8 steps), so resuming must skip into the second epoch's shuffle.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <bit>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "tests/train/train_test_util.h"
#include "tools/train/ps_store.h"
#include "tools/train/tables.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {
namespace {

constexpr std::size_t kBatch = 16;
const ModelSpec kSpec{784, {16}, 10};

struct TrainRun {
  Params<float> params;
  std::uint64_t start_clock = 0;
  std::uint64_t steps = 0;
};

// One server (with `tweak`), one worker training 2 epochs of 8 steps.
Result<TrainRun> TrainOnce(const std::vector<TableOptions>& tables, const Dataset& data,
                           const std::function<void(ServerOptions&)>& tweak) {
  ServerOptions so;
  so.transport.transport = "tcp";
  so.transport.job_token = "resume-test";
  so.tables = tables;
  so.num_workers = 1;
  so.apply_threads = 1;
  tweak(so);
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(so));
  ClientOptions co;
  co.transport.transport = "tcp";
  co.transport.job_token = "resume-test";
  co.servers = {server->address()};
  co.tables = tables;
  co.connect_timeout = std::chrono::seconds(20);
  co.wait_timeout = std::chrono::seconds(20);
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<PsStore> store, PsStore::Connect(co, kSpec));
  TrainOptions o;
  o.model = kSpec;
  o.epochs = 2;
  o.batch_size = kBatch;
  o.seed = 5;
  o.evaluate = false;
  TrainRun run;
  run.start_clock = store->start_clock();
  RDMAPS_ASSIGN_OR_RETURN(TrainReport report, Train(o, data, data, *store));
  run.steps = report.steps;
  RDMAPS_RETURN_IF_ERROR(store->Pull(run.params));
  RDMAPS_RETURN_IF_ERROR(store->Close());
  server->Stop();
  return run;
}

TEST(ResumeTrainTest, ResumedRunEndsWithTheParametersOfAnUninterruptedOne) {
  char tmpl[] = "/tmp/rdmaps-train-ckpt-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Result<OptimizerOptions> adam = TrainOptimizer("adam", 0, /*softmax=*/false);
  ASSERT_TRUE(adam.ok()) << adam.status();
  const std::vector<TableOptions> tables = ModelTables(kSpec, *adam, 5, kBsp);
  const Dataset data = Synthetic(8 * kBatch);

  Result<TrainRun> straight = TrainOnce(tables, data, [](ServerOptions&) {});
  ASSERT_TRUE(straight.ok()) << straight.status();
  EXPECT_EQ(straight->steps, 16u);
  // The same run, checkpointing every 5 clocks (5, 10, 15).
  Result<TrainRun> checkpointed = TrainOnce(tables, data, [&](ServerOptions& o) {
    o.checkpoint_dir = dir;
    o.checkpoint_every = 5;
    o.checkpoint_keep = 0;
  });
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status();
  // From clock 10: 6 more steps.
  Result<TrainRun> resumed = TrainOnce(
      tables, data, [&](ServerOptions& o) { o.restore = dir + "/ckpt-00000000000000000010"; });
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->start_clock, 10u);
  EXPECT_EQ(resumed->steps, 6u);
  ASSERT_EQ(resumed->params.size(), straight->params.size());
  for (std::size_t t = 0; t < straight->params.size(); ++t) {
    ASSERT_EQ(resumed->params[t].size(), straight->params[t].size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < straight->params[t].size(); ++i) {
      differ += std::bit_cast<std::uint32_t>(resumed->params[t][i]) !=
                std::bit_cast<std::uint32_t>(straight->params[t][i]);
    }
    EXPECT_EQ(differ, 0u) << "table " << t << ": the resumed run took other steps";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rdmaps::train

// rdmaps-train --local against a run through the parameter server: with the
// same tables and seed, one worker and one server, both start from the same
// weights and hold the same parameters after the first step (and after a
// few more).
//
// The comparison is bitwise, not within a tolerance, because nothing differs
// between the two paths but where the code runs: the initial rows come from
// the same InitRow (rdmaps::InitializeRows is the servers' initializer); the
// gradient is the same Mlp code on the same weights and batch; the transport
// moves the gradient's bytes unchanged; and each row's update is the same
// internal::Optimizer::Apply (rdmaps::TableOptimizer wraps it) on the same
// state, whose float operations (+, -, *, /, sqrt) are correctly rounded
// IEEE operations, so Eigen's vectorised and scalar paths agree whatever the
// rows' alignment. With one worker under BSP the server applies the pushes
// in the order they were sent. Any difference is a real divergence (another
// initializer, another Adam), which a tolerance would hide.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "rdmaps/table.h"
#include "tests/train/train_test_util.h"
#include "tools/train/local_store.h"
#include "tools/train/model.h"
#include "tools/train/ps_store.h"
#include "tools/train/tables.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {
namespace {

constexpr std::size_t kBatch = 32;
constexpr std::uint64_t kSeed = 3;

// The parameters before and after a run.
struct Snapshots {
  Params<float> initial;
  Params<float> after;
};

TrainOptions Options(const ModelSpec& spec) {
  TrainOptions o;
  o.model = spec;
  o.epochs = 1;
  o.batch_size = kBatch;
  o.seed = kSeed;
  o.evaluate = false;
  return o;
}

Result<Snapshots> TrainIn(ParameterStore& store, const ModelSpec& spec, const Dataset& data) {
  Snapshots s;
  RDMAPS_RETURN_IF_ERROR(store.Pull(s.initial));
  RDMAPS_RETURN_IF_ERROR(Train(Options(spec), data, data, store));
  RDMAPS_RETURN_IF_ERROR(store.Pull(s.after));
  return s;
}

Result<Snapshots> TrainLocally(const std::vector<TableOptions>& tables, const ModelSpec& spec,
                               const Dataset& data) {
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<LocalStore> store, LocalStore::Create(tables));
  return TrainIn(*store, spec, data);
}

// The store closes (says goodbye) when it goes out of scope.
Result<Snapshots> ConnectAndTrain(const ClientOptions& co, const ModelSpec& spec,
                                  const Dataset& data) {
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<PsStore> store, PsStore::Connect(co, spec));
  return TrainIn(*store, spec, data);
}

Result<Snapshots> TrainOnOneServer(const std::vector<TableOptions>& tables, const ModelSpec& spec,
                                   const Dataset& data) {
  ServerOptions so;
  so.transport.job_token = "train-test";
  so.transport.transport = "tcp";
  so.tables = tables;
  so.num_workers = 1;
  so.apply_threads = 1;
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(so));
  ClientOptions co;
  co.transport.job_token = "train-test";
  co.transport.transport = "tcp";
  co.servers = {server->address()};
  co.tables = tables;
  co.connect_timeout = std::chrono::seconds(20);
  co.wait_timeout = std::chrono::seconds(20);
  Result<Snapshots> s = ConnectAndTrain(co, spec, data);
  server->Stop();
  return s;
}

// Bitwise: the same float bits (0.0f and -0.0f differ, NaNs compare).
void ExpectSameBits(const Params<float>& local, const Params<float>& ps, const char* when) {
  ASSERT_EQ(local.size(), ps.size()) << when;
  const std::vector<TableShape> shapes = ParameterTables(ModelSpec{784, {16}, 10});
  for (std::size_t t = 0; t < local.size(); ++t) {
    ASSERT_EQ(local[t].size(), ps[t].size()) << when << ", table " << shapes[t].name;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < local[t].size(); ++i) {
      if (std::bit_cast<std::uint32_t>(local[t][i]) != std::bit_cast<std::uint32_t>(ps[t][i])) {
        if (++differ <= 3) {
          ADD_FAILURE() << when << ", table " << shapes[t].name << " element " << i << ": local "
                        << local[t][i] << ", ps " << ps[t][i];
        }
      }
    }
    EXPECT_EQ(differ, 0u) << when << ", table " << shapes[t].name;
  }
}

// Parameter: rdmaps-train's --optimizer, with its default learning rate.
class LocalVsPsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(LocalVsPsTest, SameParametersAfterTheFirstStepAndAFewMore) {
  const ModelSpec spec{784, {16}, 10};
  Result<OptimizerOptions> optimizer = TrainOptimizer(GetParam(), 0, /*softmax=*/false);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  const std::vector<TableOptions> tables = ModelTables(spec, *optimizer, kSeed, kBsp);
  for (const std::size_t steps : {1, 4}) {
    SCOPED_TRACE(std::to_string(steps) + " step(s)");
    const Dataset data = Synthetic(steps * kBatch);
    Result<Snapshots> local = TrainLocally(tables, spec, data);
    ASSERT_TRUE(local.ok()) << local.status();
    Result<Snapshots> ps = TrainOnOneServer(tables, spec, data);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ExpectSameBits(local->initial, ps->initial, "initial parameters");
    ExpectSameBits(local->after, ps->after, "after training");
    EXPECT_NE(local->after, local->initial) << "no step was taken";
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, LocalVsPsTest, ::testing::Values("sgd", "momentum", "adam"),
                         [](const auto& param_info) { return std::string(param_info.param); });

}  // namespace
}  // namespace rdmaps::train

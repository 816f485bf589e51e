// Replicated shards (replicas = 2): the backup's rows and optimizer state
// equal the primary's bit for bit, a push is acknowledged only once the
// backup holds it, and a primary killed at any point of a run of pushes is
// replaced by its backup with every acknowledged push applied exactly once
// (docs/ps.md, "Replication and failover"). On fake and tcp.
#include "src/ps/replication.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "rdmaps/failover.h"
#include "src/ps/checkpoint.h"
#include "src/ps/test_hooks.h"
#include "tests/ps/eventually.h"
#include "tests/ps/ps_test_util.h"
#include "tests/ps/replicated_cluster.h"
#include "transport/fake/fake_transport.h"

namespace rdmaps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

using Replicated = ReplicatedCluster;

// Per shard a backup, then its primary; then the workers.
void Start(Replicated* c, const std::string& transport, std::uint32_t S, std::uint32_t W,
           const std::vector<TableOptions>& tables, milliseconds wait_timeout = seconds(20),
           const std::string& checkpoint_dir = "", std::uint64_t checkpoint_every = 0) {
  c->transport = transport;
  c->wait_timeout = wait_timeout;
  c->StartShards(S, W, tables, [&](ServerOptions& o) {
    o.checkpoint_dir = checkpoint_dir;
    o.checkpoint_every = checkpoint_every;
  });
  if (::testing::Test::HasFatalFailure()) return;
  c->ConnectWorkers(W, W);
}

using rdmaps::testing::Eventually;

class ReplicationTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplicationTest, BackupEqualsPrimaryBitForBit) {
  // Adam and momentum keep state beside the rows; pushes of two workers
  // interleave, so the backup must apply them in the primary's order.
  TableOptions adam = MakeTable(1, "adam", 300, 8, kAsp, Initializer::Normal(0, 0.1f, 7),
                                OptimizerOptions::Adam(0.01f));
  TableOptions mom = MakeTable(2, "momentum", 40, 300, kAsp, Initializer::Uniform(-1, 1, 3),
                               OptimizerOptions::Momentum(0.1f));
  Replicated c;
  Start(&c, GetParam(), 2, 2, {adam, mom});
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::thread> workers;
  std::vector<Status> results(2);
  for (std::uint32_t w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      std::mt19937 rng(w + 1);
      std::uniform_real_distribution<float> g(-1, 1);
      Client& cl = *c.clients[w];
      for (int it = 0; it < 30 && results[w].ok(); ++it) {
        std::vector<float> grads(300 * 8);
        for (float& x : grads) x = g(rng);
        results[w] = cl.Push(1, RowRange{0, 300}, grads);
        std::vector<std::uint64_t> ids = {5, 299, 5, 150};
        std::vector<float> rows(ids.size() * 8);
        for (float& x : rows) x = g(rng);
        if (results[w].ok()) results[w] = cl.Push(1, ids, rows);
        std::vector<float> big(40 * 300);
        for (float& x : big) x = g(rng);
        if (results[w].ok()) results[w] = cl.Push(2, RowRange{0, 40}, big);
        // Clocks inside the batches (ASP: none waits): forwarded with the
        // data slots around them, in the same order.
        if (results[w].ok() && it % 3 == 2) results[w] = cl.Clock().status();
      }
      if (results[w].ok()) results[w] = cl.Flush();
    });
  }
  for (auto& t : workers) t.join();
  for (const Status& st : results) ASSERT_TRUE(st.ok()) << st;
  for (std::uint32_t i = 0; i < 2; ++i) {
    Server& p = *c.primaries[i];
    Server& b = *c.backups[i];
    EXPECT_GT(p.stats().log_records, 0u);
    ASSERT_TRUE(Eventually([&] { return b.stats().log_records == p.stats().log_records; }))
        << "backup " << i << " applied " << b.stats().log_records << " of "
        << p.stats().log_records;
    for (std::uint32_t table : {1u, 2u}) {
      std::vector<float> prow, pstate, brow, bstate;
      ASSERT_TRUE(internal::TEST_ShardState(p, table, &prow, &pstate).ok());
      ASSERT_TRUE(internal::TEST_ShardState(b, table, &brow, &bstate).ok());
      ASSERT_EQ(prow.size(), brow.size());
      ASSERT_EQ(pstate.size(), bstate.size());
      EXPECT_FALSE(pstate.empty());
      EXPECT_EQ(std::memcmp(prow.data(), brow.data(), prow.size() * 4), 0)
          << "rows of table " << table << ", shard " << i;
      EXPECT_EQ(std::memcmp(pstate.data(), bstate.data(), pstate.size() * 4), 0)
          << "optimizer state of table " << table << ", shard " << i;
    }
    EXPECT_EQ(b.stats().protocol_errors, 0u);
  }
}

// Every push adds 1 to rows [0, 64) and 1 more to row 3 and 2 to row 40
// (SGD, lr 1, gradient -1); the primary of one shard is killed once it has
// applied `kill_after` slots. Every call must succeed (failing over), and
// the rows must be exactly the sum of the pushes: none lost, none twice.
struct KillCase {
  std::string transport;
  std::uint32_t victim;
  std::uint64_t kill_after;
};

class KillPrimaryTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(KillPrimaryTest, EveryPushAppliedExactlyOnce) {
  const KillCase& k = GetParam();
  constexpr std::uint32_t W = 2;
  constexpr int kIters = 60;
  Replicated c;
  Start(&c, k.transport, 2, W, {MakeTable(1, "count", 64, 4)});
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Status> results(W);
  std::vector<std::thread> workers;
  const auto begin = SteadyClock::now();
  for (std::uint32_t w = 0; w < W; ++w) {
    workers.emplace_back([&, w] {
      Client& cl = *c.clients[w];
      const std::vector<float> minus_one(64 * 4, -1.0f);
      const std::vector<std::uint64_t> ids = {3, 40, 40};
      for (int it = 0; it < kIters && results[w].ok(); ++it) {
        results[w] = cl.Push(1, RowRange{0, 64}, minus_one);
        if (results[w].ok()) results[w] = cl.Push(1, ids, {minus_one.data(), 3 * 4});
        if (results[w].ok() && it % 8 == 7) results[w] = cl.Clock().status();
        if (results[w].ok() && it % 16 == 15) results[w] = cl.Flush();
      }
      if (results[w].ok()) results[w] = cl.Flush();
    });
  }
  Server& victim = *c.primaries[k.victim];
  const bool reached = Eventually([&] { return victim.stats().pushes_applied >= k.kill_after; });
  internal::TEST_Kill(victim);
  for (auto& t : workers) t.join();
  ASSERT_TRUE(reached) << "the victim applied only " << victim.stats().pushes_applied;
  for (std::uint32_t w = 0; w < W; ++w)
    ASSERT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w];
  // No call waited past its deadline: the whole run took less than one.
  EXPECT_LT(SteadyClock::now() - begin, seconds(20));

  // The workers may all have finished before the kill: the pull below then
  // is the first call to meet the dead primary (and the backup's promotion
  // may still be under way).
  std::vector<float> rows(64 * 4);
  ASSERT_TRUE(c.clients[0]->Pull(1, RowRange{0, 64}, rows).ok());
  auto a = c.decider->Current(k.victim);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->epoch, 2u);
  EXPECT_EQ(a->primary, c.backups[k.victim]->address());
  for (std::uint64_t r = 0; r < 64; ++r) {
    const float want = float{W * kIters} * (r == 3 ? 2 : r == 40 ? 3 : 1);
    for (int d = 0; d < 4; ++d) {
      ASSERT_EQ(rows[r * 4 + d], want) << "row " << r << " dim " << d;
    }
  }
  ClientStats st = c.clients[0]->stats();
  EXPECT_GE(st.failovers + c.clients[1]->stats().failovers, 1u);
}

std::vector<KillCase> KillCases() {
  std::vector<KillCase> v;
  for (const char* t : {"fake", "tcp"}) {
    v.push_back({t, 0, 0});    // before any push
    v.push_back({t, 1, 17});   // early
    v.push_back({t, 0, 101});  // mid-run
    v.push_back({t, 1, 200});  // late
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Kills, KillPrimaryTest, ::testing::ValuesIn(KillCases()),
                         [](const auto& p) {
                           return p.param.transport + "_shard" + std::to_string(p.param.victim) +
                                  "_after" + std::to_string(p.param.kill_after);
                         });

// Pipelined PushPulls (registered output, dense table: rows READ as the
// slots covering them are applied) while the primary of one shard is
// killed: every call succeeds (failing over: the retry rebuilds the slots
// sent before without sending them again, and pulls anew from the new
// primary), each returns its own push in every row, and every push is
// applied exactly once.
class KillPrimaryPushPullTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(KillPrimaryPushPullTest, EveryPushAppliedOnceAndEveryPullSeesIt) {
  const KillCase& k = GetParam();
  constexpr int kIters = 40;
  constexpr std::uint64_t kRows = 64;
  constexpr std::uint32_t kDim = 1000;  // 4 rows per 16 KiB slot: 8 slots per shard
  Replicated c;
  Start(&c, k.transport, 2, 1, {MakeTable(1, "count", kRows, kDim)});
  ASSERT_FALSE(HasFatalFailure());
  Client& cl = *c.clients[0];
  std::vector<float> g(kRows * kDim, -1.0f), out(kRows * kDim);
  ASSERT_TRUE(cl.RegisterBuffer(g).ok());
  ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  Status result;
  std::string mismatch;  // the first wrong float seen by the worker
  std::thread worker([&] {
    for (int it = 1; it <= kIters && result.ok() && mismatch.empty(); ++it) {
      result = cl.PushPull(1, RowRange{0, kRows}, g, out);
      for (std::size_t i = 0; result.ok() && i < out.size(); ++i) {
        if (out[i] != static_cast<float>(it)) {
          mismatch = "PushPull " + std::to_string(it) + " returned " + std::to_string(out[i]) +
                     " at float " + std::to_string(i);
          break;
        }
      }
    }
  });
  Server& victim = *c.primaries[k.victim];
  const bool reached = Eventually([&] { return victim.stats().pushes_applied >= k.kill_after; });
  internal::TEST_Kill(victim);
  worker.join();
  ASSERT_TRUE(reached) << "the victim applied only " << victim.stats().pushes_applied;
  ASSERT_TRUE(result.ok()) << result;
  ASSERT_TRUE(mismatch.empty()) << mismatch;
  // (If the run ended before the kill, this pull meets the dead primary.)
  std::vector<float> rows(kRows * kDim);
  ASSERT_TRUE(cl.Pull(1, RowRange{0, kRows}, rows).ok());
  for (std::size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], float{kIters}) << i;
  EXPECT_GE(cl.stats().failovers, 1u);
  EXPECT_GT(cl.stats().rows_pulled_pipelined, 0u);
}

INSTANTIATE_TEST_SUITE_P(Kills, KillPrimaryPushPullTest,
                         ::testing::Values(KillCase{"fake", 1, 17}, KillCase{"tcp", 0, 101}),
                         [](const auto& p) {
                           return p.param.transport + "_shard" + std::to_string(p.param.victim) +
                                  "_after" + std::to_string(p.param.kill_after);
                         });

// A caller may reuse its gradient buffer as soon as Push returns, so the
// worker keeps each slot until it is acknowledged: pushes the dead primary
// never applied are resent with the values they were pushed with, not with
// what the buffer holds by then. Four pushes wait in the paused primary's
// ring (a registered buffer, written zero-copy, and a plain one, copied; a
// range and row ids of each), every buffer overwritten after its push;
// after the kill the promoted backup must apply exactly those four.
TEST_P(ReplicationTest, ResentPushesCarryTheValuesTheyWerePushedWith) {
  Replicated c;
  Start(&c, GetParam(), 1, 1, {MakeTable(1, "count", 8, 4)});
  ASSERT_FALSE(HasFatalFailure());
  Client& cl = *c.clients[0];
  std::vector<float> reg(8 * 4), plain(8 * 4);
  ASSERT_TRUE(cl.RegisterBuffer(reg).ok());
  const std::vector<std::uint64_t> ids = {1, 5};
  Server& primary = *c.primaries[0];
  internal::TEST_PauseApply(primary, true);
  auto push = [&](std::vector<float>& g, float value, bool rows) {
    std::fill(g.begin(), g.end(), -value);
    const Status st = rows ? cl.Push(1, ids, {g.data(), 2 * 4}) : cl.Push(1, RowRange{0, 8}, g);
    std::fill(g.begin(), g.end(), -1000.0f);  // what a resend must not carry
    return st;
  };
  ASSERT_TRUE(push(reg, 1, false).ok());
  ASSERT_TRUE(push(plain, 2, false).ok());
  ASSERT_TRUE(push(reg, 4, true).ok());
  ASSERT_TRUE(push(plain, 8, true).ok());
  EXPECT_EQ(primary.stats().pushes_applied, 0u);
  internal::TEST_Kill(primary);
  ASSERT_TRUE(cl.Flush().ok());
  std::vector<float> rows(8 * 4);
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 8}, rows).ok());
  for (std::uint64_t r = 0; r < 8; ++r) {
    const float want = (r == 1 || r == 5) ? 15.0f : 3.0f;
    for (int d = 0; d < 4; ++d) ASSERT_EQ(rows[r * 4 + d], want) << "row " << r << " dim " << d;
  }
  const ClientStats st = cl.stats();
  EXPECT_EQ(st.failovers, 1u);
  EXPECT_GE(st.pushes_resent, 4u);
  EXPECT_GE(st.zero_copy_calls, 2u);
}

// Close() after the primary died: the goodbye follows the shard to the
// promoted backup, behind the resent push it had not applied, so the new
// primary counts the worker done (not dead) and applies its push once.
// Without the failover in Close() it returns Unavailable for the old
// primary and the promoted one sees the worker leave as dead.
TEST_P(ReplicationTest, CloseAfterThePrimaryDiedSaysGoodbyeToTheNewOne) {
  Replicated c;
  Start(&c, GetParam(), 1, 1, {MakeTable(1, "count", 8, 4)});
  ASSERT_FALSE(HasFatalFailure());
  Client& cl = *c.clients[0];
  Server& primary = *c.primaries[0];
  internal::TEST_PauseApply(primary, true);
  ASSERT_TRUE(cl.Push(1, RowRange{0, 8}, std::vector<float>(8 * 4, -1.0f)).ok());
  internal::TEST_Kill(primary);
  const Status closed = cl.Close();
  ASSERT_TRUE(closed.ok()) << closed;
  Server& promoted = *c.backups[0];
  ASSERT_TRUE(Eventually([&] { return promoted.stats().workers_done == 1; }))
      << "workers done " << promoted.stats().workers_done;
  const ServerStats st = promoted.stats();
  EXPECT_TRUE(st.dead_workers.empty());
  EXPECT_EQ(st.pushes_applied, 1u);
  EXPECT_EQ(cl.stats().failovers, 1u);
}

// Worker 0 arrives at a Barrier, server 0's primary dies while it waits,
// then worker 1 arrives: both pass (worker 0's arrival reached the backup
// through the log), both see every push made before the barrier, and the
// next barrier counts from there. Without the ring barrier with failover
// (the atomics counter is not replicated) worker 0 fails at the kill.
TEST_P(ReplicationTest, BarrierCompletesAcrossAFailoverOfServer0) {
  constexpr std::uint32_t W = 2;
  Replicated c;
  Start(&c, GetParam(), 2, W, {MakeTable(1, "count", 64, 4)});
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<float> minus_one(4, -1.0f);
  // Each worker's row on server 0 (rows [0, 32)) and on server 1.
  for (std::uint32_t w = 0; w < W; ++w) {
    ASSERT_TRUE(c.clients[w]->Push(1, RowRange{w, 1}, minus_one).ok());
    const Status pushed = c.clients[w]->Push(1, RowRange{40 + w, 1}, minus_one);
    ASSERT_TRUE(pushed.ok()) << pushed;
  }
  const std::uint64_t records = c.backups[0]->stats().log_records;
  Status first;
  std::thread t([&] { first = c.clients[0]->Barrier(); });
  // Worker 0's arrival is in server 0's backup (forwarded before applied).
  const bool arrived = Eventually([&] { return c.backups[0]->stats().log_records > records; });
  internal::TEST_Kill(*c.primaries[0]);
  const Status second = c.clients[1]->Barrier();
  t.join();
  ASSERT_TRUE(arrived);
  ASSERT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second;
  EXPECT_EQ(c.decider->Current(0)->epoch, 2u);
  for (std::uint32_t w = 0; w < W; ++w) {
    std::vector<float> rows(64 * 4);
    ASSERT_TRUE(c.clients[w]->Pull(1, RowRange{0, 64}, rows).ok());
    for (std::uint64_t r : {0, 1, 40, 41}) EXPECT_EQ(rows[r * 4], 1.0f) << "row " << r;
  }
  // The next barrier: both arrive again (neither passes alone).
  Status again;
  std::thread t2([&] { again = c.clients[0]->Barrier(); });
  ASSERT_TRUE(c.clients[1]->Barrier().ok());
  t2.join();
  ASSERT_TRUE(again.ok()) << again;
  // Each arrival applied once: worker 0's first one (logged, then resent
  // by its failover) is not counted twice.
  EXPECT_EQ(c.backups[0]->stats().barrier_arrivals, 4u);
}

// With failover a Barrier() interrupted after it arrived keeps its
// generation: its next Barrier() waits for the same one (else worker 0
// would wait for a generation worker 1 never reaches).
TEST_P(ReplicationTest, InterruptedBarrierWaitsForTheSameGenerationNext) {
  Replicated c;
  Start(&c, GetParam(), 1, 2, {MakeTable(1, "count", 8, 2)});
  ASSERT_FALSE(HasFatalFailure());
  const std::uint64_t records = c.backups[0]->stats().log_records;
  Status first;
  std::thread t([&] { first = c.clients[0]->Barrier(); });
  const bool arrived = Eventually([&] { return c.backups[0]->stats().log_records > records; });
  // Interrupt until the call has ended (an Interrupt() before it began
  // waiting would not cut it short).
  std::atomic<bool> ended{false};
  std::thread stopper([&] {
    while (!ended.load()) {
      c.clients[0]->Interrupt();
      std::this_thread::sleep_for(milliseconds(5));
    }
  });
  t.join();
  ended.store(true);
  stopper.join();
  ASSERT_TRUE(arrived);
  ASSERT_EQ(first.code(), StatusCode::kCancelled) << first;
  for (int round = 0; round < 2; ++round) {
    Status again;
    std::thread t2([&] { again = c.clients[0]->Barrier(); });
    const Status other = c.clients[1]->Barrier();
    t2.join();
    ASSERT_TRUE(again.ok()) << "round " << round << ": " << again;
    ASSERT_TRUE(other.ok()) << "round " << round << ": " << other;
  }
}

// A Checkpoint under way when server 0's primary dies: the cut dies with it
// (a backup takes none), so each worker's call either completes or fails
// with Unavailable naming the failover, and a retry at the same clock
// completes on every server; the checkpoint then holds every push.
TEST_P(ReplicationTest, CheckpointAcrossAFailoverFailsRetryablyThenCompletes) {
  constexpr std::uint32_t W = 2;
  const ScopedTempDir tmp("rdmaps-repl-ckpt");
  ASSERT_FALSE(tmp.path.empty());
  const std::string& dir = tmp.path;
  Replicated c;
  Start(&c, GetParam(), 2, W, {MakeTable(1, "count", 64, 4, 0)}, seconds(20), dir);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<float> minus_one(64 * 4, -1.0f);
  for (std::uint32_t w = 0; w < W; ++w) {
    ASSERT_TRUE(c.clients[w]->Push(1, RowRange{0, 64}, minus_one).ok());
  }
  std::vector<Status> clocks(W);
  {
    std::vector<std::thread> ts;
    for (std::uint32_t w = 0; w < W; ++w) {
      ts.emplace_back([&, w] { clocks[w] = c.clients[w]->Clock().status(); });
    }
    for (auto& t : ts) t.join();
  }
  for (const Status& st : clocks) ASSERT_TRUE(st.ok()) << st;
  const std::uint64_t records = c.backups[0]->stats().log_records;
  Result<CheckpointInfo> first = UnavailableError("not run");
  std::thread t([&] { first = c.clients[0]->Checkpoint(); });
  // Worker 0's request is in server 0's backup; worker 1 has not asked, so
  // the cut cannot be complete when the primary dies.
  const bool asked = Eventually([&] { return c.backups[0]->stats().log_records > records; });
  internal::TEST_Kill(*c.primaries[0]);
  Result<CheckpointInfo> second = c.clients[1]->Checkpoint();
  t.join();
  ASSERT_TRUE(asked);
  std::vector<Result<CheckpointInfo>*> results = {&first, &second};
  int retried = 0;
  for (std::uint32_t w = 0; w < W; ++w) {
    if (results[w]->ok()) continue;
    EXPECT_EQ(results[w]->status().code(), StatusCode::kUnavailable) << results[w]->status();
    EXPECT_NE(results[w]->status().message().find("call Checkpoint() again"), std::string::npos)
        << results[w]->status();
    ++retried;
  }
  EXPECT_GE(retried, 1) << "worker 0's cut on server 0 died with its primary";
  {
    std::vector<std::thread> ts;
    for (std::uint32_t w = 0; w < W; ++w) {
      if (results[w]->ok()) continue;
      ts.emplace_back([&, w] { *results[w] = c.clients[w]->Checkpoint(); });
    }
    for (auto& th : ts) th.join();
  }
  for (std::uint32_t w = 0; w < W; ++w) {
    ASSERT_TRUE(results[w]->ok()) << "worker " << w << ": " << results[w]->status();
    EXPECT_EQ((*results[w])->clock, 1u);
  }
  auto parts = internal::OpenCheckpoint(dir + "/" + first->name);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->size(), 2u);
  // Restored, it holds both workers' pushes of clock 0.
  std::vector<std::unique_ptr<Server>> restored;
  std::vector<std::string> addresses;
  for (std::uint32_t i = 0; i < 2; ++i) {
    ServerOptions o = MakeServerOptions(GetParam(), i, 2, W, {MakeTable(1, "count", 64, 4, 0)});
    o.restore = dir + "/" + first->name;
    auto s = Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    restored.push_back(std::move(s).value());
  }
  for (std::uint32_t i = 0; i < 2; ++i) {
    std::vector<float> local;
    const Status read = restored[i]->ReadLocal(1, RowRange{i * 32, 32}, &local);
    ASSERT_TRUE(read.ok()) << read;
    for (float v : local) ASSERT_EQ(v, float{W});
  }
}

// Shard 0's primary dies while Clock() relays a checkpoint cut that shard
// 1's primary published, after the clock marker went out: the relay fails
// over like the marker (it ended Clock() with Unavailable after the clock
// was counted, so a retried Clock() counted it twice). Clock() returns the
// next clock, and the promoted backup holds the worker at exactly it.
TEST_P(ReplicationTest, ClockFailsOverWhileRelayingACut) {
  const ScopedTempDir tmp("rdmaps-repl-relay");
  ASSERT_FALSE(tmp.path.empty());
  Replicated c;
  Start(&c, GetParam(), 2, 1, {MakeTable(1, "count", 64, 4, 0)}, seconds(20), tmp.path);
  ASSERT_FALSE(HasFatalFailure());
  Client& worker = *c.clients[0];
  const std::vector<float> minus_one(64 * 4, -1.0f);
  ASSERT_TRUE(worker.Push(1, RowRange{0, 64}, minus_one).ok());
  auto first = worker.Clock();
  ASSERT_TRUE(first.ok()) << first.status();
  std::atomic<bool> killed{false};
  internal::TEST_BeforeRelayingCuts(worker, [&] {
    if (!killed.exchange(true)) internal::TEST_Kill(*c.primaries[0]);
  });
  c.primaries[1]->RequestCheckpoint();
  // Each Clock() reads the control blocks; the one after the trigger was
  // served relays its cut.
  std::uint64_t clock = *first;
  const auto give_up = SteadyClock::now() + seconds(20);
  while (!killed.load() && SteadyClock::now() < give_up) {
    auto r = worker.Clock();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, clock + 1);
    clock = *r;
  }
  ASSERT_TRUE(killed.load()) << "no cut to relay: server 1 never published one";
  ASSERT_TRUE(worker.Flush().ok());
  Server& promoted = *c.backups[0];
  EXPECT_TRUE(Eventually([&] { return promoted.stats().min_clock == clock; }))
      << "the promoted backup holds the worker at clock " << promoted.stats().min_clock
      << ", the worker is at " << clock;
  auto next = worker.Clock();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, clock + 1);
}

// A backup passes each checkpoint cut at the log record that completed it
// on its primary. Here its apply thread is paused while two workers clock
// through cuts at 2 and 4, so it applies their records in one batch, in
// which the record completing a cut is followed by later clocks. (It
// passed cuts once per batch: the cut at 2 was overtaken and waited out
// checkpoint_timeout, and once promoted this backup took no checkpoint
// meanwhile: the fault matrix's checkpoint cell, under load.) After the
// primary's death the promoted backup must take the cut at 6 in time.
TEST_P(ReplicationTest, APromotedBackupTakesTheCutsAfterABatchOfPassedOnes) {
  constexpr std::uint32_t W = 2;
  const ScopedTempDir tmp("rdmaps-repl-cut");
  ASSERT_FALSE(tmp.path.empty());
  const std::string& dir = tmp.path;
  Replicated c;
  // checkpoint_timeout stays 600 s: only a cut passed in time counts.
  Start(&c, GetParam(), 1, W, {MakeTable(1, "count", 8, 4, 0)}, seconds(20), dir, 2);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<float> minus_one(8 * 4, -1.0f);
  auto run = [&](int clocks, bool push) {
    std::vector<Status> st(W);
    std::vector<std::thread> ts;
    for (std::uint32_t w = 0; w < W; ++w) {
      ts.emplace_back([&, w] {
        for (int i = 0; i < clocks && st[w].ok(); ++i) {
          if (push) st[w] = c.clients[w]->Push(1, RowRange{0, 8}, minus_one);
          if (st[w].ok()) st[w] = c.clients[w]->Clock().status();
        }
      });
    }
    for (auto& t : ts) t.join();
    for (std::uint32_t w = 0; w < W; ++w)
      ASSERT_TRUE(st[w].ok()) << "worker " << w << ": " << st[w];
  };
  internal::TEST_PauseApply(*c.backups[0], true);
  // Clocks 1..3 (6 records: the backup's log ring holds push_slots = 8):
  // the primary takes the cut at 2.
  run(3, false);
  ASSERT_FALSE(HasFatalFailure());
  const std::uint64_t records = c.backups[0]->stats().log_records;
  internal::TEST_PauseApply(*c.backups[0], false);
  // Every record of those clocks applied at the backup, then the primary
  // dies.
  ASSERT_TRUE(Eventually([&] { return c.backups[0]->stats().log_records >= records + 6; }));
  internal::TEST_Kill(*c.primaries[0]);
  run(5, true);  // clocks 4..8 at the promoted backup
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(c.clients[0]->Flush().ok());
  const std::string cut6 = dir + "/" + internal::CheckpointName(6);
  EXPECT_TRUE(Eventually([&] { return internal::OpenCheckpoint(cut6).ok(); }))
      << cut6 << " not written: the promoted backup still held an overtaken cut";
}

INSTANTIATE_TEST_SUITE_P(Transports, ReplicationTest, ::testing::Values("fake", "tcp"));

// The primary acknowledges nothing while its log WRITE is not complete: a
// Flush times out and the row is unchanged in the primary's shard; once
// the WRITE goes through, both happen.
TEST(ReplicationFakeTest, PushIsObservableOnlyOnceTheBackupHoldsIt) {
  Replicated c;
  Start(&c, "fake", 1, 2, {MakeTable(1, "count", 8, 2)}, milliseconds(300));
  ASSERT_FALSE(HasFatalFailure());
  transport::Endpoint* primary_ep = internal::TEST_ServerEndpoint(*c.primaries[0]);
  transport::fake::Faults hold;
  hold.hold_until_released = true;
  ASSERT_TRUE(transport::fake::SetFaults(*primary_ep, hold).ok());
  const std::vector<float> minus_one(8 * 2, -1.0f);
  ASSERT_TRUE(c.clients[0]->Push(1, RowRange{0, 8}, minus_one).ok());
  const Status held = c.clients[0]->Flush();
  EXPECT_EQ(held.code(), StatusCode::kTimedOut) << held;
  // Another worker READs the primary's shard (no server CPU, no lock).
  std::vector<float> seen(8 * 2);
  ASSERT_TRUE(c.clients[1]->Pull(1, RowRange{0, 8}, seen).ok());
  EXPECT_EQ(seen[0], 0.0f) << "the primary applied a push its backup does not hold";
  // (Held ops follow the faults they were posted under: release, then clear.)
  ASSERT_TRUE(transport::fake::ReleaseHeldOps(*primary_ep).ok());
  ASSERT_TRUE(transport::fake::SetFaults(*primary_ep, {}).ok());
  // (Each Flush gives up after this client's 300 ms; a loaded machine may
  // need more than one to see the apply.)
  ASSERT_TRUE(Eventually([&] { return c.clients[0]->Flush().ok(); }));
  ASSERT_TRUE(c.clients[1]->Pull(1, RowRange{0, 8}, seen).ok());
  EXPECT_EQ(seen[0], 1.0f);
  std::vector<float> local;
  ASSERT_TRUE(Eventually([&] { return c.backups[0]->stats().log_records == 1; }));
  ASSERT_TRUE(c.backups[0]->ReadLocal(1, RowRange{0, 8}, &local).ok());
  EXPECT_EQ(local[0], 1.0f);
}

// A primary lost after a worker connected to it but before the worker read
// its directory: Client::Connect follows the promotion as a later call
// would (it failed with the dead primary's "peer vanished").
TEST(ReplicationFakeTest, ConnectFollowsAPrimaryLostBeforeItsDirectoryWasRead) {
  Replicated c;
  c.transport = "fake";
  c.StartShards(1, 1, {MakeTable(1, "count", 8, 2)});
  ASSERT_FALSE(HasFatalFailure());
  transport::fake::Faults hold;
  hold.inbound = true;  // the worker's directory READ against its memory
  hold.hold_until_released = true;
  ASSERT_TRUE(
      transport::fake::SetFaults(*internal::TEST_ServerEndpoint(*c.primaries[0]), hold).ok());
  Result<std::unique_ptr<Client>> connected = UnavailableError("not run");
  std::thread t([&] { connected = Client::Connect(c.WorkerOptions(0, 1)); });
  const bool bootstrapped =
      Eventually([&] { return c.primaries[0]->stats().workers_connected == 1; });
  internal::TEST_Kill(*c.primaries[0]);
  t.join();
  ASSERT_TRUE(bootstrapped) << "the worker never connected to the primary";
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client& w = **connected;
  EXPECT_EQ(w.stats().failovers, 1u);
  const std::vector<float> minus_one(8 * 2, -1.0f);
  ASSERT_TRUE(w.Push(1, RowRange{0, 8}, minus_one).ok());
  ASSERT_TRUE(w.Flush().ok());
  std::vector<float> seen(8 * 2);
  ASSERT_TRUE(w.Pull(1, RowRange{0, 8}, seen).ok());
  EXPECT_EQ(seen, std::vector<float>(8 * 2, 1.0f));
  EXPECT_EQ(c.decider->Current(0)->primary, c.backups[0]->address());
}

// Several records in flight at once (a push of several slots, a Clock, a
// push): while the log WRITEs are held nothing is applied, though the
// later ones are posted behind the first; released, each is applied once
// the backup holds it, and the backup equals the primary bit for bit.
TEST(ReplicationFakeTest, RecordsInFlightAreAppliedOnlyOnceTheBackupHoldsThem) {
  Replicated c;
  // 4 KiB rows in 16 KiB slots: a push of 8 rows takes 3 (7 of the 8 credits).
  Start(&c, "fake", 1, 2, {MakeTable(1, "count", 64, 1024)}, milliseconds(300));
  ASSERT_FALSE(HasFatalFailure());
  transport::Endpoint* primary_ep = internal::TEST_ServerEndpoint(*c.primaries[0]);
  transport::fake::Faults hold;
  hold.hold_until_released = true;
  ASSERT_TRUE(transport::fake::SetFaults(*primary_ep, hold).ok());
  const std::vector<float> minus_one(64 * 1024, -1.0f);
  for (int round = 0; round < 2; ++round) {
    const Status pushed = c.clients[0]->Push(1, RowRange{0, 8}, {minus_one.data(), 8 * 1024});
    ASSERT_TRUE(pushed.ok()) << pushed;
    if (round == 0) {
      const Status clocked = c.clients[0]->Clock().status();
      ASSERT_TRUE(clocked.ok()) << clocked;
    }
  }
  const Status held = c.clients[0]->Flush();
  EXPECT_EQ(held.code(), StatusCode::kTimedOut) << held;
  std::vector<float> seen(64 * 1024);
  ASSERT_TRUE(c.clients[1]->Pull(1, RowRange{0, 64}, seen).ok());
  for (std::size_t i = 0; i < seen.size(); i += 1000) {
    ASSERT_EQ(seen[i], 0.0f) << "float " << i << ": applied before the backup held it";
  }
  ASSERT_TRUE(transport::fake::ReleaseHeldOps(*primary_ep).ok());
  ASSERT_TRUE(transport::fake::SetFaults(*primary_ep, {}).ok());
  ASSERT_TRUE(Eventually([&] { return c.clients[0]->Flush().ok(); }));
  ASSERT_TRUE(c.clients[1]->Pull(1, RowRange{0, 64}, seen).ok());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    ASSERT_EQ(seen[i], i < 8 * 1024 ? 2.0f : 0.0f) << "float " << i;
  }
  Server& p = *c.primaries[0];
  Server& b = *c.backups[0];
  EXPECT_GE(p.stats().log_records, 7u);  // 2 x 3 data slots and the Clock
  ASSERT_TRUE(Eventually([&] { return b.stats().log_records == p.stats().log_records; }));
  std::vector<float> prow, pstate, brow, bstate;
  ASSERT_TRUE(internal::TEST_ShardState(p, 1, &prow, &pstate).ok());
  ASSERT_TRUE(internal::TEST_ShardState(b, 1, &brow, &bstate).ok());
  ASSERT_EQ(prow.size(), brow.size());
  EXPECT_EQ(std::memcmp(prow.data(), brow.data(), prow.size() * 4), 0);
  EXPECT_EQ(b.stats().protocol_errors, 0u);
}

// The backup's log ring holds two push rings' worth of records: with the
// backup's apply held, a worker still gets 2 * push_slots - 1 single-slot
// pushes acknowledged without the primary waiting for a free record (no
// credit READ; with a ring of push_slots records the Flush would wait
// out its deadline). Released, the backup applies every one.
TEST(ReplicationFakeTest, LogRingHoldsTwoPushRingsAheadOfTheBackupsApply) {
  Replicated c;
  Start(&c, "fake", 1, 1, {MakeTable(1, "count", 8, 4)});
  ASSERT_FALSE(HasFatalFailure());
  Server& p = *c.primaries[0];
  Server& b = *c.backups[0];
  internal::TEST_PauseApply(b, true);
  const std::uint32_t push_slots = 8;  // MakeServerOptions'
  const std::vector<float> one(4, 1.0f);
  for (std::uint32_t i = 0; i + 1 < 2 * push_slots; ++i) {
    const Status pushed = c.clients[0]->Push(1, RowRange{0, 1}, one);
    ASSERT_TRUE(pushed.ok()) << pushed;
  }
  const Status flushed = c.clients[0]->Flush();
  EXPECT_TRUE(flushed.ok()) << flushed;
  EXPECT_EQ(p.stats().log_credit_reads, 0u);
  EXPECT_GE(p.stats().log_records, 2 * push_slots - 1);
  EXPECT_EQ(p.stats().log_writes, p.stats().log_records);
  internal::TEST_PauseApply(b, false);
  ASSERT_TRUE(Eventually([&] { return b.stats().log_records == p.stats().log_records; }));
  std::vector<float> local;
  ASSERT_TRUE(b.ReadLocal(1, RowRange{0, 1}, &local).ok());
  EXPECT_EQ(local[0], -static_cast<float>(2 * push_slots - 1));
}

// The primary is cut off from its backup but stays alive: the decider lets
// exactly one of them go on, the other acknowledges nothing more, and the
// worker's pushes all land once on the one that goes on.
TEST(ReplicationFakeTest, DroppedLinkLeavesOnePrimary) {
  Replicated c;
  Start(&c, "fake", 1, 1, {MakeTable(1, "count", 8, 2)});
  ASSERT_FALSE(HasFatalFailure());
  Client& cl = *c.clients[0];
  const std::vector<float> minus_one(8 * 2, -1.0f);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(cl.Push(1, RowRange{0, 8}, minus_one).ok());
  ASSERT_TRUE(cl.Flush().ok());
  // The backup holds all 10 once the Flush returned, but applies them on
  // its own time: a loser's count read below must not still be moving.
  ASSERT_TRUE(Eventually([&] { return c.backups[0]->stats().pushes_applied == 10; }));
  ASSERT_TRUE(transport::fake::DropConnection(*internal::TEST_ServerEndpoint(*c.primaries[0]),
                                              internal::kBackupPeerBase + 0)
                  .ok());
  ASSERT_TRUE(Eventually([&] {
    auto a = c.decider->Current(0);
    return a.ok() && a->epoch == 2;
  }));
  const ShardAssignment a = *c.decider->Current(0);
  const bool backup_won = a.primary == c.backups[0]->address();
  Server& winner = backup_won ? *c.backups[0] : *c.primaries[0];
  Server& loser = backup_won ? *c.primaries[0] : *c.backups[0];
  // A losing backup may still be applying the records it got before the
  // drop (all 10: the Flush saw them held), never one more.
  if (!backup_won) {
    ASSERT_TRUE(Eventually([&] { return loser.stats().pushes_applied >= 10; }));
  }
  const std::uint64_t loser_applied = loser.stats().pushes_applied;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(cl.Push(1, RowRange{0, 8}, minus_one).ok()) << "push " << i;
  }
  ASSERT_TRUE(cl.Flush().ok());
  std::vector<float> rows(8 * 2);
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 8}, rows).ok());
  EXPECT_EQ(rows[0], 20.0f);
  std::vector<float> local;
  ASSERT_TRUE(winner.ReadLocal(1, RowRange{0, 8}, &local).ok());
  EXPECT_EQ(local[0], 20.0f);
  EXPECT_EQ(loser.stats().pushes_applied, loser_applied) << "the loser went on applying";
  ASSERT_TRUE(loser.ReadLocal(1, RowRange{0, 8}, &local).ok());
  EXPECT_LE(local[0], 10.0f);
  EXPECT_EQ(cl.stats().failovers, backup_won ? 1u : 0u);
}

TEST(ReplicationOptionsTest, RefusedWithTheFix) {
  ServerOptions o = MakeServerOptions("fake", 0, 1, 1, {MakeTable(1, "t", 4, 1)});
  o.replicas = 3;
  auto s = Server::Start(o);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("must be 1 or 2"), std::string::npos) << s.status();
  o.replicas = 2;
  o.log_busy_poll = std::chrono::microseconds(-1);
  s = Server::Start(o);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("log_busy_poll -1 us is negative"), std::string::npos)
      << s.status();
  o.log_busy_poll = std::chrono::microseconds(0);
  s = Server::Start(o);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("failover is not set"), std::string::npos) << s.status();
  o.failover = NewEmbeddedFailoverDecider();
  s = Server::Start(o);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("backup_address is empty"), std::string::npos) << s.status();
  o.replicas = 1;
  o.replica_role = ReplicaRole::kBackup;
  s = Server::Start(o);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
}

TEST(FailoverDeciderTest, OneDecisionPerEpoch) {
  auto d = NewEmbeddedFailoverDecider();
  ASSERT_TRUE(d->Register(0, "p", "b").ok());
  EXPECT_EQ(d->Register(0, "x", "b").status().code(), StatusCode::kFailedPrecondition);
  // Both survivors report the same epoch: the first one wins, the second
  // learns it lost.
  auto promoted = d->ReportPrimaryLost(0, 1, "b");
  ASSERT_TRUE(promoted.ok());
  EXPECT_EQ(promoted->primary, "b");
  EXPECT_EQ(promoted->epoch, 2u);
  auto late = d->ReportBackupLost(0, 1, "p");
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->primary, "b") << "a fenced primary must not be told to go on";
  EXPECT_EQ(late->epoch, 2u);
  // A stale report of epoch 1 changes nothing.
  EXPECT_EQ(d->ReportPrimaryLost(0, 1, "b")->epoch, 2u);
  auto w = d->WaitForEpochAfter(0, 1, SteadyClock::now());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->epoch, 2u);
  EXPECT_EQ(d->WaitForEpochAfter(0, 2, SteadyClock::now() + milliseconds(10)).status().code(),
            StatusCode::kTimedOut);
  EXPECT_EQ(d->Current(7).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace rdmaps::testing

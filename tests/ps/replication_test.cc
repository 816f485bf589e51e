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
#include "src/ps/test_hooks.h"
#include "tests/ps/ps_test_util.h"
#include "transport/fake/fake_transport.h"

namespace rdmaps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

struct Replicated {
  std::shared_ptr<FailoverDecider> decider = NewEmbeddedFailoverDecider();
  std::vector<std::unique_ptr<Server>> primaries, backups;
  std::vector<std::string> addresses;  // the primaries' at start
  std::vector<std::unique_ptr<Client>> clients;
};

// Per shard a backup, then its primary; then the workers.
void Start(Replicated* c, const std::string& transport, std::uint32_t S, std::uint32_t W,
           const std::vector<TableOptions>& tables, milliseconds wait_timeout = seconds(20)) {
  for (std::uint32_t i = 0; i < S; ++i) {
    ServerOptions b = MakeServerOptions(transport, i, S, W, tables);
    b.replicas = 2;
    b.replica_role = ReplicaRole::kBackup;
    b.failover = c->decider;
    b.exit_when_workers_done = false;
    auto backup = Server::Start(b);
    ASSERT_TRUE(backup.ok()) << backup.status();
    ServerOptions p = MakeServerOptions(transport, i, S, W, tables);
    p.replicas = 2;
    p.backup_address = (*backup)->address();
    p.failover = c->decider;
    p.exit_when_workers_done = false;
    auto primary = Server::Start(p);
    ASSERT_TRUE(primary.ok()) << primary.status();
    c->addresses.push_back((*primary)->address());
    c->backups.push_back(std::move(backup).value());
    c->primaries.push_back(std::move(primary).value());
  }
  for (std::uint32_t w = 0; w < W; ++w) {
    ClientOptions o = MakeClientOptions(transport, w, W, c->addresses);
    o.failover = c->decider;
    o.wait_timeout = wait_timeout;
    auto cl = Client::Connect(o);
    ASSERT_TRUE(cl.ok()) << cl.status();
    c->clients.push_back(std::move(cl).value());
  }
}

// Polls `done` until it holds; false at the deadline.
template <typename F>
bool Eventually(F done, milliseconds timeout = seconds(20)) {
  const auto deadline = SteadyClock::now() + timeout;
  while (!done()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

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

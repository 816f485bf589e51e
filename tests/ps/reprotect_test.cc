// Re-protection (docs/ps.md, "Re-protection"): after a failover the shard
// runs with one copy; a replacement backup (ServerOptions::
// rejoin_as_backup_of) copies it from the new primary while the workers
// keep pushing, catches up from the log, and becomes the backup (a new
// epoch): its rows and optimizer state equal the primary's bit for bit,
// and a kill of the primary then fails over to it with no acknowledged
// push lost. A replacement killed during its catch-up leaves the primary
// serving alone. On fake and tcp; ps_reprotect_verbs_test (built with
// RDMAPS_REPROTECT_VERBS) runs the same on verbs in the Soft-RoCE VM
// (tests/vm/failover_in_vm.sh) and skips with the reason elsewhere.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "rdmaps/failover.h"
#include "src/ps/test_hooks.h"
#include "tests/ps/eventually.h"
#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

using rdmaps::testing::Eventually;

constexpr std::uint32_t kRows = 64, kDim = 4;

std::vector<TableOptions> Tables() {
  // "count": SGD lr 1, every push adds 1 (the counting table); "adam": state
  // beside the rows, which the replacement must copy and then keep equal.
  return {MakeTable(1, "count", kRows, kDim),
          MakeTable(2, "adam", 100, 16, kAsp, Initializer::Normal(0, 0.1f, 5),
                    OptimizerOptions::Adam(0.01f))};
}

class Job {
 public:
  explicit Job(std::string transport) : transport_(std::move(transport)) {}
  // A failed ASSERT leaves pushing threads: they end (their calls fail or
  // finish within wait_timeout) before the clients and servers go.
  ~Job() {
    for (auto& t : threads) t.join();
  }

  // One shard: a backup, then its primary; then W workers.
  void Start(std::uint32_t W) {
    ServerOptions b = Options(ReplicaRole::kBackup);
    auto backup = Server::Start(b);
    ASSERT_TRUE(backup.ok()) << backup.status();
    ServerOptions p = Options(ReplicaRole::kPrimary);
    p.backup_address = (*backup)->address();
    auto primary = Server::Start(p);
    ASSERT_TRUE(primary.ok()) << primary.status();
    servers.push_back(std::move(primary).value());
    servers.push_back(std::move(backup).value());
    for (std::uint32_t w = 0; w < W; ++w) {
      auto cl = Connect(w, servers[0]->address());
      ASSERT_TRUE(cl.ok()) << cl.status();
      clients.push_back(std::move(cl).value());
    }
  }

  // Worker w's Client at the shard's server `address` (elastic: it joins
  // when w is not a member).
  Result<std::unique_ptr<Client>> Connect(std::uint32_t w, const std::string& address) {
    ClientOptions o = MakeClientOptions(transport_, w, 2, {address});
    o.max_workers = max_workers;
    o.failover = decider;
    o.wait_timeout = seconds(20);
    return Client::Connect(o);
  }

  Result<std::unique_ptr<Server>> StartReplacement(const std::string& primary) {
    ServerOptions r = Options(ReplicaRole::kBackup);
    r.rejoin_as_backup_of = primary;
    return Server::Start(r);
  }

  // Worker threads each pushing `iters` times (-1 to rows [0, 64) of
  // "count", 1 more to row 3, an Adam push), with Clock and Flush.
  void Push(int iters) {
    for (std::size_t w = 0; w < clients.size(); ++w) {
      threads.emplace_back([this, w, iters] {
        Client& cl = *clients[w];
        const std::vector<float> minus_one(kRows * kDim, -1.0f);
        const std::vector<std::uint64_t> ids = {3};
        std::vector<float> g(100 * 16);
        Status st;
        for (int it = 0; it < iters && st.ok(); ++it) {
          for (std::size_t i = 0; i < g.size(); ++i) g[i] = float((i * 7 + it + w) % 13) - 6;
          st = cl.Push(1, RowRange{0, kRows}, minus_one);
          if (st.ok()) st = cl.Push(1, ids, {minus_one.data(), kDim});
          if (st.ok()) st = cl.Push(2, RowRange{0, 100}, g);
          if (st.ok() && it % 8 == 7) st = cl.Clock().status();
          if (st.ok() && it % 16 == 15) st = cl.Flush();
        }
        if (st.ok()) st = cl.Flush();
        SetResult(w, st);
        pushed_ += iters;
      });
    }
  }
  void Join() {
    for (auto& t : threads) t.join();
    threads.clear();
    for (std::size_t w = 0; w < results_.size(); ++w) {
      ASSERT_TRUE(results_[w].ok()) << "worker " << w << ": " << results_[w];
    }
  }
  // Every row of "count" equals the pushes made: none lost, none twice.
  void ExpectCounted() {
    std::vector<float> rows(kRows * kDim);
    ASSERT_TRUE(clients[0]->Pull(1, RowRange{0, kRows}, rows).ok());
    const float n = float(pushed_.load());
    for (std::uint32_t r = 0; r < kRows; ++r) {
      for (std::uint32_t d = 0; d < kDim; ++d) {
        ASSERT_EQ(rows[r * kDim + d], r == 3 ? 2 * n : n) << "row " << r;
      }
    }
  }

  // `iters` more pushes per worker, during which `primary` dies once it
  // applied `applied` more: `heir` must take over at `epoch` with every
  // acknowledged push.
  void KillDuringPushes(Server& primary, int iters, std::uint64_t applied, const Server& heir,
                        std::uint64_t epoch) {
    const std::uint64_t before = primary.stats().pushes_applied;
    Push(iters);
    ASSERT_TRUE(Eventually([&] { return primary.stats().pushes_applied >= before + applied; }));
    internal::TEST_Kill(primary);
    Join();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    ExpectCounted();
    auto a = decider->Current(0);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->epoch, epoch);
    EXPECT_EQ(a->primary, heir.address());
  }

  std::shared_ptr<FailoverDecider> decider = NewEmbeddedFailoverDecider();
  std::uint32_t max_workers = 0;                 // elastic: worker slots (before Start)
  std::vector<std::unique_ptr<Server>> servers;  // [0] primary, [1] backup, then replacements
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::thread> threads;

 private:
  ServerOptions Options(ReplicaRole role) {
    ServerOptions o = MakeServerOptions(transport_, 0, 1, 2, Tables());
    o.max_workers = max_workers;
    o.replicas = 2;
    o.replica_role = role;
    o.failover = decider;
    o.exit_when_workers_done = false;
    return o;
  }
  void SetResult(std::size_t w, const Status& st) {
    // (Each worker thread writes only its own entry.)
    results_[w] = st;
  }

  std::string transport_;
  std::vector<Status> results_ = std::vector<Status>(4);
  std::atomic<int> pushed_{0};
};

// Both servers' rows and optimizer state of every table, compared.
bool SameState(Server& a, Server& b, std::string* diff) {
  for (std::uint32_t table : {1u, 2u}) {
    std::vector<float> ar, as, br, bs;
    if (!internal::TEST_ShardState(a, table, &ar, &as).ok() ||
        !internal::TEST_ShardState(b, table, &br, &bs).ok()) {
      *diff = "no state";
      return false;
    }
    if (ar.size() != br.size() || as.size() != bs.size() ||
        std::memcmp(ar.data(), br.data(), ar.size() * 4) != 0 ||
        (!as.empty() && std::memcmp(as.data(), bs.data(), as.size() * 4) != 0)) {
      *diff = "table " + std::to_string(table) + " differs";
      return false;
    }
  }
  return true;
}

class ReprotectTest : public ::testing::TestWithParam<PsBackend> {
 protected:
  void SetUp() override {
    if (const std::string why = SkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  const std::string& transport() const { return GetParam().transport; }
};

TEST_P(ReprotectTest, ReplacementCatchesUpBecomesBackupAndTakesOver) {
  Job job(transport());
  job.Start(2);
  ASSERT_FALSE(HasFatalFailure());
  // 1. The primary dies under load; the backup serves alone (epoch 2).
  job.Push(80);
  Server& first = *job.servers[0];
  ASSERT_TRUE(Eventually([&] { return first.stats().pushes_applied >= 60; }));
  internal::TEST_Kill(first);
  ASSERT_TRUE(Eventually([&] {
    auto a = job.decider->Current(0);
    return a.ok() && a->epoch == 2;
  }));
  Server& promoted = *job.servers[1];
  ASSERT_EQ(job.decider->Current(0)->primary, promoted.address());
  // 2. A replacement copies the shard while the workers go on pushing.
  auto r = job.StartReplacement(promoted.address());
  ASSERT_TRUE(r.ok()) << r.status();
  Server& replacement = **r;
  job.servers.push_back(std::move(r).value());
  ASSERT_TRUE(Eventually([&] {
    auto a = job.decider->Current(0);
    return a.ok() && a->backup == replacement.address();
  })) << "the replacement never became the backup";
  const ShardAssignment protected_at = *job.decider->Current(0);
  EXPECT_EQ(protected_at.epoch, 3u);
  EXPECT_EQ(protected_at.primary, promoted.address());
  // (Counted just after the decision.)
  EXPECT_TRUE(Eventually([&] { return promoted.stats().reprotections == 1; }));
  EXPECT_GT(replacement.stats().catchup_bytes, 100u * 16 * 4 * 3);  // rows, m, v at least
  EXPECT_GT(replacement.stats().catchup_seconds, 0.0);
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  // 3. Equal bit for bit once it applied what the primary forwarded.
  std::string diff;
  ASSERT_TRUE(Eventually([&] { return SameState(promoted, replacement, &diff); })) << diff;
  EXPECT_EQ(replacement.stats().protocol_errors, 0u);
  // 4. More pushes, during which the new primary dies: the replacement
  //    takes over with every acknowledged push.
  job.KillDuringPushes(promoted, 80, 200, replacement, 4);
}

TEST_P(ReprotectTest, ReplacementKilledDuringCatchUpLeavesThePrimaryServing) {
  Job job(transport());
  job.Start(2);
  ASSERT_FALSE(HasFatalFailure());
  internal::TEST_Kill(*job.servers[0]);
  Server& promoted = *job.servers[1];
  // (The first push meets the dead primary and fails over.)
  job.Push(24);
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(job.decider->Current(0)->primary, promoted.address());
  const std::uint64_t epoch = job.decider->Current(0)->epoch;
  // The replacement copies and stashes but never gets in sync while held.
  internal::TEST_HoldCatchup(true);
  auto r = job.StartReplacement(promoted.address());
  ASSERT_TRUE(r.ok()) << r.status();
  // Pushes are acknowledged meanwhile (each waits for the candidate's ring,
  // which it drains into its stash).
  job.Push(24);
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ((*r)->stats().log_records, 0u) << "a held replacement applied records";
  EXPECT_EQ((*r)->stats().catchup_seconds, 0.0);
  EXPECT_EQ(job.decider->Current(0)->epoch, epoch) << "a candidate counted before it was in sync";
  EXPECT_TRUE(job.decider->Current(0)->backup.empty());
  internal::TEST_Kill(**r);
  internal::TEST_HoldCatchup(false);
  // The primary goes on alone; nothing is lost, nothing is decided.
  job.Push(24);
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  job.ExpectCounted();
  EXPECT_EQ(job.decider->Current(0)->epoch, epoch);
  EXPECT_EQ(promoted.stats().reprotections, 0u);
  // A second replacement succeeds.
  auto r2 = job.StartReplacement(promoted.address());
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_TRUE(Eventually([&] { return job.decider->Current(0)->backup == (*r2)->address(); }));
  EXPECT_EQ(job.decider->Current(0)->epoch, epoch + 1);
  std::string diff;
  ASSERT_TRUE(Eventually([&] { return SameState(promoted, **r2, &diff); })) << diff;
}

// The primary dies while the replacement is still catching up: the
// replacement is in no shard map, so it reports nothing (the map does not
// move), and its Run ends with the reason, so that a launcher starts
// another one rather than wait for it. The workers' calls fail at once.
TEST_P(ReprotectTest, PrimaryLostDuringCatchUpEndsTheReplacementsRun) {
  Job job(transport());
  job.Start(2);
  ASSERT_FALSE(HasFatalFailure());
  internal::TEST_Kill(*job.servers[0]);
  job.Push(8);
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  Server& promoted = *job.servers[1];
  const ShardAssignment alone = *job.decider->Current(0);
  ASSERT_EQ(alone.primary, promoted.address());
  internal::TEST_HoldCatchup(true);
  auto r = job.StartReplacement(promoted.address());
  ASSERT_TRUE(r.ok()) << r.status();
  internal::TEST_Kill(promoted);
  const Status run = (*r)->RunUntil(SteadyClock::now() + seconds(20));
  internal::TEST_HoldCatchup(false);
  EXPECT_EQ(run.code(), StatusCode::kFailedPrecondition) << run;
  EXPECT_NE(run.message().find("re-protection failed"), std::string::npos) << run;
  auto now = job.decider->Current(0);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->epoch, alone.epoch) << "a replacement not in the map decided something";
  EXPECT_EQ(now->primary, promoted.address());
  // The shard's last copy is gone: a worker's call fails at once, naming
  // why, instead of waiting out its deadline for a promotion nobody can make.
  const Status bye = job.clients[0]->Close();
  EXPECT_EQ(bye.code(), StatusCode::kUnavailable) << bye;
  EXPECT_NE(bye.message().find("has no backup"), std::string::npos) << bye;
}

// Elastic (4 worker slots, 2 initial members): the membership the primary
// decided (a joiner that left gracefully, one that died) is in the
// snapshot, and what changes during and after the catch-up (a fresh worker
// in the dead one's slot) comes through the log: the replacement's members,
// membership epoch, barrier counts and worker words equal the primary's,
// and it serves them once promoted.
TEST_P(ReprotectTest, ElasticMembershipIsCopiedAndKeptEqual) {
  Job job(transport());
  job.max_workers = 4;
  job.Start(2);
  ASSERT_FALSE(HasFatalFailure());
  Server& first = *job.servers[0];
  // Worker 2 joins, pushes, leaves gracefully; worker 3 joins and dies.
  {
    auto w2 = job.Connect(2, first.address());
    ASSERT_TRUE(w2.ok()) << w2.status();
    job.clients.push_back(std::move(w2).value());
    job.Push(8);
    job.Join();
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(job.clients[2]->Close().ok());
    job.clients.pop_back();
    auto w3 = job.Connect(3, first.address());
    ASSERT_TRUE(w3.ok()) << w3.status();
    internal::TEST_Abandon(**w3);  // kill -9 of the worker
  }
  ASSERT_TRUE(Eventually([&] {
    const auto dead = first.stats().dead_workers;
    return first.stats().members == 2 && dead.size() == 1 && dead[0] == 3;
  })) << internal::TEST_MembershipImage(first);
  // The primary dies under the members' pushes; the backup serves alone.
  const std::uint64_t before = first.stats().pushes_applied;
  job.Push(30);
  ASSERT_TRUE(Eventually([&] { return first.stats().pushes_applied >= before + 40; }));
  internal::TEST_Kill(first);
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  Server& promoted = *job.servers[1];
  ASSERT_EQ(job.decider->Current(0)->primary, promoted.address());
  // A replacement copies the shard while the members push.
  job.Push(30);
  auto r = job.StartReplacement(promoted.address());
  ASSERT_TRUE(r.ok()) << r.status();
  Server& replacement = **r;
  job.servers.push_back(std::move(r).value());
  ASSERT_TRUE(Eventually([&] { return job.decider->Current(0)->backup == replacement.address(); }))
      << "the replacement never became the backup";
  job.Join();
  ASSERT_FALSE(HasFatalFailure());
  std::string diff;
  ASSERT_TRUE(Eventually([&] {
    return internal::TEST_MembershipImage(promoted) == internal::TEST_MembershipImage(replacement);
  })) << "primary:     "
      << internal::TEST_MembershipImage(promoted)
      << "\nreplacement: " << internal::TEST_MembershipImage(replacement);
  ASSERT_TRUE(Eventually([&] { return SameState(promoted, replacement, &diff); })) << diff;
  EXPECT_EQ(replacement.stats().members, 2u);
  EXPECT_EQ(replacement.stats().membership_epoch, promoted.stats().membership_epoch);
  EXPECT_EQ(replacement.stats().dead_workers, std::vector<std::uint32_t>{3});
  const std::string image = internal::TEST_MembershipImage(replacement);
  EXPECT_NE(image.find("w2{state 2 epoch 1 barriers 0 joined seq"), std::string::npos) << image;
  EXPECT_NE(image.find("w3{state 2 epoch 3 barriers 0 joined died seq"), std::string::npos)
      << image;
  // A fresh worker takes the dead one's slot on the primary (through the
  // log on the replacement); then the primary dies too: the replacement
  // serves the three members with every acknowledged push.
  auto fresh = job.Connect(3, promoted.address());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  job.clients.push_back(std::move(fresh).value());
  job.KillDuringPushes(promoted, 30, 60, replacement, 4);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(replacement.stats().members, 3u);
  EXPECT_EQ(replacement.stats().protocol_errors, 0u);
}

#ifdef RDMAPS_REPROTECT_VERBS
INSTANTIATE_TEST_SUITE_P(Verbs, ReprotectTest, ::testing::Values(VerbsBackend()), PsBackendName);
#else
INSTANTIATE_TEST_SUITE_P(Transports, ReprotectTest, ::testing::Values(FakeBackend(), TcpBackend()),
                         PsBackendName);
#endif

#ifndef RDMAPS_REPROTECT_VERBS
TEST(ReprotectOptionsTest, RefusedWithTheFix) {
  ServerOptions o = MakeServerOptions("fake", 0, 1, 1, {MakeTable(1, "t", 4, 1)});
  o.rejoin_as_backup_of = "fake:1";
  auto s = Server::Start(o);
  ASSERT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("replica_role is not kBackup"), std::string::npos)
      << s.status();
}

// A replacement for a server that is not a serving primary (an unpromoted
// backup) is refused with the reason, at Start.
TEST(ReprotectFakeTest, RefusedByABackupThatDoesNotServe) {
  Job job("fake");
  job.Start(2);
  ASSERT_FALSE(HasFatalFailure());
  auto r = job.StartReplacement(job.servers[1]->address());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("refused"), std::string::npos) << r.status();
}
#endif

}  // namespace
}  // namespace rdmaps::testing

// A primary that hangs with its connections open (SIGSTOP, a long pause)
// and is replaced by its backup (docs/ps.md, "Replication and failover",
// "A primary that hangs"): the workers blocked on it follow the promotion
// well before any op or wait timeout, every push applied exactly once; a
// worker that connects while a primary is dead reaches the promoted backup,
// or fails at connect_timeout naming both. On fake and tcp.
//
// The hang: TEST_Hang (the primary applies, forwards and acknowledges
// nothing more, asks the decider nothing, keeps its connections open) and,
// on fake, every op against its memory held in flight (a READ or WRITE that
// never completes, as on a stopped process); its lease then lapses and the
// backup drops it (TEST_PrimaryLeaseLost, what the callback of
// FailoverDecider::WatchPrimary does; on fake the knob that breaks their
// connection at both ends). Real processes and a real SIGSTOP:
// tests/cluster/hung_primary_process_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/failover.h"
#include "rdmaps/server.h"
#include "src/ps/replication.h"
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

constexpr std::uint32_t kTable = 1;
constexpr std::uint64_t kRows = 16;  // rows [0, 8) on server 0, [8, 16) on server 1
constexpr std::uint32_t kDim = 4;

// No op or wait of a worker may end by its timeout in these tests: each
// would take this long, far above what following a promotion takes.
constexpr auto kWaitTimeout = seconds(20);
// Following a promotion: the shard map is looked at every 100 ms, then the
// worker reconnects and resends; generous for a loaded machine, still far
// below kWaitTimeout and the transport's op_timeout (30 s).
constexpr auto kFollowBound = seconds(6);

using Replicated = ReplicatedCluster;

// Per shard a backup, then its primary; then `connect` of the W workers.
void Start(Replicated* c, const std::string& transport, std::uint32_t S, std::uint32_t W,
           std::uint32_t connect, std::uint32_t staleness) {
  c->transport = transport;
  c->wait_timeout = kWaitTimeout;
  c->StartShards(S, W, {MakeTable(kTable, "count", kRows, kDim, staleness)});
  if (::testing::Test::HasFatalFailure()) return;
  c->ConnectWorkers(connect, W);
}

// Elastic, `shards` shards, BSP: `initial` of `max` worker slots connected
// (their Clock() does not wait), the promoted backup's reconnect window
// `window`.
void StartElastic(Replicated* c, const std::string& transport, std::uint32_t initial,
                  std::uint32_t max, milliseconds window, std::uint32_t shards = 1) {
  c->transport = transport;
  c->wait_timeout = kWaitTimeout;
  c->StartShards(shards, initial, {MakeTable(kTable, "count", kRows, kDim, 0)},
                 [&](ServerOptions& o) {
                   o.max_workers = max;
                   o.failover_reconnect_window = window;  // (used by a promoted backup)
                 });
  if (::testing::Test::HasFatalFailure()) return;
  c->ConnectWorkers(initial, initial, [&](ClientOptions& o) {
    o.max_workers = max;
    o.clock_waits = false;
  });
}

// Hangs the primary of `shard` with its connections open (on fake, every
// op against its memory is held in flight, never completed); its lease
// then lapses and its backup drops it: on fake by the knob that breaks
// their connection at both ends, on tcp as the lease watch does.
void HangPrimary(Replicated& c, std::uint32_t shard) {
  Server& p = *c.primaries[shard];
  internal::TEST_Hang(p);
  if (c.transport == "fake") {
    transport::Endpoint& ep = *internal::TEST_ServerEndpoint(p);
    transport::fake::Faults hold;
    hold.inbound = true;  // the workers' ops against its memory
    hold.hold_until_released = true;
    ASSERT_TRUE(transport::fake::SetFaults(ep, hold).ok());
    ASSERT_TRUE(transport::fake::DropConnection(ep, internal::kBackupPeerBase + shard).ok());
  } else {
    internal::TEST_PrimaryLeaseLost(*c.backups[shard]);
  }
}

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

class HungPrimaryTest : public ::testing::TestWithParam<std::string> {};

// Two workers train (push -1 on every row, Clock, pull) under BSP or SSP
// while the primary of shard 1 hangs: each call that meets it (a push
// waiting for its completion or credit, Clock, the pull's wait for the
// other worker's clock, its READs) follows the promotion; the run ends
// with the exact count and no call near a timeout.
void TrainThroughAHang(const std::string& transport, std::uint32_t staleness) {
  constexpr std::uint32_t W = 2;
  constexpr int kIters = 40, kHangAt = 10;
  Replicated c;
  Start(&c, transport, 2, W, W, staleness);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<Status> results(W);
  std::vector<double> max_call_ms(W, 0);
  std::atomic<int> progress{0};  // iterations worker 0 has done
  std::vector<std::thread> workers;
  for (std::uint32_t w = 0; w < W; ++w) {
    workers.emplace_back([&, w] {
      Client& cl = *c.clients[w];
      const std::vector<float> minus_one(kRows * kDim, -1.0f);
      std::vector<float> out(kRows * kDim);
      auto timed = [&](auto&& call) {
        const auto t0 = SteadyClock::now();
        Status st = call();
        max_call_ms[w] = std::max(max_call_ms[w], Ms(SteadyClock::now() - t0));
        return st;
      };
      for (int it = 0; it < kIters && results[w].ok(); ++it) {
        results[w] = timed([&] { return cl.Push(kTable, RowRange{0, kRows}, minus_one); });
        if (results[w].ok()) results[w] = timed([&] { return cl.Clock().status(); });
        if (results[w].ok()) {
          results[w] = timed([&] { return cl.Pull(kTable, RowRange{0, kRows}, out); });
        }
        if (w == 0) progress.store(it + 1);
      }
      if (results[w].ok()) results[w] = timed([&] { return cl.Flush(); });
    });
  }
  const bool reached = Eventually([&] { return progress.load() >= kHangAt; });
  HangPrimary(c, 1);
  for (auto& t : workers) t.join();
  ASSERT_TRUE(reached);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (std::uint32_t w = 0; w < W; ++w) {
    ASSERT_TRUE(results[w].ok()) << "worker " << w << ": " << results[w];
    EXPECT_LT(max_call_ms[w], Ms(kFollowBound)) << "worker " << w << " waited out a timeout";
    EXPECT_EQ(c.clients[w]->stats().failovers, 1u) << "worker " << w;
  }
  auto a = c.decider->Current(1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->epoch, 2u);
  EXPECT_EQ(a->primary, c.backups[1]->address());
  // Exactly once: every row counts every push of both workers.
  std::vector<float> out(kRows * kDim);
  ASSERT_TRUE(c.clients[0]->Pull(kTable, RowRange{0, kRows}, out).ok());
  for (std::size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], float{W * kIters}) << "float " << i << " (row " << i / kDim << ")";
  }
  std::vector<float> local;
  ASSERT_TRUE(c.backups[1]->ReadLocal(kTable, RowRange{8, 8}, &local).ok());
  for (float v : local) ASSERT_EQ(v, float{W * kIters});
}

TEST_P(HungPrimaryTest, BspTrainingFollowsThePromotion) { TrainThroughAHang(GetParam(), 0); }
TEST_P(HungPrimaryTest, SspTrainingFollowsThePromotion) { TrainThroughAHang(GetParam(), 2); }

// A worker blocked in a BSP pull (waiting for the other worker's clock)
// when the primary it polls hangs: the pull completes at the new primary
// once the other worker's Clock reaches it, well before wait_timeout.
TEST_P(HungPrimaryTest, PullBlockedOnAHungPrimaryCompletesAtTheNewOne) {
  Replicated c;
  Start(&c, GetParam(), 1, 2, 0, /*staleness=*/0);
  ASSERT_FALSE(HasFatalFailure());
  // Worker 0's pull, not its Clock(), waits for worker 1; worker 1's
  // Clock() waits (and so meets the hung primary, fails over and resends
  // its clock there).
  c.ConnectWorkers(1, 2, [](ClientOptions& o) { o.clock_waits = false; });
  ASSERT_FALSE(HasFatalFailure());
  c.ConnectWorkers(1, 2);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<float> minus_one(kRows * kDim, -1.0f);
  for (auto& cl : c.clients) ASSERT_TRUE(cl->Push(kTable, RowRange{0, kRows}, minus_one).ok());
  // At clock 1 worker 0's BSP pull needs worker 1 at clock 1.
  Status pulled;
  double pull_ms = 0;
  std::thread t([&] {
    Client& cl = *c.clients[0];
    Result<std::uint64_t> clk = cl.Clock();
    if (!clk.ok()) {
      pulled = clk.status();
      return;
    }
    std::vector<float> out(kRows * kDim);
    const auto t0 = SteadyClock::now();
    pulled = cl.Pull(kTable, RowRange{0, kRows}, out);
    pull_ms = Ms(SteadyClock::now() - t0);
    if (pulled.ok() && out[0] != 2.0f) pulled = InternalError("pulled " + std::to_string(out[0]));
  });
  // Worker 0 is waiting once its pull has polled the control block in vain.
  const bool waiting =
      Eventually([&] { return c.clients[0]->stats().pull_waits > 0; }, seconds(20));
  const auto hung_at = SteadyClock::now();
  HangPrimary(c, 0);
  ASSERT_FALSE(HasFatalFailure());
  // Worker 1 catches up; its Clock meets the hung primary and follows too.
  const Result<std::uint64_t> clocked = c.clients[1]->Clock();
  t.join();
  ASSERT_TRUE(waiting) << "worker 0's pull never waited";
  ASSERT_TRUE(clocked.ok()) << clocked.status();
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_LT(Ms(SteadyClock::now() - hung_at), Ms(kFollowBound));
  EXPECT_LT(pull_ms, Ms(kFollowBound)) << "the pull waited out a timeout";
  EXPECT_EQ(c.clients[0]->stats().failovers, 1u);
  EXPECT_EQ(c.decider->Current(0)->primary, c.backups[0]->address());
}

// Connect while the primary of shard 0 is dead and its backup not yet
// promoted: at connect_timeout the error names the shard map's primary and
// backup; once the backup is promoted, a Connect that began before reaches
// it, and its pushes count exactly once.
TEST_P(HungPrimaryTest, ConnectReachesThePromotedBackup) {
  Replicated c;
  Start(&c, GetParam(), 2, 2, 1, kAsp);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<float> minus_one(kRows * kDim, -1.0f);
  ASSERT_TRUE(c.clients[0]->Push(kTable, RowRange{0, kRows}, minus_one).ok());
  ASSERT_TRUE(c.clients[0]->Flush().ok());
  // The backup takes no notice of the death while its apply thread is
  // paused (the log connection's drop is a notification it applies).
  ASSERT_TRUE(Eventually([&] { return c.backups[0]->stats().pushes_applied == 1; }));
  internal::TEST_PauseApply(*c.backups[0], true);
  internal::TEST_Kill(*c.primaries[0]);
  ClientOptions o = c.WorkerOptions(1, 2);
  o.connect_timeout = milliseconds(1000);
  auto refused = Client::Connect(o);
  ASSERT_FALSE(refused.ok());
  const std::string msg = refused.status().message();
  EXPECT_NE(msg.find("neither answered before connect_timeout"), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.addresses[0]), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.backups[0]->address()), std::string::npos) << msg;

  o.connect_timeout = seconds(20);
  Result<std::unique_ptr<Client>> late = UnavailableError("not run");
  std::atomic<bool> begun{false};
  std::thread t([&] {
    begun.store(true);
    late = Client::Connect(o);
  });
  ASSERT_TRUE(Eventually([&] { return begun.load(); }));
  internal::TEST_PauseApply(*c.backups[0], false);  // promoted now
  t.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(c.decider->Current(0)->primary, c.backups[0]->address());
  ASSERT_TRUE((*late)->Push(kTable, RowRange{0, kRows}, minus_one).ok());
  ASSERT_TRUE((*late)->Flush().ok());
  std::vector<float> out(kRows * kDim);
  ASSERT_TRUE((*late)->Pull(kTable, RowRange{0, kRows}, out).ok());
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 2.0f) << "float " << i;
}

// Elastic: worker 1 dies together with the primary (killed first, so the
// death is never forwarded): the promoted backup still has it as a member
// at its clock, and worker 0's BSP pull there waits for it until the
// backup's failover_reconnect_window ends; then worker 1 leaves as dead
// (membership epoch + 1, named in dead_workers), worker 0, which came
// within the window, stays a member, and its pull completes.
TEST_P(HungPrimaryTest, ElasticWorkerThatDiedWithItsPrimaryLeavesThePromotedBackup) {
  constexpr std::uint32_t kInitial = 2, kMax = 3;
  constexpr auto kWindow = seconds(2);
  Replicated c;
  StartElastic(&c, GetParam(), kInitial, kMax, kWindow);
  ASSERT_FALSE(HasFatalFailure());
  const std::vector<float> minus_one(kRows * kDim, -1.0f);
  std::vector<float> out(kRows * kDim);
  for (auto& cl : c.clients) {
    ASSERT_TRUE(cl->Push(kTable, RowRange{0, kRows}, minus_one).ok());
    ASSERT_TRUE(cl->Clock().ok());
  }
  ASSERT_TRUE(c.clients[0]->Pull(kTable, RowRange{0, kRows}, out).ok());
  ASSERT_TRUE(c.clients[1]->Flush().ok());
  // The backup holds both workers' clocks (every slot is logged before it
  // is applied) before they die together.
  ASSERT_TRUE(Eventually([&] { return c.backups[0]->stats().min_clock == 1; }));
  const std::uint32_t epoch_before = c.backups[0]->stats().membership_epoch;
  internal::TEST_Kill(*c.primaries[0]);
  internal::TEST_Abandon(*c.clients[1]);
  // Worker 0 at clock 2 needs every member at clock 2.
  ASSERT_TRUE(c.clients[0]->Push(kTable, RowRange{0, kRows}, minus_one).ok());
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  const auto t0 = SteadyClock::now();
  const Status pulled = c.clients[0]->Pull(kTable, RowRange{0, kRows}, out);
  const auto waited = SteadyClock::now() - t0;
  ASSERT_TRUE(pulled.ok()) << pulled;
  EXPECT_LT(Ms(waited), Ms(kWindow + kFollowBound)) << "the pull waited out wait_timeout";
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 3.0f) << "float " << i;
  const ServerStats st = c.backups[0]->stats();
  EXPECT_EQ(st.members, 1u);
  EXPECT_GT(st.membership_epoch, epoch_before);
  EXPECT_EQ(st.dead_workers, std::vector<std::uint32_t>{1});
  EXPECT_EQ(c.decider->Current(0)->primary, c.backups[0]->address());
  // Worker 0 goes on alone under BSP.
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  ASSERT_TRUE(c.clients[0]->Pull(kTable, RowRange{0, kRows}, out).ok());
  c.clients.clear();
}

// Elastic: worker 1 is silent (a SIGSTOPped process: it makes no call and
// its connections stay open) through a failover and past the promoted
// backup's failover_reconnect_window, so it leaves the job as dead while
// worker 0 goes on. When it resumes (SIGCONT), its next call fails at once
// with FailedPrecondition naming the cause and the fix; its pushes the old
// primary acknowledged are in the state exactly once and the one it made
// after resuming is in it never; worker 0 never waits for it.
TEST_P(HungPrimaryTest, ElasticWorkerSilentPastTheReconnectWindowIsToldItLeft) {
  constexpr std::uint32_t kInitial = 2, kMax = 3;
  constexpr auto kWindow = milliseconds(500);
  Replicated c;
  StartElastic(&c, GetParam(), kInitial, kMax, kWindow);
  ASSERT_FALSE(HasFatalFailure());
  Server& backup = *c.backups[0];
  const std::vector<float> minus_one(kRows * kDim, -1.0f);
  std::vector<float> out(kRows * kDim);
  for (auto& cl : c.clients) {
    ASSERT_TRUE(cl->Push(kTable, RowRange{0, kRows}, minus_one).ok());
    ASSERT_TRUE(cl->Clock().ok());
    ASSERT_TRUE(cl->Flush().ok());  // acknowledged by the old primary
  }
  ASSERT_TRUE(Eventually([&] { return backup.stats().min_clock == 1; }));
  const std::uint32_t epoch_before = backup.stats().membership_epoch;
  internal::TEST_Kill(*c.primaries[0]);
  // Worker 0 follows the promotion; worker 1 makes no call from here on.
  ASSERT_TRUE(c.clients[0]->Push(kTable, RowRange{0, kRows}, minus_one).ok());
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  const auto t0 = SteadyClock::now();
  ASSERT_TRUE(c.clients[0]->Pull(kTable, RowRange{0, kRows}, out).ok());
  EXPECT_LT(Ms(SteadyClock::now() - t0), Ms(kWindow + kFollowBound));
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 3.0f) << "float " << i;
  ASSERT_TRUE(Eventually([&] { return backup.stats().members == 1; }));
  EXPECT_EQ(backup.stats().dead_workers, std::vector<std::uint32_t>{1});
  EXPECT_GT(backup.stats().membership_epoch, epoch_before);
  // Worker 1 resumes: its push goes to the dead primary, it follows the
  // map to the promoted backup, finds its slot departed, and stops there.
  const auto t1 = SteadyClock::now();
  Status st = c.clients[1]->Push(kTable, RowRange{0, kRows}, minus_one);
  if (st.ok()) st = c.clients[1]->Flush();
  EXPECT_LT(Ms(SteadyClock::now() - t1), Ms(kFollowBound));
  ASSERT_EQ(st.code(), StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("no member of the job"), std::string::npos) << st;
  EXPECT_NE(st.message().find("failover_reconnect_window"), std::string::npos) << st;
  EXPECT_NE(st.message().find("connect a new one"), std::string::npos) << st;
  // Every later call says so too, at once.
  std::vector<float> theirs(kRows * kDim);
  const Status pulled = c.clients[1]->Pull(kTable, RowRange{0, kRows}, theirs);
  EXPECT_FALSE(pulled.ok());
  EXPECT_NE(pulled.message().find("no member of the job"), std::string::npos) << pulled;
  EXPECT_FALSE(c.clients[1]->Clock().ok());
  // Worker 0 goes on, never waiting for it; worker 1's acknowledged push
  // is in the state once, the one after it resumed not at all.
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  ASSERT_TRUE(c.clients[0]->Pull(kTable, RowRange{0, kRows}, out).ok());
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 3.0f) << "float " << i;
  EXPECT_EQ(backup.stats().members, 1u);
  // A new Client in its slot joins the running job.
  c.clients[1].reset();
  ClientOptions o = c.WorkerOptions(1, kInitial);
  o.servers = {backup.address()};
  o.max_workers = kMax;
  o.clock_waits = false;
  std::unique_ptr<Client> again;
  ASSERT_TRUE(Eventually([&] {  // until the server saw the old one's connection go
    auto cl = Client::Connect(o);
    if (cl.ok()) again = std::move(cl).value();
    return again != nullptr;
  }));
  ASSERT_TRUE(again->Push(kTable, RowRange{0, kRows}, minus_one).ok());
  ASSERT_TRUE(again->Flush().ok());
  ASSERT_TRUE(again->Pull(kTable, RowRange{0, kRows}, out).ok());
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 4.0f) << "float " << i;
  EXPECT_EQ(backup.stats().members, 2u);
  again.reset();
  c.clients.clear();
}

// Elastic, two shards: worker 0 is blocked in a BSP pull of shard 0's rows
// only (worker 1 holds the clock back) while the primary of shard 1 dies
// and its backup is promoted. The wait looks at the other shards' entries
// of the shard map too, so worker 0 follows that promotion while it waits
// and is still a member there when the promoted backup's
// failover_reconnect_window ends (a waiting worker that looked only at
// shard 0 would be departed as if it had died with the old primary).
// Worker 2, silent from before the kill, is departed then: that marks the
// window's end. Worker 0's next push to shard 1 counts exactly once.
TEST_P(HungPrimaryTest, WorkerWaitingOnOneShardFollowsThePromotionOfAnother) {
  constexpr std::uint32_t kInitial = 3, kMax = 4;
  constexpr auto kWindow = milliseconds(1500);
  Replicated c;
  StartElastic(&c, GetParam(), kInitial, kMax, kWindow, /*shards=*/2);
  ASSERT_FALSE(HasFatalFailure());
  Server& promoted = *c.backups[1];
  const std::vector<float> minus_one(kRows * kDim, -1.0f);
  const std::vector<float> minus_one_half(kRows / 2 * kDim, -1.0f);
  for (auto& cl : c.clients) {
    ASSERT_TRUE(cl->Push(kTable, RowRange{0, kRows}, minus_one).ok());
    ASSERT_TRUE(cl->Clock().ok());  // clock 1
    ASSERT_TRUE(cl->Flush().ok());  // acknowledged by the old primaries
  }
  // Worker 2 runs ahead (its Clock() does not wait), then makes no call.
  ASSERT_TRUE(c.clients[2]->Clock().ok());
  ASSERT_TRUE(c.clients[2]->Clock().ok());
  ASSERT_TRUE(c.clients[2]->Flush().ok());
  ASSERT_TRUE(Eventually([&] { return promoted.stats().min_clock == 1; }));
  // Worker 0 at clock 2 pulls shard 0's rows: it needs worker 1 at clock 2.
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  Status pulled;
  std::vector<float> mine(kRows / 2 * kDim);
  std::thread t([&] { pulled = c.clients[0]->Pull(kTable, RowRange{0, kRows / 2}, mine); });
  const bool waiting =
      Eventually([&] { return c.clients[0]->stats().pull_waits > 0; }, seconds(20));
  internal::TEST_Kill(*c.primaries[1]);
  // Worker 1 follows the promotion with a push to shard 1.
  const Status pushed = c.clients[1]->Push(kTable, RowRange{kRows / 2, kRows / 2}, minus_one_half);
  // Worker 0 follows it while still waiting for worker 1's clock.
  const bool followed =
      Eventually([&] { return c.clients[0]->stats().failovers == 1; }, kWindow + kFollowBound);
  // The window ends: worker 2 leaves the promoted backup as dead.
  const bool window_over =
      Eventually([&] { return !promoted.stats().dead_workers.empty(); }, kWindow + kFollowBound);
  const ServerStats st = promoted.stats();
  // Worker 1 lets worker 0's pull go on.
  const Result<std::uint64_t> clocked = c.clients[1]->Clock();
  t.join();
  ASSERT_TRUE(waiting) << "worker 0's pull never waited";
  ASSERT_TRUE(pushed.ok()) << pushed;
  ASSERT_TRUE(clocked.ok()) << clocked.status();
  ASSERT_TRUE(pulled.ok()) << pulled;
  ASSERT_TRUE(window_over) << "the promoted backup never departed the silent worker 2";
  EXPECT_TRUE(followed) << "worker 0 did not follow shard 1's promotion while waiting";
  EXPECT_EQ(st.dead_workers, std::vector<std::uint32_t>{2})
      << "worker 0 was departed from the promoted backup while it waited on shard 0";
  EXPECT_EQ(st.members, 2u);
  EXPECT_EQ(c.decider->Current(1)->primary, promoted.address());
  for (float v : mine) ASSERT_EQ(v, 3.0f);
  // Worker 0 is a member there: its push to shard 1 counts once.
  const std::uint64_t applied = promoted.stats().pushes_applied;
  ASSERT_TRUE(c.clients[0]->Push(kTable, RowRange{kRows / 2, kRows / 2}, minus_one_half).ok());
  ASSERT_TRUE(c.clients[0]->Flush().ok());
  EXPECT_EQ(promoted.stats().pushes_applied, applied + 1);
  std::vector<float> theirs(kRows / 2 * kDim);
  ASSERT_TRUE(c.clients[0]->Pull(kTable, RowRange{kRows / 2, kRows / 2}, theirs).ok());
  for (float v : theirs) ASSERT_EQ(v, 5.0f);
  EXPECT_EQ(promoted.stats().members, 2u);
  c.clients.clear();
}

INSTANTIATE_TEST_SUITE_P(Transports, HungPrimaryTest, ::testing::Values("fake", "tcp"));

}  // namespace
}  // namespace rdmaps::testing

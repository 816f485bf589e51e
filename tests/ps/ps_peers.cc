// The in-process suite, continued (see ps_suite.h): what a worker sees when
// its peers are not there - a Connect that cannot complete (nothing
// listening, the wrong token, tables that do not match) returns its Status
// (it used to crash the worker), and a worker that dies is named by every
// worker waiting for it at their next poll, not at their deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "src/ps/test_hooks.h"
#include "tests/ps/eventually.h"
#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;

bool Contains(const Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

TEST_P(PsTest, ConnectToAServerThatIsGoneReturnsItsStatus) {
  std::string address;
  {
    auto c = StartCluster(transport(), 1, 1, {MakeTable(1, "w", 4, 1)});
    ASSERT_EQ(c.servers.size(), 1u);
    address = c.addresses[0];
  }  // the server is gone: nothing listens there
  auto o = MakeClientOptions(transport(), 0, 1, {address});
  o.connect_timeout = std::chrono::milliseconds(300);
  auto cl = Client::Connect(o);
  ASSERT_FALSE(cl.ok());
  EXPECT_TRUE(cl.status().code() == StatusCode::kUnavailable ||
              cl.status().code() == StatusCode::kTimedOut ||
              cl.status().code() == StatusCode::kNotFound)
      << cl.status();
  EXPECT_TRUE(Contains(cl.status(), address)) << cl.status();
}

TEST_P(PsTest, ConnectWithAnotherJobsTokenReturnsItsStatus) {
  auto c = StartCluster(transport(), 1, 1, {MakeTable(1, "w", 4, 1)}, 8);
  ASSERT_EQ(c.clients.size(), 1u);
  c.clients.clear();  // closes: the server stays up, waiting for nobody
  auto o = MakeClientOptions(transport(), 0, 1, c.addresses);
  o.transport.job_token = "another-job";
  o.connect_timeout = std::chrono::seconds(2);
  auto cl = Client::Connect(o);
  ASSERT_FALSE(cl.ok());
  EXPECT_NE(cl.status().code(), StatusCode::kOk);
}

TEST_P(PsTest, AWorkerRefusedForMismatchedTablesIsNotCountedAsFinished) {
  auto so = MakeServerOptions(transport(), 0, 1, 1, {MakeTable(1, "w", 4, 1)});
  auto server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto o = MakeClientOptions(transport(), 0, 1, {(*server)->address()});
  o.tables = {MakeTable(1, "w", 8, 1)};  // 8 rows; the server has 4
  auto cl = Client::Connect(o);
  ASSERT_FALSE(cl.ok());
  EXPECT_EQ(cl.status().code(), StatusCode::kFailedPrecondition) << cl.status();
  // The server saw worker 0 come and go without a goodbye: not a success.
  Status run = (*server)->RunUntil(SteadyClock::now() + std::chrono::seconds(20));
  EXPECT_EQ(run.code(), StatusCode::kUnavailable) << run;
  EXPECT_TRUE(Contains(run, "[0]")) << run;
  EXPECT_EQ((*server)->stats().workers_done, 0u);
}

// A worker that dies (its connections drop without Close) is named by the
// others at once; their wait_timeout (60 s here) is never reached.
TEST_P(PsTest, AWorkerThatDiesIsNamedByEveryWaitingPeer) {
  auto c = StartCluster(transport(), 2, 3, {MakeTable(1, "w", 8, 1, /*staleness=*/0)}, 8,
                        [](ClientOptions& o) {
                          o.wait_timeout = std::chrono::seconds(60);
                          o.clock_waits = false;  // the pull waits, not the clock
                        });
  ASSERT_EQ(c.clients.size(), 3u);
  internal::TEST_Abandon(*c.clients[2]);
  const auto start = SteadyClock::now();
  // Worker 0 pulls at clock 1 (needs everyone at clock >= 1); worker 1
  // waits at a barrier.
  Status pull, barrier;
  std::thread t([&] { barrier = c.clients[1]->Barrier(); });
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  std::vector<float> out(8);
  pull = c.clients[0]->Pull(1, RowRange{0, 8}, out);
  t.join();
  EXPECT_LT(SteadyClock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(pull.code(), StatusCode::kUnavailable) << pull;
  EXPECT_TRUE(Contains(pull, "worker 2 died")) << pull;
  EXPECT_EQ(barrier.code(), StatusCode::kUnavailable) << barrier;
  EXPECT_TRUE(Contains(barrier, "worker 2 died")) << barrier;
}

// A worker whose connection dropped and that connects again (rdmaps-train's
// Recover: an attempt that gave up, then one that works) is back from its
// bootstrap on. A peer waiting on it before its first slot is told it is
// behind, not that it died (the server's control words said "died" until
// that slot, and a peer gave up: the restart drill on verbs, under load).
TEST_P(PsTest, AWorkerThatConnectsAgainAfterItsConnectionDroppedIsNotDead) {
  const auto tweak = [](ClientOptions& o) {
    o.wait_timeout = std::chrono::seconds(2);
    o.clock_waits = false;  // the pull waits, not the clock
  };
  auto c = StartCluster(transport(), 1, 2, {MakeTable(1, "w", 8, 1, /*staleness=*/0)}, 8, tweak);
  ASSERT_EQ(c.clients.size(), 2u);
  internal::TEST_Abandon(*c.clients[1]);
  ASSERT_TRUE(Eventually([&] { return !c.servers[0]->stats().dead_workers.empty(); }));
  ClientOptions o = MakeClientOptions(transport(), 1, 2, c.addresses);
  tweak(o);
  auto again = Client::Connect(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(c.servers[0]->stats().dead_workers.empty());
  ASSERT_TRUE(c.clients[0]->Clock().ok());
  std::vector<float> out(8);
  const Status behind = c.clients[0]->Pull(1, RowRange{0, 8}, out);
  EXPECT_EQ(behind.code(), StatusCode::kTimedOut) << behind;
  EXPECT_FALSE(Contains(behind, "died")) << behind;
  ASSERT_TRUE((*again)->Clock().ok());
  EXPECT_TRUE(c.clients[0]->Pull(1, RowRange{0, 8}, out).ok());
}

}  // namespace
}  // namespace rdmaps::testing

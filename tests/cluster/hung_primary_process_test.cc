// The hung-primary drill with real processes (docs/ps.md, "Replication and
// failover", "A primary that hangs"): rdmaps-local --servers=2 --workers=2
// --replicas=2 trains with two cluster_test_worker processes (BSP: push,
// Clock, pull every iteration); the test SIGSTOPs the primary rdmaps-server
// of shard 1 mid-training, with all its connections open. Its lease
// lapses, its backup is promoted, and both workers, blocked on the stopped
// process, follow the promotion within about the lease (not their 30 s
// timeouts) and finish with the exact sum (each checks it: nothing lost or
// applied twice). Then the test SIGCONTs the old primary: it finds itself
// superseded and is fenced (says it acknowledges nothing more).
//
// Every wait has a deadline (Proc's hang guard, the workers' timeouts).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>

#include "tests/cluster/proc.h"

namespace {

using rdmaps::testing::Proc;
using Clock = std::chrono::steady_clock;

const std::string kLocal = RDMAPS_LOCAL_BIN;
const std::string kWorker = CLUSTER_TEST_WORKER_BIN;

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(HungPrimaryProcessTest, SigStoppedPrimaryIsFollowedThenFencedWhenResumed) {
  // The workers' op and wait timeouts are 30 s: a worker that waited one
  // out would take longer than the whole bound below.
  Proc p({kLocal, "--servers=2", "--workers=2", "--replicas=2", "--transport=tcp", "--grace_s=5",
          "--", kWorker, "--iterations=1500", "--timeout_ms=30000"},
         {}, std::chrono::seconds(120));
  ASSERT_TRUE(p.WaitFor(" started")) << p.out();
  ASSERT_TRUE(p.WaitFor("ps1 pid=")) << p.out();
  std::smatch m;
  ASSERT_TRUE(p.WaitFor("[worker0] iteration 100 done")) << p.out();
  const std::string head = p.out();
  ASSERT_TRUE(std::regex_search(head, m, std::regex("ps1 pid=([0-9]+) started"))) << head;
  const pid_t ps1 = static_cast<pid_t>(std::stol(m[1]));
  ASSERT_EQ(kill(ps1, SIGSTOP), 0);
  const auto stopped_at = Clock::now();
  // Both workers leave the stopped primary for the promoted backup.
  const bool moved = p.ReadUntil([&] { return CountOf(p.out(), ": shard 1 moved to ") >= 2; });
  const auto took = Clock::now() - stopped_at;
  kill(ps1, SIGCONT);  // (also when the wait above failed: the job must end)
  ASSERT_TRUE(moved) << p.out();
  std::printf(
      "SIGSTOP to both workers at the promoted backup: %lld ms (lease 750 ms)\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  EXPECT_LT(took, std::chrono::seconds(10)) << "a worker waited out a timeout";
  // Resumed, the old primary is fenced (replication.cc's line).
  EXPECT_TRUE(p.WaitFor("it acknowledges nothing more")) << p.out();
  EXPECT_EQ(p.Wait(), 0) << p.out();
  const std::string& out = p.out();
  EXPECT_EQ(CountOf(out, ": shard 1 moved to "), 2) << out;
  EXPECT_EQ(CountOf(out, "sum ok (3000 = 2 workers x 1500 iterations)"), 2) << out;
}

}  // namespace

// Failover of real rdmaps-server processes (docs/ps.md, "Replication and
// failover"), the shard map in a "dir:" coordinator shared by the processes:
//
//   - rdmaps-local --servers=2 --replicas=2 starts a backup and a primary
//     per shard; the test kill -9s the primary process of shard 1 while two
//     cluster_test_worker processes push, and the job must finish with the
//     exact sum of all pushes (each worker checks it) after the workers
//     moved to the promoted backup (--max_replacements=0: no re-protection);
//   - a SIGSTOPped primary (its connections stay open) loses its lease and
//     its backup is promoted; a worker (this test, a Client following the
//     shard map) goes on at the backup with exact counts; when the primary
//     resumes it is fenced: it says so, and refuses a new worker.
//
// Every wait has a deadline (Proc's hang guard, the Client's timeouts).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/failover.h"
#include "tests/cluster/proc.h"

namespace {

using rdmaps::testing::Proc;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kLocal = RDMAPS_LOCAL_BIN;
const std::string kServer = RDMAPS_SERVER_BIN;
const std::string kWorker = CLUSTER_TEST_WORKER_BIN;

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "rdmaps_failover_XXXXXX";
  char* d = mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  return tmpl;
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(FailoverProcessTest, KillNineOfAPrimaryProcessAndTheJobFinishesExactly) {
  // Without re-protection (tests/local/reprotect_drill_test.cc has it): the
  // shard goes on with one copy.
  Proc p({kLocal, "--servers=2", "--workers=2", "--replicas=2", "--transport=tcp", "--grace_s=5",
          "--max_replacements=0", "--", kWorker, "--iterations=800", "--timeout_ms=30000"},
         {}, std::chrono::seconds(100));
  ASSERT_TRUE(p.WaitFor("ps1 pid=")) << p.out();
  ASSERT_TRUE(p.WaitFor(" started")) << p.out();
  std::smatch m;
  const std::string head = p.out();
  ASSERT_TRUE(std::regex_search(head, m, std::regex("ps1 pid=([0-9]+) started"))) << head;
  const pid_t ps1 = static_cast<pid_t>(std::stol(m[1]));
  // Well into the run, both workers pushing.
  ASSERT_TRUE(p.WaitFor("[worker0] iteration 100 done")) << p.out();
  ASSERT_EQ(kill(ps1, SIGKILL), 0);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  const std::string& out = p.out();
  EXPECT_THAT(out, HasSubstr("ps1 (pid " + std::to_string(ps1) + ") killed by SIGKILL"));
  EXPECT_THAT(out, HasSubstr("backup of shard 1"));
  EXPECT_EQ(CountOf(out, ": shard 1 moved to "), 2) << out;  // both workers failed over
  EXPECT_EQ(CountOf(out, "sum ok (1600 = 2 workers x 800 iterations)"), 2) << out;
  EXPECT_EQ(CountOf(out, "replacement backup of shard"), 0) << out;
}

// A server of shard 0 (one server, one worker) with the layout in the
// environment and the shard map in `coord`.
std::map<std::string, std::string> ServerEnv(const std::string& coord) {
  return {{"RDMAPS_ROLE", "ps"},
          {"RDMAPS_TASK_INDEX", "0"},
          {"RDMAPS_PS_HOSTS", "127.0.0.1:0"},
          {"RDMAPS_NUM_WORKERS", "1"},
          {"RDMAPS_TRANSPORT", "tcp"},
          {"RDMAPS_INSECURE", "1"},
          {"RDMAPS_COORDINATOR", coord},
          {"RDMAPS_COORDINATOR_PREFIX", "failover-test/"}};
}

std::string ReadyAddress(Proc& server) {
  const std::string ready = "ready: listening on ";
  EXPECT_TRUE(server.WaitFor(ready)) << server.out();
  EXPECT_TRUE(server.WaitFor(" (layout")) << server.out();
  const auto at = server.out().find(ready) + ready.size();
  return server.out().substr(at, server.out().find(' ', at) - at);
}

TEST(FailoverProcessTest, ASigStoppedPrimaryIsReplacedAndFencedWhenItResumes) {
  const std::string dir = TempDir();
  const std::string coord = "dir:" + dir + "/coord";
  const std::string tables = dir + "/tables.json";
  std::ofstream(tables) << R"([{"name": "sum", "rows": 16, "dim": 4,
                               "optimizer": {"kind": "sgd", "learning_rate": 1}}])";
  Proc backup({kServer, "--tables=" + tables, "--replicas=2", "--replica_role=backup"},
              ServerEnv(coord), std::chrono::seconds(100));
  const std::string backup_address = ReadyAddress(backup);
  Proc primary(
      {kServer, "--tables=" + tables, "--replicas=2", "--backup_address=" + backup_address},
      ServerEnv(coord), std::chrono::seconds(100));
  const std::string primary_address = ReadyAddress(primary);
  ASSERT_FALSE(primary_address.empty());

  rdmaps::CoordinatorConfig cc;
  cc.address = coord;
  cc.job_prefix = "failover-test/";
  rdmaps::ClientOptions co;
  co.transport.transport = "tcp";
  co.transport.insecure = true;
  co.transport.op_timeout = std::chrono::milliseconds(1000);  // a hung server is noticed soon
  co.wait_timeout = std::chrono::seconds(30);
  co.servers = {primary_address};
  co.failover_coordinator = cc;  // Connect opens the decider kept there
  auto client = rdmaps::Client::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::size_t n = 16 * 4;
  std::vector<float> minus_one(n, -1.0f), out(n);
  constexpr int kBefore = 20, kAfter = 20;
  for (int i = 0; i < kBefore; ++i) {
    ASSERT_TRUE((*client)->Push(0, rdmaps::RowRange{0, 16}, minus_one).ok());
  }
  ASSERT_TRUE((*client)->Flush().ok());

  // Hang the primary with every connection open: only its lease can tell.
  auto decider = rdmaps::OpenFailoverDecider(cc);
  ASSERT_TRUE(decider.ok()) << decider.status();
  auto before = (*decider)->Current(0);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->epoch, 1u);
  ASSERT_EQ(before->primary, primary_address);
  ASSERT_EQ(kill(primary.pid(), SIGSTOP), 0);
  const auto stopped_at = Clock::now();
  auto after = (*decider)->WaitForEpochAfter(0, 1, stopped_at + std::chrono::seconds(20));
  ASSERT_TRUE(after.ok()) << after.status() << "\n" << backup.out();
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at);
  std::printf("SIGSTOP to promotion: %lld ms (lease 750 ms)\n",
              static_cast<long long>(took.count()));
  EXPECT_EQ(after->primary, backup_address);
  EXPECT_EQ(after->epoch, 2u);
  // Gone, or no heartbeat for a TTL (whichever the backup saw first).
  EXPECT_TRUE(backup.WaitFor("the primary's lease failover/lease/0 ")) << backup.out();

  // The worker goes on at the promoted backup; nothing was lost or doubled.
  for (int i = 0; i < kAfter; ++i) {
    rdmaps::Status s = (*client)->Push(0, rdmaps::RowRange{0, 16}, minus_one);
    ASSERT_TRUE(s.ok()) << s;
  }
  ASSERT_TRUE((*client)->Flush().ok());
  ASSERT_TRUE((*client)->Pull(0, rdmaps::RowRange{0, 16}, out).ok());
  for (float v : out) ASSERT_EQ(v, static_cast<float>(kBefore + kAfter));
  EXPECT_GE((*client)->stats().failovers, 1u);

  // The old primary resumes: it learns it was superseded and is fenced.
  ASSERT_EQ(kill(primary.pid(), SIGCONT), 0);
  // (replication.cc's line, logged once it refuses everything)
  ASSERT_TRUE(primary.WaitFor("it acknowledges nothing more")) << primary.out();
  rdmaps::ClientOptions stale = co;
  stale.failover_coordinator = {};
  stale.worker_id = 0;
  stale.connect_timeout = std::chrono::seconds(2);
  auto refused = rdmaps::Client::Connect(stale);
  EXPECT_FALSE(refused.ok()) << "the fenced primary accepted a worker";
  // Still exact at the shard's one primary.
  ASSERT_TRUE((*client)->Pull(0, rdmaps::RowRange{0, 16}, out).ok());
  for (float v : out) ASSERT_EQ(v, static_cast<float>(kBefore + kAfter));
  EXPECT_TRUE((*client)->Close().ok());
  kill(primary.pid(), SIGTERM);
  kill(backup.pid(), SIGTERM);
  primary.Wait();
  backup.Wait();
  std::filesystem::remove_all(dir);
}

}  // namespace

// The re-protection drill (docs/ps.md, "Re-protection"): rdmaps-local
// --servers=2 --replicas=2 with two cluster_test_worker processes. The test
// kill -9s the primary process of shard 1 while the workers push; the backup
// is promoted and rdmaps-local starts a replacement backup (ps1r1) that
// copies the shard from it while the workers go on; once rdmaps-local says
// the shard is protected again, the test kill -9s the new primary too: the
// replacement is promoted, the workers follow it, and the job ends with the
// exact sum (each worker checks it). rdmaps-local then re-protects the shard
// again (ps1r2), and stops every server when the workers are done. The workers wait at drill gates
// (cluster_test_worker --pause_at) so that the job cannot end before a kill;
// every wait has a deadline (Proc's guard, the workers' --timeout_ms).
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

#include "tests/cluster/proc.h"

namespace {

namespace fs = std::filesystem;
using rdmaps::testing::Proc;
using ::testing::HasSubstr;

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The pid in "<name> pid=N started" of rdmaps-local's output, or -1.
pid_t PidOf(const std::string& out, const std::string& name) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("\\] " + name + " pid=([0-9]+) started"))) return -1;
  return static_cast<pid_t>(std::stol(m[1]));
}

void Open(const std::string& dir, int gate) {
  std::ofstream(dir + "/resume-" + std::to_string(gate)) << "go\n";
}

// The drill on `transport`, every process on `host`.
void Drill(const std::string& transport, const std::string& host) {
  char tmpl[] = "/tmp/rdmaps-reprotect-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  constexpr int kIterations = 900, kGate1 = 300, kGate2 = 600;
  Proc p(
      {RDMAPS_LOCAL_BIN, "--servers=2", "--workers=2", "--replicas=2", "--transport=" + transport,
       "--host=" + host, "--server_binary=" RDMAPS_SERVER_BIN, "--grace_s=5",
       // A lease longer than a loaded machine's stalls of the dir: store (the
       // drill is of kills; the lease path has tests of its own).
       "--server_args=--lease_ttl_ms=3000", "--", CLUSTER_TEST_WORKER_BIN,
       "--iterations=" + std::to_string(kIterations),
       "--pause_at=" + std::to_string(kGate1) + "," + std::to_string(kGate2), "--gate_dir=" + dir,
       "--timeout_ms=60000"},
      {}, std::chrono::seconds(150));
  const std::string& out = p.out();
  // 1. The primary of shard 1 dies while the workers push.
  ASSERT_TRUE(p.WaitFor("[worker0] iteration 100 done")) << out;
  const pid_t ps1 = PidOf(out, "ps1"), ps1b = PidOf(out, "ps1b");
  ASSERT_GT(ps1, 0) << out;
  ASSERT_GT(ps1b, 0) << out;
  ASSERT_EQ(kill(ps1, SIGKILL), 0);
  // 2. A replacement copies the shard from the promoted backup and the map
  // names it (the workers push meanwhile, up to the first gate).
  ASSERT_TRUE(p.WaitFor("shard 1 is protected again: ps1r1 (")) << out;
  const pid_t ps1r1 = PidOf(out, "ps1r1");
  ASSERT_GT(ps1r1, 0) << out;
  // 3. The new primary dies while the workers push (the second gate keeps
  // the job from ending first).
  Open(dir, kGate1);
  ASSERT_TRUE(p.WaitFor("[worker0] iteration " + std::to_string(kGate1 + 50) + " done")) << out;
  ASSERT_EQ(kill(ps1b, SIGKILL), 0);
  ASSERT_TRUE(p.WaitFor("ps1b (pid " + std::to_string(ps1b) + ") killed by SIGKILL")) << out;
  Open(dir, kGate2);
  EXPECT_EQ(p.Wait(), 0) << out;
  EXPECT_THAT(out, HasSubstr("ps1 (pid " + std::to_string(ps1) + ") killed by SIGKILL"));
  EXPECT_THAT(out, HasSubstr("ps1r1 pid=" + std::to_string(ps1r1) +
                             " started (replacement backup of shard 1"));
  // Both workers followed both failovers: to ps1b, then to ps1r1 (a worker
  // may also reconnect at a re-protection's epoch, to the same primary).
  const std::string backups = "backups ready: ";
  const auto at = out.find(backups) + backups.size();
  const std::string ps1b_address =
      out.substr(out.find(',', at) + 1, out.find('\n', at) - out.find(',', at) - 1);
  const std::string again = "protected again: ps1r1 (";
  const auto at2 = out.find(again) + again.size();
  const std::string ps1r1_address = out.substr(at2, out.find(')', at2) - at2);
  for (int w = 0; w < 2; ++w) {
    const std::string moved = "worker " + std::to_string(w) + ": shard 1 moved to ";
    EXPECT_THAT(out, HasSubstr(moved + ps1b_address + " at epoch ")) << out;
    EXPECT_THAT(out, HasSubstr(moved + ps1r1_address + " at epoch ")) << out;
  }
  EXPECT_EQ(CountOf(out, "sum ok (1800 = 2 workers x 900 iterations)"), 2) << out;
  EXPECT_EQ(CountOf(out, "job done"), 1) << out;
  fs::remove_all(dir);
}

TEST(ReprotectDrillTest, AReplacementIsStartedAndTheJobSurvivesASecondKillNine) {
  Drill("tcp", "127.0.0.1");
}

// The same on verbs, inside the Soft-RoCE VM (tests/vm: the harness sets
// RDMAPS_TEST_VERBS_ADDR to the rxe device's address).
TEST(ReprotectDrillTest, OnVerbsAReplacementIsStartedAndTheJobSurvivesASecondKillNine) {
  const char* addr = std::getenv("RDMAPS_TEST_VERBS_ADDR");
  if (addr == nullptr || *addr == '\0') {
    GTEST_SKIP() << "needs an RDMA device: RDMAPS_TEST_VERBS_ADDR (set inside the Soft-RoCE VM)";
  }
  Drill("verbs", addr);
}

}  // namespace

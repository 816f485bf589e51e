// The dead-server drill: rdmaps-local runs 2 servers with checkpoints and 2
// rdmaps-train workers; once a checkpoint exists the test SIGKILLs server 1.
// rdmaps-local (--restart_servers) must restart only server 1, from the
// latest checkpoint on its port; server 0 must rewind in place to it; the
// workers (--max_recoveries) must reconnect in the same processes and rewind
// to that checkpoint's clock, and the job must finish. Every wait has a
// deadline (kKill); the kill-to-resumed time is printed, not asserted.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "tests/cluster/proc.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using rdmaps::testing::Proc;

constexpr auto kKill = std::chrono::seconds(120);

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The drill on `transport`, every process on `host`; `epochs` and
// `train_limit` size the training (smaller in the VM, where rxe is slow).
void Drill(const std::string& transport, const std::string& host, int epochs, int train_limit) {
  char tmpl[] = "/tmp/rdmaps-restart-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<std::string> argv = {
      RDMAPS_LOCAL_BIN,
      "--servers=2",
      "--workers=2",
      "--transport=" + transport,
      "--host=" + host,
      "--restart_servers=1",
      "--server_binary=" RDMAPS_SERVER_BIN,
      "--server_args=--checkpoint_dir=" + dir + " --checkpoint_every=20",
      "--",
      RDMAPS_TRAIN_BIN,
      "--model=softmax",
      "--epochs=" + std::to_string(epochs),
      "--train_limit=" + std::to_string(train_limit),
      "--test_limit=500",
      "--progress=false",
      "--max_recoveries=1"};
  Proc job(argv, {}, kKill);
  const std::string& out = job.out();
  pid_t ps1 = -1;
  bool killed = false;
  Clock::time_point killed_at{};
  bool reported = false;
  const std::regex ps1_started("ps1 pid=([0-9]+) started");
  // Until the output ends: rdmaps-local and all its children are done.
  job.ReadUntil([&] {
    std::smatch m;
    if (ps1 < 0 && std::regex_search(out, m, ps1_started)) ps1 = std::stoi(m[1]);
    // Kill server 1 once a checkpoint is complete.
    if (!killed && ps1 > 0 && fs::exists(dir + "/latest")) {
      EXPECT_EQ(::kill(ps1, SIGKILL), 0) << "server 1 is gone already: the job ended too soon\n"
                                         << out;
      killed = true;
      killed_at = Clock::now();
    }
    if (killed && !reported && CountOf(out, "resuming at clock") == 2) {
      reported = true;
      std::printf("%s: kill -9 of ps1 to both workers resumed: %.0f ms\n", transport.c_str(),
                  std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count());
    }
    return false;
  });
  const int rc = job.Wait();
  ASSERT_TRUE(killed) << out;
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(CountOf(out, "restarting ps1 from the latest checkpoint, the others rewind to it"), 1)
      << out;
  EXPECT_EQ(CountOf(out, "ps0 pid="), 1) << "the survivor was restarted\n" << out;
  EXPECT_EQ(CountOf(out, "ps1 pid="), 2) << out;
  EXPECT_EQ(CountOf(out, "ps server 0 restored"), 0) << out;
  EXPECT_EQ(CountOf(out, "ps server 0 rewound in place"), 1) << out;
  EXPECT_EQ(CountOf(out, "ps server 1 restored"), 1) << out;
  // Both workers, in their first processes, went back to the same clock.
  const std::regex resumed(
      "worker ([01]) reconnected to the restarted servers; resuming at clock "
      "([0-9]+)");
  std::vector<std::string> clocks;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), resumed);
       it != std::sregex_iterator(); ++it) {
    clocks.push_back((*it)[2]);
  }
  ASSERT_EQ(clocks.size(), 2u) << out;
  EXPECT_EQ(clocks[0], clocks[1]) << out;
  EXPECT_GT(std::stoull(clocks[0]), 0u) << out;
  EXPECT_EQ(std::stoull(clocks[0]) % 20, 0u) << out;
  EXPECT_EQ(CountOf(out, "worker0 pid="), 1) << "a worker process was restarted\n" << out;
  EXPECT_EQ(CountOf(out, "worker1 pid="), 1) << "a worker process was restarted\n" << out;
  EXPECT_EQ(CountOf(out, "job done"), 1) << out;
  fs::remove_all(dir);
}

bool HaveData() {
  // rdmaps-train's default --data_dir (tools/train/idx.h).
  const std::string data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte";
  return fs::exists(data + ".gz") || fs::exists(data);
}

TEST(RestartTest, OnlyTheDeadServerRestartsAndTheJobRewindsToTheCheckpoint) {
  if (!HaveData()) GTEST_SKIP() << "needs Fashion-MNIST (Debian package dataset-fashion-mnist)";
  Drill("tcp", "127.0.0.1", 60, 4000);
}

// The same on verbs, inside the Soft-RoCE VM (tests/vm: the harness sets
// RDMAPS_TEST_VERBS_ADDR to the rxe device's address).
TEST(RestartTest, OnVerbsOnlyTheDeadServerRestartsAndTheJobRewinds) {
  const char* addr = std::getenv("RDMAPS_TEST_VERBS_ADDR");
  if (addr == nullptr || *addr == '\0') {
    GTEST_SKIP() << "needs an RDMA device: RDMAPS_TEST_VERBS_ADDR (set inside the Soft-RoCE VM)";
  }
  if (!HaveData()) GTEST_SKIP() << "needs Fashion-MNIST (Debian package dataset-fashion-mnist)";
  Drill("verbs", addr, 60, 1000);
}

}  // namespace

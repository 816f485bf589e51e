// The operator's triggers of rdmaps-server, end to end: rdmaps-local runs 2
// servers with --checkpoint_dir (no periodic checkpoints) and 2 rdmaps-train
// workers. SIGUSR1 to server 1 alone must give a complete checkpoint (both
// parts: server 0 learns the cut from the workers);
// `rdmaps-server --checkpoint_now --pid_file` another; SIGTERM to server 0
// a final checkpoint that is complete before server 0 exits 0. Every wait
// has a deadline (kDeadline); nothing is timed.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "src/ps/checkpoint.h"
#include "tests/cluster/proc.h"

namespace {

namespace fs = std::filesystem;
using rdmaps::testing::Proc;

// Every process of the test is killed by then (Proc's hang guard).
constexpr auto kDeadline = std::chrono::seconds(90);

std::string Latest(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string name;
  in >> name;
  return name;
}

TEST(ServerSignalsTest, UsrOneCheckpointNowAndTermEachGiveACompleteCheckpoint) {
  const std::string data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte";
  if (!fs::exists(data + ".gz") && !fs::exists(data)) {
    GTEST_SKIP() << "needs Fashion-MNIST (Debian package dataset-fashion-mnist)";
  }
  char tmpl[] = "/tmp/rdmaps-signals-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = std::string(tmpl) + "/ckpt";
  const std::string pid_file = std::string(tmpl) + "/ps.pid";
  Proc job({RDMAPS_LOCAL_BIN, "--servers=2", "--workers=2", "--transport=tcp",
            "--server_binary=" RDMAPS_SERVER_BIN,
            "--server_args=--checkpoint_dir=" + dir + " --pid_file=" + pid_file +
                " --checkpoint_timeout_s=60",
            "--", RDMAPS_TRAIN_BIN, "--model=softmax", "--epochs=100000", "--train_limit=2000",
            "--test_limit=100", "--progress=false"},
           {}, kDeadline);
  const std::regex started("ps([01]) pid=([0-9]+) started");
  pid_t ps[2] = {-1, -1};
  auto both_started = [&] {
    for (auto it = std::sregex_iterator(job.out().begin(), job.out().end(), started);
         it != std::sregex_iterator(); ++it) {
      ps[std::stoi((*it)[1])] = std::stoi((*it)[2]);
    }
    return ps[0] > 0 && ps[1] > 0 && job.out().find("all 2 workers connected") != std::string::npos;
  };
  ASSERT_TRUE(job.ReadUntil(both_started)) << job.out();

  // 1. SIGUSR1 to server 1 only.
  ASSERT_EQ(::kill(ps[1], SIGUSR1), 0);
  ASSERT_TRUE(job.ReadUntil([&] { return !Latest(dir).empty(); }))
      << "no complete checkpoint after SIGUSR1\n"
      << job.out();
  const std::string first = Latest(dir);
  EXPECT_TRUE(rdmaps::internal::OpenCheckpoint(dir + "/" + first).ok()) << first;

  // 2. The command form.
  Proc now({RDMAPS_SERVER_BIN, "--checkpoint_now", "--pid_file=" + pid_file,
            "--checkpoint_dir=" + dir, "--checkpoint_timeout_s=60"},
           {}, kDeadline);
  EXPECT_EQ(now.Wait(), 0) << now.out();
  const std::string second = Latest(dir);
  EXPECT_GT(second, first) << now.out();
  EXPECT_NE(now.out().find(second), std::string::npos) << now.out();

  // 3. SIGTERM to server 0: a final checkpoint, then exit 0.
  ASSERT_EQ(::kill(ps[0], SIGTERM), 0);
  const std::regex final_ckpt("final checkpoint at clock ([0-9]+) durable");
  std::smatch m;
  ASSERT_TRUE(job.ReadUntil([&] { return std::regex_search(job.out(), m, final_ckpt); }))
      << job.out();
  const std::uint64_t clock = std::stoull(m[1]);
  ASSERT_TRUE(job.ReadUntil([&] {
    return job.out().find("ps0 (pid " + std::to_string(ps[0]) + ") exit 0") != std::string::npos;
  })) << job.out();
  EXPECT_GT(rdmaps::internal::CheckpointName(clock), second);
  // Server 0's exit says its own part is durable; server 1 writes its part
  // of the same cut in its background writer (and finishes it when it
  // stops): the checkpoint becomes complete, by the deadline.
  const std::string final_path = dir + "/" + rdmaps::internal::CheckpointName(clock);
  job.ReadUntil([&] { return rdmaps::internal::OpenCheckpoint(final_path).ok(); });
  auto parts = rdmaps::internal::OpenCheckpoint(final_path);
  EXPECT_TRUE(parts.ok()) << parts.status() << "\n" << job.out();
  ::kill(-job.pid(), SIGTERM);
  (void)job.Wait();
  fs::remove_all(tmpl);
}

}  // namespace

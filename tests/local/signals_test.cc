// The operator's triggers of rdmaps-server, end to end: rdmaps-local runs 2
// servers with --checkpoint_dir (no periodic checkpoints) and 2 rdmaps-train
// workers. SIGUSR1 to server 1 alone must give a complete checkpoint (both
// parts: server 0 learns the cut from the workers);
// `rdmaps-server --checkpoint_now --pid_file` another; SIGTERM to server 0
// a final checkpoint that is complete before server 0 exits 0. Every wait
// has a deadline (kDeadline); nothing is timed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "src/ps/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kDeadline = std::chrono::seconds(90);

// A child with stdout and stderr in one pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  explicit Child(std::vector<std::string> argv) {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out = fds[0];
  }
  // Reads output until `done()` or the deadline; false at the deadline or
  // when the output ends first.
  bool ReadUntil(const std::function<bool()>& done, Clock::time_point deadline) {
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        char buf[4096];
        const ssize_t n = ::read(out, buf, sizeof(buf));
        if (n <= 0) return done();
        text.append(buf, static_cast<std::size_t>(n));
      }
    }
    return true;
  }
  // Exit status after the output ended (killing the group at the deadline).
  int Wait(Clock::time_point deadline) {
    ReadUntil([] { return false; }, deadline);
    if (Clock::now() >= deadline) ::kill(-pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(out);
    return status;
  }
};

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
  const auto deadline = Clock::now() + kDeadline;
  Child job({RDMAPS_LOCAL_BIN, "--servers=2", "--workers=2", "--transport=tcp",
             "--server_binary=" RDMAPS_SERVER_BIN,
             "--server_args=--checkpoint_dir=" + dir + " --pid_file=" + pid_file +
                 " --checkpoint_timeout_s=60",
             "--", RDMAPS_TRAIN_BIN, "--model=softmax", "--epochs=100000", "--train_limit=2000",
             "--test_limit=100", "--progress=false"});
  const std::regex started("ps([01]) pid=([0-9]+) started");
  pid_t ps[2] = {-1, -1};
  auto both_started = [&] {
    for (auto it = std::sregex_iterator(job.text.begin(), job.text.end(), started);
         it != std::sregex_iterator(); ++it) {
      ps[std::stoi((*it)[1])] = std::stoi((*it)[2]);
    }
    return ps[0] > 0 && ps[1] > 0 && job.text.find("all 2 workers connected") != std::string::npos;
  };
  ASSERT_TRUE(job.ReadUntil(both_started, deadline)) << job.text;

  // 1. SIGUSR1 to server 1 only.
  ASSERT_EQ(::kill(ps[1], SIGUSR1), 0);
  ASSERT_TRUE(job.ReadUntil([&] { return !Latest(dir).empty(); }, deadline))
      << "no complete checkpoint after SIGUSR1\n"
      << job.text;
  const std::string first = Latest(dir);
  EXPECT_TRUE(rdmaps::internal::OpenCheckpoint(dir + "/" + first).ok()) << first;

  // 2. The command form.
  Child now({RDMAPS_SERVER_BIN, "--checkpoint_now", "--pid_file=" + pid_file,
             "--checkpoint_dir=" + dir, "--checkpoint_timeout_s=60"});
  const int now_status = now.Wait(deadline);
  EXPECT_TRUE(WIFEXITED(now_status) && WEXITSTATUS(now_status) == 0) << now.text;
  const std::string second = Latest(dir);
  EXPECT_GT(second, first) << now.text;
  EXPECT_NE(now.text.find(second), std::string::npos) << now.text;

  // 3. SIGTERM to server 0: a final checkpoint, then exit 0.
  ASSERT_EQ(::kill(ps[0], SIGTERM), 0);
  const std::regex final_ckpt("final checkpoint at clock ([0-9]+) durable");
  std::smatch m;
  ASSERT_TRUE(job.ReadUntil([&] { return std::regex_search(job.text, m, final_ckpt); }, deadline))
      << job.text;
  const std::uint64_t clock = std::stoull(m[1]);
  ASSERT_TRUE(job.ReadUntil(
      [&] {
        return job.text.find("ps0 (pid " + std::to_string(ps[0]) + ") exit 0") != std::string::npos;
      },
      deadline))
      << job.text;
  EXPECT_GT(rdmaps::internal::CheckpointName(clock), second);
  // Server 0's exit says its own part is durable; server 1 writes its part
  // of the same cut in its background writer (and finishes it when it
  // stops): the checkpoint becomes complete, by the deadline.
  const std::string final_path = dir + "/" + rdmaps::internal::CheckpointName(clock);
  job.ReadUntil([&] { return rdmaps::internal::OpenCheckpoint(final_path).ok(); }, deadline);
  auto parts = rdmaps::internal::OpenCheckpoint(final_path);
  EXPECT_TRUE(parts.ok()) << parts.status() << "\n" << job.text;
  ::kill(-job.pid, SIGTERM);
  (void)job.Wait(deadline);
  fs::remove_all(tmpl);
}

}  // namespace

// A child process of a launch test, its stdout and stderr captured, under a
// hang guard: a process whose output has not ended by its deadline is killed
// (its whole process group) and the test fails. Shared by the launch tests
// of tests/cluster (rdmaps-local, rdmaps-server; Slurm, torchrun, MPICH,
// Open MPI, TF_CONFIG) and the drills of tests/local.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rdmaps::testing {

class Proc {
 public:
  using Clock = std::chrono::steady_clock;
  // Far above what any launch of the tests needs.
  static constexpr std::chrono::seconds kDefaultGuard{60};

  // Runs argv[0] (searched in PATH) with this environment plus `env`; the
  // variables in `unset` are removed first.
  explicit Proc(std::vector<std::string> argv, std::map<std::string, std::string> env = {},
                std::chrono::seconds guard = kDefaultGuard, std::vector<std::string> unset = {}) {
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      for (const auto& k : unset) unsetenv(k.c_str());
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
    kill_at_ = Clock::now() + guard;
  }
  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;
  ~Proc() {
    if (!status_) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  // Reads output until `pattern` appears (true) or the output ends (false).
  bool WaitFor(const std::string& pattern) {
    while (out_.find(pattern) == std::string::npos) {
      if (!ReadSome()) return false;
    }
    return true;
  }

  // Reads output until `done()` holds (true) or the output ends (then
  // done()). `done` is checked at least every 50 ms, so it may watch more
  // than the output (a file, a clock).
  bool ReadUntil(const std::function<bool()>& done) {
    while (!done()) {
      if (!ReadSome(std::chrono::milliseconds(50))) return done();
    }
    return true;
  }

  // Reads to EOF and reaps; the exit code (128+N for signal N).
  int Wait() {
    while (ReadSome()) {
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    status_ = status;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  const std::string& out() const { return out_; }
  pid_t pid() const { return pid_; }

 private:
  // Waits up to `most` (and the hang guard) for output; false once it ended.
  bool ReadSome(std::chrono::milliseconds most = std::chrono::milliseconds::max()) {
    if (fd_ < 0) return false;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at_ - Clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (ms > most) {
      const int r = poll(&p, 1, static_cast<int>(most.count()));
      if (r == 0 || (r < 0 && errno == EINTR)) return true;  // nothing yet
    } else if (ms.count() <= 0 || poll(&p, 1, static_cast<int>(ms.count())) <= 0) {
      ADD_FAILURE() << "hang guard: killing the launch; output so far:\n" << out_;
      kill(-pid_, SIGKILL);
      close(fd_);
      fd_ = -1;
      return false;
    }
    char buf[4096];
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) {
      close(fd_);
      fd_ = -1;
      return false;
    }
    out_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string out_;
  std::optional<int> status_;
  Clock::time_point kill_at_;
};

}  // namespace rdmaps::testing

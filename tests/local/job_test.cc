// The Job of rdmaps-local with real child processes (/bin/sh, sleep): exit
// codes, output, the ready pipe, a sibling's failure, deadlines, signals to
// the launcher, the grace period. Every wait has a deadline (kHangGuard for
// waits that must end by themselves); nothing sleeps to synchronise.
#include "tools/local/job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace rdmaps::local {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Far above what any wait here needs; reaching it fails the test.
constexpr std::chrono::seconds kHangGuard{30};

Clock::time_point Guard() { return Clock::now() + kHangGuard; }

class JobTest : public ::testing::Test {
 protected:
  // A Job whose lines go to lines_; `grace` as in JobOptions.
  std::unique_ptr<Job> NewJob(std::chrono::seconds grace = std::chrono::seconds(10)) {
    JobOptions options;
    options.name = "job";
    options.grace = grace;
    options.sink = [this](const std::string& line) { lines_.push_back(line); };
    auto job = Job::Create(std::move(options));
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? std::move(*job) : nullptr;
  }

  static ChildSpec Sh(std::string name, std::string script) {
    return {.name = std::move(name), .argv = {"/bin/sh", "-c", std::move(script)}, .env = Env()};
  }
  static ChildSpec Sleeper(std::string name) {
    return {.name = std::move(name), .argv = {"sleep", "1000"}, .env = Env()};
  }
  static std::map<std::string, std::string> Env() {
    const char* path = std::getenv("PATH");
    return {{"PATH", path ? path : "/usr/bin:/bin"}};
  }

  // Waits (with the hang guard) until `id` has been reaped.
  static void WaitForExit(Job& job, Job::ChildId id) {
    auto wake = job.WaitUntil(Guard(), [&] { return job.exit_code(id).has_value(); });
    ASSERT_EQ(wake.reason, Job::Wake::kDone) << "hang guard: " << job.name(id) << " still runs";
  }

  // Waits (with the hang guard) until `line` has been emitted.
  void WaitForLine(Job& job, const std::string& line) {
    auto wake = job.WaitUntil(
        Guard(), [&] { return std::find(lines_.begin(), lines_.end(), line) != lines_.end(); });
    ASSERT_EQ(wake.reason, Job::Wake::kDone) << "hang guard: no line '" << line << "'";
  }

  std::vector<std::string> lines_;
};

TEST_F(JobTest, ReportsTheExitCodeOfAFailingChild) {
  auto job = NewJob();
  auto id = job->Spawn(Sh("c", "echo hello; exit 3"));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  WaitForExit(*job, *id);
  EXPECT_EQ(job->exit_code(*id), 3);
  EXPECT_EQ(job->how(*id), "exit 3");
  EXPECT_THAT(lines_, Contains("[c] hello"));
  EXPECT_THAT(lines_, Contains("[job] c (pid " + std::to_string(job->pid(*id)) + ") exit 3"));
  ASSERT_TRUE(job->failure().has_value());
  EXPECT_EQ(job->failure()->exit_code, 3);
  EXPECT_EQ(job->failure()->what, "c exit 3");
  EXPECT_EQ(job->Live(), 0);
}

TEST_F(JobTest, ChildExitingZeroIsNoFailure) {
  auto job = NewJob();
  auto id = job->Spawn(Sh("ok", "exit 0"));
  ASSERT_TRUE(id.ok());
  WaitForExit(*job, *id);
  EXPECT_EQ(job->exit_code(*id), 0);
  EXPECT_FALSE(job->failure().has_value());
}

TEST_F(JobTest, StreamsOutputLineByLineWithTheChildsPrefix) {
  auto job = NewJob();
  // stderr is merged into stdout; an unterminated last line still arrives.
  auto id = job->Spawn(Sh("p", "printf 'a\\nb\\n'; echo err >&2; printf c"));
  ASSERT_TRUE(id.ok());
  WaitForExit(*job, *id);
  std::vector<std::string> output;
  for (const auto& line : lines_) {
    if (line.rfind("[p] ", 0) == 0) output.push_back(line);
  }
  EXPECT_THAT(output, ElementsAre("[p] a", "[p] b", "[p] err", "[p] c"));
}

TEST_F(JobTest, CommandThatCannotBeExecutedExits127) {
  auto job = NewJob();
  auto id = job->Spawn({.name = "x", .argv = {"/nonexistent/tool"}, .env = Env()});
  ASSERT_TRUE(id.ok());
  WaitForExit(*job, *id);
  EXPECT_EQ(job->exit_code(*id), 127);
  EXPECT_THAT(lines_, Contains("[x] cannot exec /nonexistent/tool: No such file or directory"));
}

TEST_F(JobTest, ReadyLineArrivesOnFd3) {
  auto job = NewJob();
  ChildSpec spec = Sh("ps0", "echo 127.0.0.1:7470 >&3; exec sleep 1000");
  spec.ready_pipe = true;
  auto id = job->Spawn(spec);
  ASSERT_TRUE(id.ok());
  auto wake = job->WaitUntil(Guard(), [&] { return job->ready_line(*id).has_value(); });
  ASSERT_EQ(wake.reason, Job::Wake::kDone);
  EXPECT_EQ(job->ready_line(*id), "127.0.0.1:7470");
  EXPECT_FALSE(job->exit_code(*id).has_value());
  job->StopAll();
  EXPECT_EQ(job->Live(), 0);
}

TEST_F(JobTest, SleeperIsStoppedWhenASiblingFails) {
  auto job = NewJob();
  auto sleeper = job->Spawn(Sleeper("sleeper"));
  auto failer = job->Spawn(Sh("failer", "exit 3"));
  ASSERT_TRUE(sleeper.ok() && failer.ok());
  auto wake = job->WaitUntil(Guard(), [&] { return job->failure().has_value(); });
  ASSERT_EQ(wake.reason, Job::Wake::kDone);
  EXPECT_FALSE(job->exit_code(*sleeper).has_value());
  job->StopAll();
  EXPECT_EQ(job->exit_code(*sleeper), 128 + SIGTERM);
  EXPECT_EQ(job->how(*sleeper), "killed by SIGTERM");
  // The sleeper's exit during StopAll is not a failure of its own.
  EXPECT_EQ(job->failure()->what, "failer exit 3");
  EXPECT_EQ(job->failure()->exit_code, 3);
  EXPECT_EQ(job->Live(), 0);
}

TEST_F(JobTest, DeadlinePassesWhileAChildRuns) {
  auto job = NewJob();
  auto id = job->Spawn(Sleeper("sleeper"));
  ASSERT_TRUE(id.ok());
  auto wake = job->WaitUntil(Clock::now() + std::chrono::milliseconds(50),
                             [&] { return job->exit_code(*id).has_value(); });
  EXPECT_EQ(wake.reason, Job::Wake::kDeadline);
  EXPECT_FALSE(job->exit_code(*id).has_value());
  EXPECT_EQ(job->Live(), 1);
}

TEST_F(JobTest, ConditionThatHoldsReturnsAtOnceEvenPastTheDeadline) {
  auto job = NewJob();
  auto wake = job->WaitUntil(Clock::now() - std::chrono::seconds(1), [] { return true; });
  EXPECT_EQ(wake.reason, Job::Wake::kDone);
}

TEST_F(JobTest, SigtermToTheLauncherIsReportedAndForwarded) {
  auto job = NewJob();
  auto id = job->Spawn(Sleeper("sleeper"));
  ASSERT_TRUE(id.ok());
  // Blocked while the Job exists: it waits for the Job on its signalfd.
  ASSERT_EQ(raise(SIGTERM), 0);
  auto wake = job->WaitUntil(Guard(), [] { return false; });
  ASSERT_EQ(wake.reason, Job::Wake::kSignal);
  EXPECT_EQ(wake.signal, SIGTERM);
  EXPECT_EQ(job->StopForSignal(wake.signal), 128 + SIGTERM);
  EXPECT_THAT(lines_, Contains("[job] received SIGTERM; stopping every process"));
  EXPECT_EQ(job->how(*id), "killed by SIGTERM");
  EXPECT_FALSE(job->failure().has_value());
}

TEST_F(JobTest, SighupIsForwardedAsSigterm) {
  auto job = NewJob();
  auto id = job->Spawn(Sleeper("sleeper"));
  ASSERT_TRUE(id.ok());
  ASSERT_EQ(raise(SIGHUP), 0);
  auto wake = job->WaitUntil(Guard(), [] { return false; });
  ASSERT_EQ(wake.reason, Job::Wake::kSignal);
  EXPECT_EQ(wake.signal, SIGHUP);
  EXPECT_EQ(job->StopForSignal(wake.signal), 128 + SIGHUP);
  EXPECT_EQ(job->how(*id), "killed by SIGTERM");
}

TEST_F(JobTest, ChildIgnoringSigtermIsKilledAfterTheGrace) {
  auto job = NewJob(std::chrono::seconds(0));
  auto id = job->Spawn(Sh("stubborn", "trap '' TERM; echo ready; exec sleep 1000"));
  ASSERT_TRUE(id.ok());
  WaitForLine(*job, "[stubborn] ready");
  job->StopAll();
  EXPECT_EQ(job->exit_code(*id), 128 + SIGKILL);
  EXPECT_THAT(lines_, Contains("[job] stubborn did not exit within 0 s of SIGTERM; SIGKILL"));
}

TEST_F(JobTest, DestructorKillsAndReapsChildrenAndRestoresTheSignalMask) {
  pid_t pid = -1;
  {
    auto job = NewJob();
    auto id = job->Spawn(Sleeper("sleeper"));
    ASSERT_TRUE(id.ok());
    pid = job->pid(*id);
  }
  // Reaped: the pid no longer names a process of ours (not even a zombie).
  errno = 0;
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  sigset_t mask;
  ASSERT_EQ(sigprocmask(SIG_BLOCK, nullptr, &mask), 0);
  EXPECT_FALSE(sigismember(&mask, SIGTERM));
  EXPECT_FALSE(sigismember(&mask, SIGCHLD));
  EXPECT_THAT(lines_, IsEmpty());
}

}  // namespace
}  // namespace rdmaps::local

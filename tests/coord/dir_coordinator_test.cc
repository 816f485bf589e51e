// The directory coordinator ("dir:/PATH") between real processes: jobs that
// share a directory are kept apart by their job prefix; a process stopped
// (SIGSTOP) in the middle of a change, at the worst moment or at random
// ones, stalls nobody else and, when it resumes, neither wins a race it
// lost nor loses one it won; and a failover through the directory works
// while the old primary is stopped in the middle of renewing its lease, which
// learns when it resumes that it is out.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "src/cluster/coord_failover.h"
#include "src/cluster/coordinator.h"
#include "src/cluster/embedded_coordinator.h"

namespace rdmaps::internal {
namespace {

using std::chrono::milliseconds;

CoordDeadline In(milliseconds ms) { return CoordClock::now() + ms; }

// Every call a running process makes while another is stopped gets this:
// it must finish well within it.
constexpr milliseconds kCallDeadline{3000};

CoordinatorOptions Dir(const std::string& dir, const std::string& prefix) {
  CoordinatorOptions o;
  o.address = "dir:" + dir;
  o.job_prefix = prefix;
  return o;
}

pid_t Spawn(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

// Polls the child's state (WNOHANG) until it is stopped, with a deadline.
bool WaitStopped(pid_t pid, milliseconds within) {
  const auto until = CoordClock::now() + within;
  while (CoordClock::now() < until) {
    int st = 0;
    const pid_t r = waitpid(pid, &st, WUNTRACED | WNOHANG);
    if (r == pid && WIFSTOPPED(st)) return true;
    if (r == pid) return false;  // exited
    std::this_thread::sleep_for(milliseconds(1));
  }
  return false;
}

// The child's exit code; -1 (after killing it) when it did not exit in time.
int WaitExit(pid_t pid, milliseconds within) {
  const auto until = CoordClock::now() + within;
  while (CoordClock::now() < until) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid && (WIFEXITED(st) || WIFSIGNALED(st))) {
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Get, then CAS value+1: true when this call's CAS won.
Result<bool> Increment(Coordinator& c, CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(ReadResult r, c.Get("counter", deadline));
  const int v = r.kv ? std::stoi(r.kv->value) : 0;
  RDMAPS_ASSIGN_OR_RETURN(CasResult cas,
                          c.CompareAndSwap("counter", r.kv ? r.kv->mod_revision : 0,
                                           std::to_string(v + 1), kNoLease, deadline));
  return cas.swapped;
}

int Counter(Coordinator& c) {
  auto r = c.Get("counter", In(kCallDeadline));
  return r.ok() && r->kv ? std::stoi(r->kv->value) : -1;
}

class DirCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmaps-dircoord-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_ = base_ + "/coord";
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::unique_ptr<Coordinator> Open(const std::string& prefix) {
    auto c = OpenCoordinator(Dir(dir_, prefix));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::string base_, dir_;
};

TEST_F(DirCoordinatorTest, JobsInOneDirectoryAreKeptApartByTheirPrefix) {
  auto a = Open("rdmaps/job-a/");
  auto a2 = Open("rdmaps/job-a/");
  auto b = Open("rdmaps/job-b/");
  ASSERT_TRUE(a && a2 && b);
  ASSERT_TRUE(a->CompareAndSwap("shard_map", 0, "a's map", kNoLease, In(kCallDeadline))->swapped);
  // Job b sees nothing of job a's, and makes its own record of that name.
  EXPECT_FALSE(b->Get("shard_map", In(kCallDeadline))->kv.has_value());
  EXPECT_TRUE(b->List("", In(kCallDeadline))->kvs.empty());
  ASSERT_TRUE(b->CompareAndSwap("shard_map", 0, "b's map", kNoLease, In(kCallDeadline))->swapped);
  // The same prefix is the same job (another process would open it alike).
  const pid_t child = Spawn([&] {
    auto c = OpenCoordinator(Dir(dir_, "rdmaps/job-a/"));
    if (!c.ok()) return 1;
    auto r = (*c)->Get("shard_map", In(kCallDeadline));
    return r.ok() && r->kv && r->kv->value == "a's map" && r->kv->key == "shard_map" ? 0 : 2;
  });
  EXPECT_EQ(WaitExit(child, milliseconds(20000)), 0);
  auto got = a2->List("", In(kCallDeadline));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].key, "shard_map");  // relative to the prefix
  EXPECT_EQ(got->kvs[0].value, "a's map");
  EXPECT_EQ(b->Get("shard_map", In(kCallDeadline))->kv->value, "b's map");
  // A watch of one job does not wake for the other's change.
  const std::int64_t seen = a->Get("shard_map", In(kCallDeadline))->kv->mod_revision;
  ASSERT_TRUE(b->CompareAndSwap("other", 0, "x", kNoLease, In(kCallDeadline))->swapped);
  EXPECT_EQ(a->WaitForChange("", true, seen, In(milliseconds(50))).status().code(),
            StatusCode::kTimedOut);
  auto bad = OpenCoordinator(Dir(dir_, "bad prefix/"));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
}

TEST_F(DirCoordinatorTest, ThePrefixComesFromTheEnvironment) {
  const Environment env{{"RDMAPS_COORDINATOR", "dir:" + dir_},
                        {"RDMAPS_COORDINATOR_PREFIX", "team/run-1/"}};
  auto o = ResolveCoordinator({}, env, "");
  ASSERT_TRUE(o.ok()) << o.status();
  auto c = OpenCoordinator(*o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE((*c)->CompareAndSwap("k", 0, "v", kNoLease, In(kCallDeadline))->swapped);
  auto other = Open("team/run-2/");
  EXPECT_FALSE(other->Get("k", In(kCallDeadline))->kv.has_value());
  auto same = Open("team/run-1/");
  EXPECT_EQ(same->Get("k", In(kCallDeadline))->kv->value, "v");
  EXPECT_NE((*c)->Describe().find("team/run-1/"), std::string::npos) << (*c)->Describe();
}

// A child stops itself (SIGSTOP) in the middle of its increment's commit:
// before its link (its new generation written, not yet made the head) or
// just after it. Meanwhile this process makes more changes than the
// directory keeps generations of, every call within its deadline.
class StoppedWriterTest : public DirCoordinatorTest,
                          public ::testing::WithParamInterface<const char*> {};

TEST_P(StoppedWriterTest, StallsNobodyAndResumesCorrectly) {
  const std::string point = GetParam();
  auto parent = Open("job/");
  ASSERT_TRUE(parent);
  ASSERT_TRUE(*Increment(*parent, In(kCallDeadline)));  // counter = 1
  const pid_t child = Spawn([&] {
    auto c = DirectoryCoordinator::Open(dir_, "job/");
    if (!c.ok()) return 1;
    bool once = true;
    (*c)->TEST_SetCommitHook([&](std::string_view p) {
      if (p == point && once) {
        once = false;
        raise(SIGSTOP);
      }
    });
    auto won = Increment(**c, In(milliseconds(30000)));
    if (!won.ok()) return 2;
    return *won ? 11 : 10;
  });
  ASSERT_TRUE(WaitStopped(child, milliseconds(20000)));
  constexpr int kMine = 40;  // more than the generations kept
  for (int i = 0; i < kMine; ++i) {
    auto won = Increment(*parent, In(kCallDeadline));
    ASSERT_TRUE(won.ok()) << won.status();
    ASSERT_TRUE(*won);  // the only running writer
  }
  auto lease = parent->GrantLease(milliseconds(5000), In(kCallDeadline));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(parent->KeepAlive(lease->id, In(kCallDeadline)).ok());
  ASSERT_TRUE(parent->RevokeLease(lease->id, In(kCallDeadline)).ok());
  kill(child, SIGCONT);
  const int code = WaitExit(child, milliseconds(30000));
  if (point == "before-link") {
    // Its read was 40 changes old: its link of that generation fails (the
    // name is taken for good), it runs again and its CAS loses.
    EXPECT_EQ(code, 10);
    EXPECT_EQ(Counter(*parent), 1 + kMine);
  } else {
    // Its change was made before it stopped: every later one built on it.
    EXPECT_EQ(code, 11);
    EXPECT_EQ(Counter(*parent), 2 + kMine);
  }
}

INSTANTIATE_TEST_SUITE_P(Points, StoppedWriterTest, ::testing::Values("before-link", "after-link"));

// A child increments as fast as it can; this process stops it at random
// moments and increments while it is stopped. No increment is lost or
// doubled, and no call of this process waits past its deadline.
TEST_F(DirCoordinatorTest, StoppingAWriterAtRandomMomentsLosesNothing) {
  auto parent = Open("job/");
  ASSERT_TRUE(parent);
  int stop_pipe[2], count_pipe[2];
  ASSERT_EQ(pipe(stop_pipe), 0);
  ASSERT_EQ(pipe(count_pipe), 0);
  const pid_t child = Spawn([&] {
    close(stop_pipe[1]);
    close(count_pipe[0]);
    auto c = OpenCoordinator(Dir(dir_, "job/"));
    if (!c.ok()) return 1;
    int mine = 0;
    for (;;) {
      pollfd p{stop_pipe[0], POLLIN, 0};
      if (poll(&p, 1, 0) > 0) break;  // told to stop (or the parent died)
      auto won = Increment(**c, In(milliseconds(30000)));
      if (!won.ok()) return 2;
      mine += *won ? 1 : 0;
    }
    return write(count_pipe[1], &mine, sizeof(mine)) == sizeof(mine) ? 0 : 3;
  });
  close(stop_pipe[0]);
  close(count_pipe[1]);
  std::mt19937 rng(std::random_device{}());
  int mine = 0;
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));  // a random moment
    ASSERT_EQ(kill(child, SIGSTOP), 0);
    ASSERT_TRUE(WaitStopped(child, milliseconds(20000)));
    for (int i = 0; i < 3; ++i) {
      auto won = Increment(*parent, In(kCallDeadline));
      ASSERT_TRUE(won.ok()) << won.status();
      EXPECT_TRUE(*won);  // the child is stopped: nobody else changes it
      mine += *won ? 1 : 0;
    }
    ASSERT_EQ(kill(child, SIGCONT), 0);
    // Race the child too.
    for (int i = 0; i < 3; ++i) {
      auto won = Increment(*parent, In(kCallDeadline));
      ASSERT_TRUE(won.ok()) << won.status();
      mine += *won ? 1 : 0;
    }
  }
  close(stop_pipe[1]);
  int theirs = -1;
  ASSERT_EQ(read(count_pipe[0], &theirs, sizeof(theirs)), static_cast<ssize_t>(sizeof(theirs)));
  close(count_pipe[0]);
  EXPECT_EQ(WaitExit(child, milliseconds(30000)), 0);
  EXPECT_EQ(Counter(*parent), mine + theirs);
}

// The old primary stops in the middle of renewing its lease (its renewal
// written, not linked). Its lease runs out, the backup's watch fires and
// the backup is promoted, all while it is stopped; when it resumes its
// renewal is refused and it is told the new primary at the newer epoch.
TEST_F(DirCoordinatorTest, FailoverWorksWhileTheOldPrimaryIsStoppedMidCommit) {
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = Spawn([&] {
    close(ready[0]);
    close(go[1]);
    auto c = DirectoryCoordinator::Open(dir_, "job/");
    if (!c.ok()) return 1;
    static std::atomic<bool> armed{false};
    (*c)->TEST_SetCommitHook([](std::string_view p) {
      if (p == "before-link" && armed.exchange(false)) raise(SIGSTOP);
    });
    CoordFailoverDecider d(std::shared_ptr<Coordinator>(std::move(*c)),
                           {.call_timeout = milliseconds(20000), .lease_ttl = milliseconds(300)});
    auto reg = d.Register(0, "p:1", "b:1");
    if (!reg.ok() || reg->epoch != 1) return 2;
    armed = true;  // the next renewal (within a third of the TTL) stops here
    char c1 = 'r';
    if (write(ready[1], &c1, 1) != 1) return 3;
    char c2 = 0;
    if (read(go[0], &c2, 1) != 1) return 4;  // (returns once resumed)
    // Awake again: it tries to go on alone at the epoch it knew.
    auto told = d.ReportBackupLost(0, 1, "p:1");
    if (!told.ok()) return 5;
    return told->primary == "b:1" && told->epoch == 2 ? 0 : 6;
  });
  close(ready[1]);
  close(go[0]);
  char c1 = 0;
  ASSERT_EQ(read(ready[0], &c1, 1), 1);
  auto coord = std::shared_ptr<Coordinator>(Open("job/"));
  ASSERT_TRUE(coord);
  ASSERT_TRUE(coord->Get(FailoverLeaseKey(0), In(kCallDeadline))->kv.has_value());
  CoordFailoverDecider backup(coord,
                              {.call_timeout = kCallDeadline, .lease_ttl = milliseconds(300)});
  std::atomic<int> fired{0};
  auto watch = backup.WatchPrimary(0, [&] { ++fired; });
  ASSERT_TRUE(watch.ok() && *watch) << watch.status();
  ASSERT_TRUE(WaitStopped(child, milliseconds(20000)));
  const auto until = CoordClock::now() + milliseconds(20000);
  while (fired.load() == 0 && CoordClock::now() < until) {
    std::this_thread::sleep_for(milliseconds(2));  // polling a flag, with a deadline
  }
  ASSERT_EQ(fired.load(), 1);
  auto promoted = backup.ReportPrimaryLost(0, 1, "b:1");
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(promoted->primary, "b:1");
  EXPECT_EQ(promoted->epoch, 2u);
  char c2 = 'g';
  ASSERT_EQ(write(go[1], &c2, 1), 1);
  ASSERT_EQ(kill(child, SIGCONT), 0);
  EXPECT_EQ(WaitExit(child, milliseconds(30000)), 0);
  auto now = backup.Current(0);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->primary, "b:1");
  EXPECT_EQ(now->epoch, 2u);
}

}  // namespace
}  // namespace rdmaps::internal

// The embedded coordinators: leases expire when the fake clock says so,
// compare-and-swap races between threads have exactly one winner per
// revision, watches wake on puts, deletes and expiries and time out at
// their deadline; the directory coordinator does the same across handles
// and processes and refuses a directory others can enter.
#include "src/cluster/embedded_coordinator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "src/cluster/shard_map.h"

namespace rdmaps::internal {
namespace {

using std::chrono::milliseconds;

CoordDeadline In(milliseconds ms) { return CoordClock::now() + ms; }
const CoordDeadline kFar = CoordClock::time_point::max();

CoordinatorOptions Opts(std::string address, std::string prefix = "", std::string user = "",
                        std::string password_file = "", std::string ca = "") {
  CoordinatorOptions o;
  o.address = std::move(address);
  o.job_prefix = std::move(prefix);
  o.etcd_user = std::move(user);
  o.etcd_password_file = std::move(password_file);
  o.etcd_ca_file = std::move(ca);
  return o;
}

std::unique_ptr<MemoryCoordinator> Fake() {
  return MemoryCoordinator::Open({.name = "", .fake_clock = true});
}

TEST(MemoryCoordinatorTest, LeaseExpiryIsDecidedByTheClock) {
  auto c = Fake();
  auto lease = c->GrantLease(milliseconds(100), kFar);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto put = c->CompareAndSwap("servers/0", 0, "addr", lease->id, kFar);
  ASSERT_TRUE(put.ok() && put->swapped);
  c->TEST_AdvanceClock(milliseconds(99));
  EXPECT_TRUE(c->Get("servers/0", kFar)->kv.has_value());
  EXPECT_TRUE(c->KeepAlive(lease->id, kFar).ok());  // expires at 199 ms now
  c->TEST_AdvanceClock(milliseconds(99));
  EXPECT_TRUE(c->Get("servers/0", kFar)->kv.has_value());
  c->TEST_AdvanceClock(milliseconds(1));
  auto gone = c->Get("servers/0", kFar);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->kv.has_value());
  EXPECT_GT(gone->revision, put->revision);  // the expiry is a change
  Status ka = c->KeepAlive(lease->id, kFar);
  EXPECT_EQ(ka.code(), StatusCode::kNotFound) << ka;
  // A put under the dead lease is refused, not silently kept forever.
  auto late = c->CompareAndSwap("servers/0", 0, "addr", lease->id, kFar);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound);
}

TEST(MemoryCoordinatorTest, RevokeDeletesOnlyThatLeasesKeys) {
  auto c = Fake();
  auto a = c->GrantLease(milliseconds(1000), kFar);
  auto b = c->GrantLease(milliseconds(1000), kFar);
  ASSERT_TRUE(c->CompareAndSwap("m/a", 0, "1", a->id, kFar)->swapped);
  ASSERT_TRUE(c->CompareAndSwap("m/b", 0, "2", b->id, kFar)->swapped);
  ASSERT_TRUE(c->CompareAndSwap("m/c", 0, "3", kNoLease, kFar)->swapped);
  ASSERT_TRUE(c->RevokeLease(a->id, kFar).ok());
  EXPECT_TRUE(c->RevokeLease(a->id, kFar).ok());  // idempotent
  auto l = c->List("m/", kFar);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->kvs.size(), 2u);
  EXPECT_EQ(l->kvs[0].key, "m/b");
  EXPECT_EQ(l->kvs[1].key, "m/c");
  c->TEST_AdvanceClock(std::chrono::hours(2));  // b expires; c has no lease
  l = c->List("m/", kFar);
  ASSERT_EQ(l->kvs.size(), 1u);
  EXPECT_EQ(l->kvs[0].key, "m/c");
}

TEST(MemoryCoordinatorTest, CompareAndSwapComparesTheModRevision) {
  auto c = Fake();
  auto first = c->CompareAndSwap("k", 0, "v1", kNoLease, kFar);
  ASSERT_TRUE(first.ok() && first->swapped);
  // Create-if-absent fails once it exists, and says what is there.
  auto again = c->CompareAndSwap("k", 0, "other", kNoLease, kFar);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->swapped);
  ASSERT_TRUE(again->current.has_value());
  EXPECT_EQ(again->current->value, "v1");
  EXPECT_EQ(again->current->mod_revision, first->revision);
  auto stale = c->CompareAndSwap("k", first->revision - 1, "x", kNoLease, kFar);
  EXPECT_FALSE(stale->swapped);
  auto next = c->CompareAndSwap("k", first->revision, "v2", kNoLease, kFar);
  ASSERT_TRUE(next->swapped);
  EXPECT_EQ(next->revision, first->revision + 1);
  auto got = c->Get("k", kFar);
  EXPECT_EQ(got->kv->value, "v2");
  EXPECT_EQ(got->kv->create_revision, first->revision);
  ASSERT_TRUE(c->Delete("k", kFar).ok());
  EXPECT_FALSE(c->Get("k", kFar)->kv.has_value());
  EXPECT_TRUE(c->CompareAndSwap("k", 0, "v3", kNoLease, kFar)->swapped);
}

TEST(MemoryCoordinatorTest, BadKeysValuesAndTtlsAreRefused) {
  auto c = Fake();
  EXPECT_EQ(c->Get("", kFar).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get("a b", kFar).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(std::string(1, '\0'), kFar).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Get(std::string(kMaxCoordKeyBytes + 1, 'a'), kFar).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->CompareAndSwap("k", 0, std::string(kMaxCoordValueBytes + 1, 'x'), kNoLease, kFar)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c->GrantLease(milliseconds(0), kFar).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->GrantLease(milliseconds(-5), kFar).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->List("", kFar).ok());
}

// Every thread increments a counter by CAS until it has done so N times: the
// total is exact only if no two CASes from the same revision both won.
void CasCounterRace(const std::vector<Coordinator*>& handles) {
  constexpr int kPerThread = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (Coordinator* h : handles) {
    threads.emplace_back([h, &failures] {
      for (int done = 0; done < kPerThread;) {
        auto r = h->Get("counter", kFar);
        if (!r.ok()) {
          ADD_FAILURE() << r.status();
          ++failures;
          return;
        }
        const int v = r->kv ? std::stoi(r->kv->value) : 0;
        auto cas = h->CompareAndSwap("counter", r->kv ? r->kv->mod_revision : 0,
                                     std::to_string(v + 1), kNoLease, kFar);
        if (!cas.ok()) {
          ADD_FAILURE() << cas.status();
          ++failures;
          return;
        }
        if (cas->swapped) ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto r = handles[0]->Get("counter", kFar);
  ASSERT_TRUE(r.ok() && r->kv);
  EXPECT_EQ(r->kv->value, std::to_string(kPerThread * handles.size()));
}

TEST(MemoryCoordinatorTest, CasRaceFromThreadsLosesNoIncrement) {
  auto c = MemoryCoordinator::Open({});
  std::vector<std::unique_ptr<MemoryCoordinator>> more;
  std::vector<Coordinator*> handles{c.get()};
  for (int i = 0; i < 3; ++i) {
    more.push_back(c->Share());
    handles.push_back(more.back().get());
  }
  CasCounterRace(handles);
}

// Two (here eight) deciders see the same epoch and promote the same shard:
// exactly one wins, and every loser is told the newer map.
void PromoteRace(const std::vector<Coordinator*>& handles) {
  ShardMap m{1, {{0, 1}, {1, 0}}};
  auto created = CreateShardMap(*handles[0], m, kFar);
  ASSERT_TRUE(created.ok() && created->won) << created.status();
  std::atomic<int> winners{0}, losers{0}, errors{0};
  std::vector<std::thread> threads;
  for (Coordinator* h : handles) {
    threads.emplace_back([&, h] {
      auto r = Promote(*h, 0, 1, kFar);
      if (!r.ok()) {
        ++errors;
        return;
      }
      (r->won ? winners : losers)++;
      if (r->now.map.epoch != 2 || r->now.map.shards[0].primary != 1) ++errors;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(losers.load(), static_cast<int>(handles.size()) - 1);
  EXPECT_EQ(errors.load(), 0);
  auto now = ReadShardMap(*handles[0], kFar);
  ASSERT_TRUE(now.ok() && *now);
  EXPECT_EQ((*now)->map, (ShardMap{2, {{1, kNoServer}, {1, 0}}}));
}

TEST(MemoryCoordinatorTest, ConcurrentPromotesHaveExactlyOneWinner) {
  auto c = MemoryCoordinator::Open({});
  std::vector<std::unique_ptr<MemoryCoordinator>> more;
  std::vector<Coordinator*> handles{c.get()};
  for (int i = 0; i < 7; ++i) {
    more.push_back(c->Share());
    handles.push_back(more.back().get());
  }
  PromoteRace(handles);
}

TEST(MemoryCoordinatorTest, WatchWakesOnPutAndTimesOut) {
  auto c = MemoryCoordinator::Open({});
  const std::int64_t seen = c->Get("shard_map", kFar)->revision;
  Result<std::int64_t> woke = TimedOutError("not run");
  std::thread waiter(
      [&] { woke = c->WaitForChange("shard_map", false, seen, In(milliseconds(30000))); });
  // Unrelated keys do not wake it; the watched one does, whenever the
  // waiter got there (it waits for a revision, not for a signal).
  auto other = c->CompareAndSwap("other", 0, "x", kNoLease, kFar);
  auto put = c->CompareAndSwap("shard_map", 0, "m", kNoLease, kFar);
  waiter.join();
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_EQ(*woke, put->revision);
  EXPECT_GT(*woke, other->revision);
  // Nothing newer: TimedOut at the deadline.
  auto idle = c->WaitForChange("shard_map", false, put->revision, In(milliseconds(20)));
  EXPECT_EQ(idle.status().code(), StatusCode::kTimedOut) << idle.status();
  // Already changed since the given revision: returns at once.
  auto past = c->WaitForChange("shard_map", false, seen, In(milliseconds(0)));
  EXPECT_TRUE(past.ok());
}

TEST(MemoryCoordinatorTest, WatchWakesOnLeaseExpiryUnderPrefix) {
  auto c = Fake();
  auto lease = c->GrantLease(milliseconds(50), kFar);
  auto put = c->CompareAndSwap("members/w3", 0, "", lease->id, kFar);
  ASSERT_TRUE(put.ok() && put->swapped);
  Result<std::int64_t> woke = TimedOutError("not run");
  std::thread waiter(
      [&] { woke = c->WaitForChange("members/", true, put->revision, In(milliseconds(30000))); });
  c->TEST_AdvanceClock(milliseconds(50));
  waiter.join();
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_GT(*woke, put->revision);
  EXPECT_TRUE(c->List("members/", kFar)->kvs.empty());
}

TEST(MemoryCoordinatorTest, RealClockExpiryWakesAWatcher) {
  auto c = MemoryCoordinator::Open({});
  auto lease = c->GrantLease(milliseconds(30), kFar);
  auto put = c->CompareAndSwap("servers/1", 0, "", lease->id, kFar);
  // No renewal: the watcher must wake at the expiry although nobody writes.
  auto woke = c->WaitForChange("servers/1", false, put->revision, In(milliseconds(30000)));
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_FALSE(c->Get("servers/1", kFar)->kv.has_value());
}

TEST(MemoryCoordinatorTest, NamedStoresAreSharedAndPrefixed) {
  auto a = OpenCoordinator(Opts("memory:t1", "job-a/"));
  auto b = OpenCoordinator(Opts("memory:t1", "job-a/"));
  auto other = OpenCoordinator(Opts("memory:t1", "job-b/"));
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  ASSERT_TRUE((*a)->CompareAndSwap("k", 0, "v", kNoLease, kFar)->swapped);
  EXPECT_EQ((*b)->Get("k", kFar)->kv->value, "v");
  EXPECT_FALSE((*other)->Get("k", kFar)->kv.has_value());
  auto bad = OpenCoordinator(Opts("zookeeper://x"));
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("etcd://"), std::string::npos);
}

// --- DirectoryCoordinator ---------------------------------------------------

class DirectoryCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmaps-coord-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_ = base_ + "/coord";
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::unique_ptr<DirectoryCoordinator> Open() {
    auto c = DirectoryCoordinator::Open(dir_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::string base_, dir_;
};

TEST_F(DirectoryCoordinatorTest, HandlesShareOneStore) {
  auto a = Open();
  auto b = Open();
  ASSERT_TRUE(a && b);
  struct stat st {};
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto put = a->CompareAndSwap("k", 0, std::string("v\0w", 3), kNoLease, kFar);
  ASSERT_TRUE(put.ok() && put->swapped) << put.status();
  auto got = b->Get("k", kFar);
  ASSERT_TRUE(got.ok() && got->kv);
  EXPECT_EQ(got->kv->value, std::string("v\0w", 3));
  EXPECT_FALSE(b->CompareAndSwap("k", 0, "x", kNoLease, kFar)->swapped);
  auto lease = b->GrantLease(milliseconds(5000), kFar);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(b->CompareAndSwap("m/1", 0, "", lease->id, kFar)->swapped);
  EXPECT_TRUE(a->KeepAlive(lease->id, kFar).ok());
  EXPECT_EQ(a->List("m/", kFar)->kvs.size(), 1u);
  ASSERT_TRUE(a->RevokeLease(lease->id, kFar).ok());
  EXPECT_TRUE(b->List("m/", kFar)->kvs.empty());
  EXPECT_EQ(b->KeepAlive(lease->id, kFar).code(), StatusCode::kNotFound);
}

TEST_F(DirectoryCoordinatorTest, CasRaceAndPromoteRaceAcrossHandles) {
  std::vector<std::unique_ptr<DirectoryCoordinator>> owned;
  std::vector<Coordinator*> handles;
  for (int i = 0; i < 4; ++i) {
    owned.push_back(Open());
    handles.push_back(owned.back().get());
  }
  CasCounterRace(handles);
  PromoteRace(handles);
}

TEST_F(DirectoryCoordinatorTest, WatchWakesOnAnotherHandlesPut) {
  auto a = Open();
  auto b = Open();
  const std::int64_t seen = a->Get("shard_map", kFar)->revision;
  Result<std::int64_t> woke = TimedOutError("not run");
  std::thread waiter(
      [&] { woke = a->WaitForChange("shard_map", false, seen, In(milliseconds(30000))); });
  auto put = b->CompareAndSwap("shard_map", 0, "m", kNoLease, kFar);
  waiter.join();
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_EQ(*woke, put->revision);
  auto idle = a->WaitForChange("shard_map", false, put->revision, In(milliseconds(20)));
  EXPECT_EQ(idle.status().code(), StatusCode::kTimedOut);
}

// A process that holds a lease and is killed -9: its key vanishes within
// the TTL, seen by a watcher in another process.
TEST_F(DirectoryCoordinatorTest, KilledProcessLosesItsKeyWithinTheTtl) {
  auto parent = Open();
  ASSERT_TRUE(parent);
  const std::int64_t before = parent->Get("servers/0", kFar)->revision;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = DirectoryCoordinator::Open(dir_);
    if (!c.ok()) _exit(1);
    auto lease = (*c)->GrantLease(milliseconds(200), kFar);
    if (!lease.ok()) _exit(2);
    auto put = (*c)->CompareAndSwap("servers/0", 0, "child", lease->id, kFar);
    if (!put.ok() || !put->swapped) _exit(3);
    char ok = 'y';
    if (write(ready[1], &ok, 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char got = 0;
  ASSERT_EQ(read(ready[0], &got, 1), 1);
  close(ready[0]);
  auto held = parent->Get("servers/0", kFar);
  ASSERT_TRUE(held.ok() && held->kv);
  EXPECT_EQ(held->kv->value, "child");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  auto woke =
      parent->WaitForChange("servers/0", false, held->kv->mod_revision, In(milliseconds(30000)));
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_GT(*woke, before);
  EXPECT_FALSE(parent->Get("servers/0", kFar)->kv.has_value());
}

TEST_F(DirectoryCoordinatorTest, RefusesADirectoryOthersCanEnter) {
  ASSERT_TRUE(Open());
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  auto c = DirectoryCoordinator::Open(dir_);
  ASSERT_EQ(c.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("chmod 700"), std::string::npos) << c.status();
  auto rel = DirectoryCoordinator::Open("relative/dir");
  EXPECT_EQ(rel.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DirectoryCoordinatorTest, CorruptStateIsAClearError) {
  auto c = Open();
  ASSERT_TRUE(c->CompareAndSwap("k", 0, "v", kNoLease, kFar)->swapped);
  {
    std::ofstream f(dir_ + "/g.1", std::ios::binary | std::ios::trunc);  // the head
    f << "RDMAPSCS garbage";
  }
  auto r = c->Get("k", kFar);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("corrupt"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace rdmaps::internal

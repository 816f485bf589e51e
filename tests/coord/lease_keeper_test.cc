// The lease keeper: it keeps its key alive past many TTLs, reports a lost
// lease (revoked, or not renewed), and - the fencing property - stops
// calling itself valid before the coordinator lets its key go.
#include "src/cluster/lease_keeper.h"

#include <gtest/gtest.h>

#include <atomic>

#include "src/cluster/embedded_coordinator.h"

namespace rdmaps::internal {
namespace {

using std::chrono::milliseconds;
const CoordDeadline kFar = CoordClock::time_point::max();
CoordDeadline In(milliseconds ms) { return CoordClock::now() + ms; }

TEST(LeaseKeeperTest, DefaultDetectsWithinOneSecond) {
  EXPECT_LE(kDefaultLeaseTtl, milliseconds(1000));
  LeaseKeeperOptions o;
  EXPECT_EQ(o.ttl, kDefaultLeaseTtl);
}

TEST(LeaseKeeperTest, KeepsTheKeyAliveAcrossManyTtls) {
  auto c = MemoryCoordinator::Open({});
  LeaseKeeperOptions o;
  o.ttl = milliseconds(600);
  o.key = "servers/0";
  o.value = "tcp://127.0.0.1:1";
  auto k = LeaseKeeper::Start(c.get(), o, kFar);
  ASSERT_TRUE(k.ok()) << k.status();
  auto held = c->Get("servers/0", kFar);
  ASSERT_TRUE(held.ok() && held->kv);
  EXPECT_EQ(held->kv->lease, (*k)->lease());
  // Three TTLs without a change to the key: it was renewed all along.
  auto w = c->WaitForChange("servers/0", false, held->kv->mod_revision, In(milliseconds(1800)));
  EXPECT_EQ(w.status().code(), StatusCode::kTimedOut) << w.status();
  EXPECT_TRUE((*k)->Valid());
  EXPECT_TRUE((*k)->status().ok());
  (*k)->Stop();  // revokes: the key goes now, not a TTL later
  EXPECT_FALSE(c->Get("servers/0", kFar)->kv.has_value());
  EXPECT_FALSE((*k)->Valid());
}

TEST(LeaseKeeperTest, ReplacesAKeyLeftByAnEarlierIncarnation) {
  auto c = MemoryCoordinator::Open({});
  auto old = c->GrantLease(milliseconds(60000), kFar);
  ASSERT_TRUE(c->CompareAndSwap("servers/0", 0, "old", old->id, kFar)->swapped);
  LeaseKeeperOptions o;
  o.key = "servers/0";
  o.value = "new";
  auto k = LeaseKeeper::Start(c.get(), o, kFar);
  ASSERT_TRUE(k.ok()) << k.status();
  auto now = c->Get("servers/0", kFar);
  EXPECT_EQ(now->kv->value, "new");
  EXPECT_EQ(now->kv->lease, (*k)->lease());
}

TEST(LeaseKeeperTest, ReportsARevokedLeaseOnce) {
  auto c = MemoryCoordinator::Open({});
  std::atomic<int> calls{0};
  LeaseKeeperOptions o;
  o.ttl = milliseconds(300);
  o.on_lost = [&](const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
    ++calls;
  };
  auto k = LeaseKeeper::Start(c.get(), o, kFar);
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(c->RevokeLease((*k)->lease(), kFar).ok());  // e.g. an operator, or a bug
  Status lost = (*k)->WaitUntilLost(In(milliseconds(30000)));
  EXPECT_EQ(lost.code(), StatusCode::kNotFound) << lost;
  EXPECT_FALSE((*k)->Valid());
  (*k)->Stop();
  EXPECT_EQ(calls.load(), 1);
}

// A server that is slow (here: its renewals stop) must consider itself
// fenced before the coordinator frees its key for a new primary.
TEST(LeaseKeeperTest, ASlowHolderStopsBeingValidBeforeItsKeyGoes) {
  auto c = MemoryCoordinator::Open({});
  LeaseKeeperOptions o;
  o.ttl = milliseconds(200);
  o.key = "servers/1";
  auto k = LeaseKeeper::Start(c.get(), o, kFar);
  ASSERT_TRUE(k.ok()) << k.status();
  const auto held = c->Get("servers/1", kFar);
  ASSERT_TRUE(held->kv);
  (*k)->TEST_PauseRenewals(true);
  // The decider's view: the key vanishes at the coordinator...
  auto gone = c->WaitForChange("servers/1", false, held->kv->mod_revision, In(milliseconds(30000)));
  ASSERT_TRUE(gone.ok()) << gone.status();
  // ...and by then the holder already knew it may not act.
  EXPECT_FALSE((*k)->Valid());
  EXPECT_LE((*k)->valid_until(), CoordClock::now());
  Status lost = (*k)->WaitUntilLost(In(milliseconds(30000)));
  EXPECT_FALSE(lost.ok());
}

TEST(LeaseKeeperTest, RefusesBadOptions) {
  auto c = MemoryCoordinator::Open({});
  LeaseKeeperOptions o;
  o.ttl = milliseconds(1);
  EXPECT_EQ(LeaseKeeper::Start(c.get(), o, kFar).status().code(), StatusCode::kInvalidArgument);
  o.ttl = kDefaultLeaseTtl;
  o.key = "bad key";
  EXPECT_EQ(LeaseKeeper::Start(c.get(), o, kFar).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rdmaps::internal

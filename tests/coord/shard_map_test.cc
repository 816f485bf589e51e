// The shard map's record: encoded as documented, parsed strictly, and the
// publish helpers (create, promote, set backup, wait) on a coordinator.
#include "src/cluster/shard_map.h"

#include <gtest/gtest.h>

#include <thread>

#include "src/cluster/embedded_coordinator.h"

namespace rdmaps::internal {
namespace {

const CoordDeadline kFar = CoordClock::time_point::max();

TEST(ShardMapTest, EncodesTheDocumentedText) {
  ShardMap m{7, {{0, 1}, {1, kNoServer}}};
  EXPECT_EQ(EncodeShardMap(m),
            "rdmaps shard map v1\nepoch 7\nshard 0 primary 0 backup 1\n"
            "shard 1 primary 1 backup -\n");
  auto back = ParseShardMap(EncodeShardMap(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);
  EXPECT_EQ(ShardMapSummary(m), "epoch 7: 0->0/1 1->1/-");
}

TEST(ShardMapTest, RefusesAnythingElse) {
  const std::string ok = "rdmaps shard map v1\nepoch 7\nshard 0 primary 0 backup 1\n";
  ASSERT_TRUE(ParseShardMap(ok).ok());
  for (const std::string& bad : {
           std::string(""),
           std::string("rdmaps shard map v2\nepoch 7\nshard 0 primary 0 backup 1\n"),
           std::string("rdmaps shard map v1\nepoch 7\nshard 0 primary 0 backup 1"),  // no \n
           std::string("rdmaps shard map v1\nepoch 0\nshard 0 primary 0 backup 1\n"),
           std::string("rdmaps shard map v1\nepoch 07\nshard 0 primary 0 backup 1\n"),
           std::string("rdmaps shard map v1\nepoch -1\nshard 0 primary 0 backup 1\n"),
           std::string(
               "rdmaps shard map v1\nepoch 18446744073709551616\nshard 0 primary 0 backup 1\n"),
           std::string("rdmaps shard map v1\nepoch 7\n"),                              // no shards
           std::string("rdmaps shard map v1\nepoch 7\nshard 1 primary 0 backup 1\n"),  // order
           std::string("rdmaps shard map v1\nepoch 7\nshard 0 primary 0 backup 0\n"),  // same
           std::string("rdmaps shard map v1\nepoch 7\nshard 0 primary - backup 1\n"),
           std::string("rdmaps shard map v1\nepoch 7\nshard 0 primary 65536 backup 1\n"),
           std::string("rdmaps shard map v1\nepoch 7\nshard 0 primary 0 backup 1 \n"),
           std::string("rdmaps shard map v1\nepoch 7\nshard 0  primary 0 backup 1\n"),
           std::string("rdmaps shard map v1\nepoch 7\nshard 0 primary 0 backup 1\n\n"),
           std::string("rdmaps shard map v1\r\nepoch 7\nshard 0 primary 0 backup 1\n"),
       }) {
    auto r = ParseShardMap(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "accepted: " << bad;
  }
}

TEST(ShardMapTest, CreateIsOnceAndReplaceNeedsTheNextEpoch) {
  auto c = MemoryCoordinator::Open({});
  ShardMap m{1, {{0, 1}, {1, 0}}};
  auto first = CreateShardMap(*c, m, kFar);
  ASSERT_TRUE(first.ok() && first->won);
  auto second = CreateShardMap(*c, ShardMap{1, {{1, 0}, {0, 1}}}, kFar);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->won);
  EXPECT_EQ(second->now.map, m);  // the first one stays
  auto skip = ReplaceShardMap(*c, first->now, ShardMap{3, m.shards}, kFar);
  EXPECT_EQ(skip.status().code(), StatusCode::kInvalidArgument);
}

TEST(ShardMapTest, PromoteAndReprotect) {
  auto c = MemoryCoordinator::Open({});
  ASSERT_TRUE(CreateShardMap(*c, ShardMap{1, {{0, 1}, {1, 0}}}, kFar)->won);
  // A decider with an old epoch loses and learns the current map.
  auto stale = Promote(*c, 0, 0, kFar);
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->won);
  EXPECT_EQ(stale->now.map.epoch, 1u);
  auto p = Promote(*c, 0, 1, kFar);
  ASSERT_TRUE(p.ok() && p->won) << p.status();
  EXPECT_EQ(p->now.map, (ShardMap{2, {{1, kNoServer}, {1, 0}}}));
  // Nothing left to promote.
  EXPECT_EQ(Promote(*c, 0, 2, kFar).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Promote(*c, 9, 2, kFar).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SetBackup(*c, 0, 1, 2, kFar).status().code(), StatusCode::kInvalidArgument);
  auto b = SetBackup(*c, 0, 2, 2, kFar);
  ASSERT_TRUE(b.ok() && b->won) << b.status();
  EXPECT_EQ(b->now.map, (ShardMap{3, {{1, 2}, {1, 0}}}));
  auto read = ReadShardMap(*c, kFar);
  ASSERT_TRUE(read.ok() && *read);
  EXPECT_EQ((*read)->map, b->now.map);
  EXPECT_EQ((*read)->mod_revision, b->now.mod_revision);
}

TEST(ShardMapTest, WaitForShardMapReturnsOnlyANewerEpoch) {
  auto c = MemoryCoordinator::Open({});
  ASSERT_TRUE(CreateShardMap(*c, ShardMap{1, {{0, 1}}}, kFar)->won);
  Result<VersionedShardMap> got = TimedOutError("not run");
  std::thread worker(
      [&] { got = WaitForShardMap(*c, 1, CoordClock::now() + std::chrono::seconds(30)); });
  ASSERT_TRUE(Promote(*c, 0, 1, kFar)->won);
  worker.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->map.epoch, 2u);
  auto none = WaitForShardMap(*c, 2, CoordClock::now() + std::chrono::milliseconds(20));
  EXPECT_EQ(none.status().code(), StatusCode::kTimedOut);
}

TEST(ShardMapTest, AGarbledRecordIsDataLoss) {
  auto c = MemoryCoordinator::Open({});
  ASSERT_TRUE(c->CompareAndSwap(kShardMapKey, 0, "not a map", kNoLease, kFar)->swapped);
  auto r = ReadShardMap(*c, kFar);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace rdmaps::internal

// The pull plan without a transport: which runs of which servers' shards a
// pull of a range or of row ids becomes.
#include "src/ps/pull_reader.h"

#include <gtest/gtest.h>

#include <vector>

namespace rdmaps::internal {
namespace {

// (Inside a TEST, `Run` names testing::Test::Run.)
using Runs = std::vector<Run>;

// A table of `rows` rows over `S` servers, shards as the partition says.
RemoteTable TableOn(std::uint32_t S, std::uint64_t rows) {
  RemoteTable t;
  t.info.rows = rows;
  t.info.dim = 4;
  for (std::uint32_t s = 0; s < S; ++s) {
    const ShardRange r = PartitionOf(rows, S, s);
    t.shards.push_back({r.begin, r.count, 0, 0, GeometryOf(kLayoutDense, r.count, 4, 1)});
  }
  return t;
}

void ExpectRun(const Run& r, std::uint32_t server, std::uint64_t local, std::uint64_t count,
               std::uint64_t out_row) {
  EXPECT_EQ(r.server, server);
  EXPECT_EQ(r.local, local);
  EXPECT_EQ(r.count, count);
  EXPECT_EQ(r.out_row, out_row);
}

TEST(PullPlanTest, ARangeIsOneRunPerServerItTouches) {
  const RemoteTable t = TableOn(3, 10);  // shards [0,4) [4,7) [7,10)
  Runs runs;
  std::vector<std::uint32_t> involved;
  RunsOfRange(t, 3, RowRange{2, 7}, &runs, &involved);
  ASSERT_EQ(runs.size(), 3u);
  ExpectRun(runs[0], 0, 2, 2, 0);
  ExpectRun(runs[1], 1, 0, 3, 2);
  ExpectRun(runs[2], 2, 0, 2, 5);
  EXPECT_EQ(involved, (std::vector<std::uint32_t>{0, 1, 2}));

  runs.clear();
  involved.clear();
  RunsOfRange(t, 3, RowRange{5, 1}, &runs, &involved);
  ASSERT_EQ(runs.size(), 1u);
  ExpectRun(runs[0], 1, 1, 1, 0);
  EXPECT_EQ(involved, (std::vector<std::uint32_t>{1}));
}

TEST(PullPlanTest, EmptyShardsAreSkipped) {
  const RemoteTable t = TableOn(5, 2);  // servers 2..4 hold nothing
  Runs runs;
  std::vector<std::uint32_t> involved;
  RunsOfRange(t, 5, RowRange{0, 2}, &runs, &involved);
  ASSERT_EQ(runs.size(), 2u);
  ExpectRun(runs[0], 0, 0, 1, 0);
  ExpectRun(runs[1], 1, 0, 1, 1);
  EXPECT_EQ(involved, (std::vector<std::uint32_t>{0, 1}));
}

TEST(PullPlanTest, RowIdsMergeOnlyWhenConsecutiveInShardAndOutput) {
  const RemoteTable t = TableOn(2, 10);  // shards [0,5) [5,10)
  const std::vector<std::uint64_t> ids = {1, 2, 3, 7, 8, 3, 4, 5, 9};
  Runs runs;
  std::vector<std::uint32_t> involved;
  RunsOfRows(t, 2, ids, &runs, &involved);
  ASSERT_EQ(runs.size(), 5u);
  ExpectRun(runs[0], 0, 1, 3, 0);  // 1 2 3
  ExpectRun(runs[1], 1, 2, 2, 3);  // 7 8
  ExpectRun(runs[2], 0, 3, 2, 5);  // 3 4 (a repeat starts a new run)
  ExpectRun(runs[3], 1, 0, 1, 7);  // 5: the next shard
  ExpectRun(runs[4], 1, 4, 1, 8);  // 9: not after 5
  EXPECT_EQ(involved, (std::vector<std::uint32_t>{0, 1}));
}

TEST(PullPlanTest, RowIdsOfOneServerInvolveOnlyIt) {
  const RemoteTable t = TableOn(3, 9);
  const std::vector<std::uint64_t> ids = {8, 6, 7};
  Runs runs;
  std::vector<std::uint32_t> involved;
  RunsOfRows(t, 3, ids, &runs, &involved);
  ASSERT_EQ(runs.size(), 2u);
  ExpectRun(runs[0], 2, 2, 1, 0);
  ExpectRun(runs[1], 2, 0, 2, 1);
  EXPECT_EQ(involved, (std::vector<std::uint32_t>{2}));
}

}  // namespace
}  // namespace rdmaps::internal

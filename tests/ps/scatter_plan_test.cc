// The scattered-pull planner (src/ps/scatter_plan.h): which mechanism it
// picks for the shapes docs/ps.md names, and that the crossover sits where
// each transport's measured constants put it.
#include "src/ps/scatter_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "src/ps/wire.h"

namespace rdmaps::internal {
namespace {

// One server holding every row of an inline table of `rows` x `dim`, checked
// in blocks of `rows_per_block`.
RemoteTable InlineTable(std::uint64_t rows, std::uint32_t dim, std::uint32_t rows_per_block) {
  RemoteTable t;
  t.info.rows = rows;
  t.info.dim = dim;
  t.layout = kLayoutInline;
  t.rows_per_block = rows_per_block;
  ShardRemote sh;
  sh.begin = 0;
  sh.count = rows;
  sh.geo = GeometryOf(kLayoutInline, rows, dim, rows_per_block);
  t.block_stride = sh.geo.block_stride;
  t.shards.push_back(sh);
  return t;
}

std::vector<std::uint64_t> Shuffled(std::uint64_t n, std::uint64_t keep) {
  std::vector<std::uint64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937_64 rng(15);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(keep);
  return ids;
}

// Every `stride`-th row of the table, shuffled: runs of one id each, with
// stride * 272 bytes of span per run in a 65536 x 64 table (272-byte blocks).
std::vector<std::uint64_t> EveryNth(std::uint64_t rows, std::uint64_t stride) {
  std::vector<std::uint64_t> ids;
  for (std::uint64_t r = 0; r < rows; r += stride) ids.push_back(r);
  std::mt19937_64 rng(7);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

TEST(ScatterPlanTest, TheShapesOfTheDocsTakeTheirMechanismOnEveryTransport) {
  const RemoteTable tiny = InlineTable(1000000, 1, 64);  // ps-shapes' "tiny"
  const RemoteTable emb = InlineTable(65536, 64, 1);     // ps-shapes' "emb"
  for (const char* kind : {"tcp", "verbs", "fake"}) {
    SCOPED_TRACE(kind);
    const PullCosts c = CostsOf(kind);
    // A million shuffled ids of a million rows: the whole table by span.
    const auto all = Shuffled(1000000, 1000000);
    const SpanPlan p = PlanScatteredPull(tiny, 1, all, c);
    EXPECT_TRUE(p.use_span);
    EXPECT_LT(p.span_us * 10, p.per_row_us) << "the span should win by far";
    EXPECT_EQ(p.scratch_rows, 1000000u);
    // 32 random ids of the embedding table: row by row.
    EXPECT_FALSE(PlanScatteredPull(emb, 1, Shuffled(65536, 32), c).use_span);
  }
}

TEST(ScatterPlanTest, TheCrossoverIsTheRatioOfTheMeasuredConstants) {
  const RemoteTable emb = InlineTable(65536, 64, 1);  // 272-byte blocks
  for (const char* kind : {"tcp", "verbs"}) {
    SCOPED_TRACE(kind);
    const PullCosts c = CostsOf(kind);
    const double crossover = c.op_us / c.byte_us;  // bytes of span per run
    const auto stride_at = [&](double bytes) {
      return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(bytes / 272));
    };
    // Well under the crossover: span; well over it: per row.
    EXPECT_TRUE(PlanScatteredPull(emb, 1, EveryNth(65536, stride_at(crossover / 2)), c).use_span);
    EXPECT_FALSE(PlanScatteredPull(emb, 1, EveryNth(65536, stride_at(crossover * 2)), c).use_span);
  }
  // The transports differ where their crossovers do: 3 KB of span per run
  // is past tcp's (~1.2 KB) and short of verbs' (6 KB).
  const auto ids = EveryNth(65536, 3000 / 272);
  EXPECT_FALSE(PlanScatteredPull(emb, 1, ids, CostsOf("tcp")).use_span);
  EXPECT_TRUE(PlanScatteredPull(emb, 1, ids, CostsOf("verbs")).use_span);
}

TEST(ScatterPlanTest, ASpanBeyondTheScratchLimitIsNeverTaken) {
  // 2^20 rows of 256 floats (1 KiB + 16 B blocks): a span of two ids at the
  // ends is 1 GiB, over kSpanMaxBytes, however cheap the model says it is.
  const RemoteTable big = InlineTable(std::uint64_t{1} << 20, 256, 1);
  std::vector<std::uint64_t> ids;
  for (std::uint64_t r = 0; r < (std::uint64_t{1} << 20); r += 2) ids.push_back(r);
  const PullCosts free_bytes{100.0, 1e-12, 0.0};
  const SpanPlan p = PlanScatteredPull(big, 1, ids, free_bytes);
  EXPECT_LT(p.span_us, p.per_row_us);
  EXPECT_FALSE(p.use_span);
}

}  // namespace
}  // namespace rdmaps::internal

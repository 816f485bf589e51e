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

// The same table on `servers` servers (PartitionOf's shards).
RemoteTable ShardedInlineTable(std::uint64_t rows, std::uint32_t dim, std::uint32_t rows_per_block,
                               std::uint32_t servers) {
  RemoteTable t = InlineTable(rows, dim, rows_per_block);
  t.shards.clear();
  for (std::uint32_t si = 0; si < servers; ++si) {
    const ShardRange r = PartitionOf(rows, servers, si);
    ShardRemote sh;
    sh.begin = r.begin;
    sh.count = r.count;
    sh.geo = GeometryOf(kLayoutInline, r.count, dim, rows_per_block);
    t.shards.push_back(sh);
  }
  return t;
}

TEST(ScatterPlanTest, SummarizeIdsCountsSpanAndRunsLikeTheNaiveLoop) {
  EXPECT_EQ(SummarizeIds({}).runs, 0u);
  EXPECT_EQ(MaxId({}), 0u);
  std::mt19937_64 rng(3);
  for (std::size_t n : {1, 2, 3, 4, 5, 7, 64, 1001}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<std::uint64_t> ids(n);
      // Runs of consecutive ids of random lengths, repeats and a few huge ids.
      std::uint64_t next = rng() % 1000;
      for (auto& id : ids) {
        if (rng() % 3 == 0)
          next = rng() % 5 == 0 ? (std::uint64_t{1} << 62) + rng() % 9 : rng() % 1000;
        id = next++;
      }
      std::uint64_t lo = ~std::uint64_t{0}, hi = 0, runs = 0;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        lo = std::min(lo, ids[i]);
        hi = std::max(hi, ids[i]);
        if (i == 0 || ids[i] != ids[i - 1] + 1) ++runs;
      }
      const IdSummary s = SummarizeIds(ids);
      EXPECT_EQ(s.min, lo) << n;
      EXPECT_EQ(s.max, hi) << n;
      EXPECT_EQ(s.runs, runs) << n;
      EXPECT_EQ(MaxId(ids), hi) << n;
    }
  }
}

TEST(ScatterPlanTest, OneServersFastPathPlansWhatTheGeneralLoopPlans) {
  // The one-server summary against the general loop, which a table whose
  // shard does not start at row 0 takes (a shifted copy of the same shard).
  const RemoteTable tiny = InlineTable(300000, 1, 64);
  RemoteTable shifted = tiny;
  shifted.info.rows = 300001;
  shifted.shards[0].begin = 1;
  std::vector<std::uint64_t> ids = Shuffled(300000, 200000);
  std::vector<std::uint64_t> ids1(ids);
  for (auto& id : ids1) ++id;
  for (const char* kind : {"tcp", "verbs"}) {
    const SpanPlan a = PlanScatteredPull(tiny, 1, ids, CostsOf(kind));
    const IdSummary sum = SummarizeIds(ids);
    const SpanPlan b = PlanScatteredPull(tiny, 1, ids, CostsOf(kind), &sum);
    const SpanPlan c = PlanScatteredPull(shifted, 1, ids1, CostsOf(kind));
    for (const SpanPlan* p : {&b, &c}) {
      EXPECT_EQ(p->use_span, a.use_span);
      EXPECT_EQ(p->lo, a.lo);
      EXPECT_EQ(p->hi, a.hi);
      EXPECT_DOUBLE_EQ(p->per_row_us, a.per_row_us);
      EXPECT_DOUBLE_EQ(p->span_us, a.span_us);
      EXPECT_EQ(p->scratch_rows, a.scratch_rows);
    }
  }
}

TEST(ScatterPlanTest, TheGatherPutsEveryRowOfItsId) {
  // 196608 ids with repeats, on one and on three servers, 1 and 3 floats
  // per row: every output row is the scratch row of its id.
  for (std::uint32_t servers : {1u, 3u}) {
    for (std::uint32_t dim : {1u, 3u}) {
      SCOPED_TRACE(std::to_string(servers) + " servers, dim " + std::to_string(dim));
      const std::uint64_t rows = 400000;
      const RemoteTable t = ShardedInlineTable(rows, dim, dim == 1 ? 64 : 16, servers);
      std::vector<std::uint64_t> ids = Shuffled(rows, 196608);
      for (std::size_t i = 0; i < ids.size(); i += 97) ids[i] = ids[i / 2];  // repeats
      const SpanPlan plan = PlanScatteredPull(t, servers, ids, CostsOf("tcp"));
      ASSERT_TRUE(plan.use_span);
      // Scratch row k of server si holds the id's floats: id * 10 + column.
      std::vector<float> scratch(plan.scratch_rows * dim);
      for (std::uint32_t si : plan.involved) {
        for (std::uint64_t l = plan.lo[si]; l <= plan.hi[si]; ++l) {
          const std::uint64_t id = t.shards[si].begin + l;
          for (std::uint32_t c = 0; c < dim; ++c) {
            scratch[(plan.scratch_row[si] + l - plan.lo[si]) * dim + c] =
                static_cast<float>(id * 10 + c);
          }
        }
      }
      std::vector<float> out(ids.size() * dim, -1.0f);
      GatherFromSpans(t, servers, plan, ids, scratch.data(), out.data());
      for (std::size_t i = 0; i < ids.size(); ++i) {
        for (std::uint32_t c = 0; c < dim; ++c) {
          ASSERT_EQ(out[i * dim + c], static_cast<float>(ids[i] * 10 + c)) << "output row " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace rdmaps::internal

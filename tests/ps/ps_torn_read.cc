// The torn-read matrix (see ps_suite.h): a writer thread rewrites rows
// (every float of a row holds the same value, so any tear is visible) while
// a client pulls them. No pull may return a torn row; the retries it needed
// are counted and printed. One cell per
//   staged | zero-copy (the destination is registered: torn rows land in the
//                       caller's buffer and are re-read in place)
//   x dense | inline | auto (resolved as the servers resolve it)
//   x rows of 64 B | 256 B (checked in blocks of 32 and 8 rows) | 1 KiB | 4 KiB
//     (blocks of one row).
// Each cell's table and range are chosen by row size alone, so the layouts
// of a row size see the same pulls:
//   blocked rows: a table of 4 blocks or 64 rows, pulled as rows [3, rows - 3):
//     the blocks at either end are wanted only in part (and staged), the ones
//     between wholly;
//   rows of one block: a table of 32 rows (auto resolves 4 KiB rows dense,
//     128 KiB a shard, and smaller ones inline), pulled as rows [3, 11):
//     inline rows land zero-copy by scattered READs, which carry 8 rows on
//     verbs (16 SGEs), so those pulls are 8 rows.
// Each cell is bounded: the writer rewrites those rows from the start until
// the reader has made kMinPulls pulls, or until kWriterDeadline (a writer
// that never stops can starve an optimistic reader of a block; the apply
// thread writes a row once per push), and the reader pulls until the writer
// is done.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "src/ps/test_hooks.h"
#include "src/ps/wire.h"
#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {

std::string TornReadCellName(const ::testing::TestParamInfo<TornReadCell>& info) {
  const TornReadCell& c = info.param;
  return c.backend.name + (c.zero_copy ? "_zero_copy_" : "_staged_") + RowLayoutName(c.layout) +
         "_" + std::to_string(c.row_bytes) + "B";
}

std::vector<TornReadCell> TornReadMatrix(const PsBackend& backend) {
  std::vector<TornReadCell> cells;
  for (bool zero_copy : {false, true}) {
    for (RowLayout layout : {RowLayout::kDense, RowLayout::kInline, RowLayout::kAuto}) {
      for (std::uint32_t row_bytes : {64u, 256u, 1024u, 4096u}) {
        cells.push_back({backend, zero_copy, layout, row_bytes});
      }
    }
  }
  return cells;
}

namespace {

constexpr int kMinPulls = 100;
constexpr auto kWriterDeadline = std::chrono::milliseconds(500);

TEST_P(PsTornReadTest, ConcurrentRewritesNeverYieldTornRows) {
  const TornReadCell& cell = GetParam();
  const std::uint32_t dim = cell.row_bytes / sizeof(float);
  const std::size_t row_bytes = internal::RowBytes(dim);
  const bool blocked = row_bytes < internal::kBlockMinRowBytes;
  // Rows per block of a dense or small inline table (kCheckBlockBytes).
  const std::uint64_t block = blocked ? internal::kCheckBlockBytes / row_bytes : 1;
  const std::uint64_t table_rows = blocked ? std::max<std::uint64_t>(64, 4 * block) : 32;
  const RowRange range = blocked ? RowRange{3, table_rows - 6} : RowRange{3, 8};
  const std::uint64_t rows_n = range.count;
  TableOptions table = MakeTable(1, "big", table_rows, dim, kAsp, Initializer::Constant(0.0f));
  table.layout = cell.layout;
  auto c = StartCluster(cell.backend.transport, 1, 1, {table});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  // The layout the servers chose, and the rows per block it implies.
  const auto resolved = static_cast<RowLayout>(
      internal::ResolveRowLayout(static_cast<std::uint32_t>(cell.layout), table_rows, dim, 1));
  ASSERT_EQ(cl.FindTable("big")->layout, resolved);
  ASSERT_EQ(internal::RowsPerBlock(static_cast<std::uint32_t>(resolved), table_rows, dim, 1),
            block);
  // What a pull stages (rows) and whether it lands any block in place. Staged
  // pulls copy every row. Zero-copy pulls of a dense table READ wholly wanted
  // blocks into place and stage the blocks at either end of the range, wanted
  // in part; of an inline table, scatter rows of 1 KiB and more into place
  // and stage smaller ones (blocks of several rows).
  std::uint64_t staged_rows = rows_n;
  bool in_place = false;
  if (cell.zero_copy && resolved == RowLayout::kDense) {
    staged_rows = blocked ? 2 * (block - 3) : 0;
    in_place = true;
  } else if (cell.zero_copy && !blocked) {
    staged_rows = 0;
    in_place = true;
  }
  std::vector<float> out(rows_n * dim);
  if (cell.zero_copy) {
    ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  }
  // The writer rewrites every row of the blocks the range touches.
  const std::uint64_t write_begin = range.begin / block * block;
  const std::uint64_t write_end = (range.begin + range.count + block - 1) / block * block;
  std::atomic<int> pulls_done{0};
  std::atomic<bool> writer_done{false};
  std::latch writer_running(1);  // the reader starts once the writer does
  auto rewrite = [&] {
    const auto deadline = std::chrono::steady_clock::now() + kWriterDeadline;
    for (int round = 1;
         pulls_done.load() < kMinPulls && std::chrono::steady_clock::now() < deadline; ++round) {
      for (std::uint64_t r = write_begin; r < write_end; ++r) {
        ASSERT_TRUE(internal::TEST_SetRow(*c.servers[0], 1, r, static_cast<float>(round)).ok());
      }
    }
  };
  std::thread writer([&] {
    writer_running.count_down();
    rewrite();
    writer_done.store(true);  // also when a rewrite failed, so the reader stops
  });
  writer_running.wait();
  std::uint64_t torn_rows = 0;
  int pulls = 0;
  while (pulls < kMinPulls || !writer_done.load()) {
    Status s = cl.Pull(1, range, out);
    if (!s.ok()) {
      ADD_FAILURE() << s;
      break;
    }
    for (std::uint64_t r = 0; r < rows_n; ++r) {
      for (std::uint32_t k = 1; k < dim; ++k) {
        if (out[r * dim + k] != out[r * dim]) {
          ++torn_rows;
          break;
        }
      }
    }
    pulls_done.store(++pulls);
  }
  writer.join();
  EXPECT_EQ(torn_rows, 0u);
  const ClientStats st = cl.stats();
  EXPECT_EQ(st.bytes_staged, static_cast<std::uint64_t>(pulls) * staged_rows * row_bytes);
  EXPECT_EQ(st.zero_copy_calls, in_place ? static_cast<std::uint64_t>(pulls) : 0u);
  std::printf("torn-read retries over %d pulls of %llu rows (%s, %s as %s, %zu B rows): %llu\n",
              pulls, static_cast<unsigned long long>(rows_n),
              cell.zero_copy ? "zero-copy" : "staged", RowLayoutName(cell.layout),
              RowLayoutName(resolved), row_bytes, static_cast<unsigned long long>(st.torn_retries));
}

// A pull of many scattered ids dense in their span is a range pull of the
// span into scratch and a gather (src/ps/scatter_plan.h): the same checked
// blocks, so a writer rewriting the rows never makes it return a torn row.
// Dense rows of 256 bytes (blocks of 8) and inline rows of 60 bytes (blocks
// of 4, 256 bytes: rows straddle cache lines).
TEST_P(PsTest, SpanPullsOfScatteredIdsNeverYieldTornRows) {
  TableOptions dense = MakeTable(1, "dense", 2048, 64, kAsp, Initializer::Constant(0.0f));
  TableOptions tiny = MakeTable(2, "tiny", 70000, 15, kAsp, Initializer::Constant(0.0f));
  tiny.layout = RowLayout::kAuto;  // embedding-shaped: inline, blocks of 256 bytes
  auto c = StartCluster(transport(), 1, 1, {dense, tiny});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  ASSERT_EQ(cl.FindTable("tiny")->layout, RowLayout::kInline);
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> dense_ids(2048), tiny_ids(20000);
  std::iota(dense_ids.begin(), dense_ids.end(), 0);
  std::shuffle(dense_ids.begin(), dense_ids.end(), rng);
  for (auto& id : tiny_ids) id = rng() % 4096;  // the rows the writer rewrites
  std::vector<float> dense_out(2048 * 64), tiny_out(20000 * 15);
  ASSERT_TRUE(cl.RegisterBuffer(dense_out).ok());
  std::atomic<int> pulls_done{0};
  std::atomic<bool> writer_done{false};
  std::latch writer_running(1);
  std::thread writer([&] {
    writer_running.count_down();
    const auto deadline = std::chrono::steady_clock::now() + kWriterDeadline;
    for (int round = 1;
         pulls_done.load() < kMinPulls && std::chrono::steady_clock::now() < deadline; ++round) {
      for (std::uint64_t r = 0; r < 2048; ++r) {
        if (!internal::TEST_SetRow(*c.servers[0], 1, r, static_cast<float>(round)).ok()) break;
        if (!internal::TEST_SetRow(*c.servers[0], 2, r, static_cast<float>(round)).ok()) break;
        if (!internal::TEST_SetRow(*c.servers[0], 2, r + 2048, static_cast<float>(round)).ok()) {
          break;
        }
      }
    }
    writer_done.store(true);
  });
  writer_running.wait();
  std::uint64_t torn_rows = 0;
  int pulls = 0;
  auto count_torn = [&](const std::vector<float>& out, std::uint32_t dim) {
    for (std::size_t r = 0; r < out.size() / dim; ++r) {
      for (std::uint32_t k = 1; k < dim; ++k) {
        if (out[r * dim + k] != out[r * dim]) {
          ++torn_rows;
          break;
        }
      }
    }
  };
  while (pulls < kMinPulls || !writer_done.load()) {
    Status s = cl.Pull(1, dense_ids, dense_out);
    if (s.ok()) s = cl.Pull(2, tiny_ids, tiny_out);
    if (!s.ok()) {
      ADD_FAILURE() << s;
      break;
    }
    count_torn(dense_out, 64);
    count_torn(tiny_out, 15);
    pulls_done.store(++pulls);
  }
  writer.join();
  EXPECT_EQ(torn_rows, 0u);
  const ClientStats st = cl.stats();
  EXPECT_EQ(st.span_pulls, 2u * pulls);  // every one of them took the span path
  std::printf("span pulls: %d x 2, torn-read retries %llu\n", pulls,
              static_cast<unsigned long long>(st.torn_retries));
}

}  // namespace
}  // namespace rdmaps::testing

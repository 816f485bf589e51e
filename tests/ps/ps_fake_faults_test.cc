// The parameter-server cases that need the fake backend's fault knobs
// (transport/fake/fake_transport.h), so they run on fake only: READs copied
// in pieces with a row rewritten in between (torn reads, first READ and
// re-READs, staged and in place, dense and inline; a row torn until the
// deadline), connections that take few segments per op, and a dropped
// connection (a dead worker). Everything else runs on every backend
// (ps_suite.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "src/ps/test_hooks.h"
#include "src/ps/wire.h"
#include "tests/ps/ps_test_util.h"
#include "transport/fake/fake_transport.h"

namespace rdmaps::testing {
namespace {

// Every row of `out` (rows of `dim` floats) holds one value throughout, as
// the torn-read tests write them: a torn row would mix two values.
void ExpectWholeRows(const std::vector<float>& out, std::size_t dim) {
  for (std::size_t r = 0; r < out.size() / dim; ++r) {
    for (std::size_t k = 1; k < dim; ++k) {
      ASSERT_EQ(out[r * dim + k], out[r * dim]) << "torn row " << r;
    }
  }
}

// Faults for a server endpoint: every READ of at least `row` bytes against
// it is copied in `pieces` pieces, with `hook` run between them (where a
// test rewrites rows to tear the READ).
transport::fake::Faults SplitReads(std::size_t row, std::size_t pieces,
                                   std::function<void(const transport::fake::ReadPiece&)> hook) {
  transport::fake::Faults f;
  f.inbound = true;
  f.read_pieces = pieces;
  f.read_split_min_bytes = row;
  f.between_read_pieces = std::move(hook);
  return f;
}

// Fires `rewrite` once per READ of `length` bytes, at the first piece
// boundary strictly inside bytes [begin, end) of it.
bool InsideOnce(const transport::fake::ReadPiece& p, std::uint64_t length, std::uint64_t begin,
                std::uint64_t end) {
  const std::uint64_t prev = p.length * (p.copied - 1) / p.pieces;
  return p.length == length && p.bytes_copied > begin && p.bytes_copied < end && prev <= begin;
}

// A pull of rows 0-3 while the "server" rewrites row 2 (data then header, as
// the apply thread does) half way through copying it, three times in a row:
// in the first READ and in two re-READs. The client must return one whole
// version of every row after exactly 3 retries.
// `registered`: the pull lands zero-copy in a registered buffer (for an
// inline table of rows of 1 KiB or more, scattered READs), so torn rows are
// re-read in place. Rows of 40 floats are checked in one block of all 4
// rows; rows of 256 floats one by one.
void ExpectTornRowRetried(RowLayout layout, bool registered = false, std::uint32_t dim = 40) {
  TableOptions table = MakeTable(1, "w", 4, dim, kAsp, Initializer::Constant(1.0f));
  table.layout = layout;
  auto c = StartCluster("fake", 1, 1, {table});
  ASSERT_EQ(c.clients.size(), 1u);
  Server& server = *c.servers[0];
  const auto lay = static_cast<std::uint32_t>(layout);
  const internal::ShardGeometry g =
      internal::GeometryOf(lay, 4, dim, internal::RowsPerBlock(lay, 4, dim, 1));
  const std::size_t row = internal::RowBytes(dim);
  // The pull's first READ of rows 0-3 (dense: their rows; inline: their
  // blocks) and the re-READ of row 2's block: lengths and where row 2 is in
  // them.
  // Staged inline READs stop after their last row; scattered ones (rows of
  // 1 KiB, registered) cover whole blocks, padding included.
  const std::uint64_t b2 = g.block_of(2), last = g.blocks() - 1;
  const std::uint64_t first_len =
      !g.inline_headers() ? 4 * row
      : registered
          ? g.bytes
          : last * g.block_stride + sizeof(internal::BlockHeader) + g.block_rows(last) * row;
  const std::uint64_t again_len = !g.inline_headers() ? g.block_rows(b2) * row
                                  : registered
                                      ? g.block_stride
                                      : sizeof(internal::BlockHeader) + g.block_rows(b2) * row;
  const std::uint64_t again_start = g.inline_headers() ? g.header(b2) : g.row(g.first_row(b2));
  int rewrites = 0;
  auto f = SplitReads(row, 8, [&](const transport::fake::ReadPiece& p) {
    const bool mid_row2 =
        InsideOnce(p, first_len, g.row(2), g.row(2) + row) ||
        InsideOnce(p, again_len, g.row(2) - again_start, g.row(2) - again_start + row);
    if (mid_row2 && rewrites < 3) {
      ++rewrites;
      ASSERT_TRUE(internal::TEST_SetRow(server, 1, 2, 1.0f + rewrites).ok());
    }
  });
  ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ServerEndpoint(server), f).ok());
  std::vector<float> out(4 * dim);
  if (registered) {
    ASSERT_TRUE(c.clients[0]->RegisterBuffer(out).ok());
  }
  ASSERT_TRUE(c.clients[0]->Pull(1, RowRange{0, 4}, out).ok());
  EXPECT_EQ(rewrites, 3);
  EXPECT_EQ(c.clients[0]->stats().torn_retries, 3u);
  EXPECT_EQ(c.clients[0]->stats().bytes_staged == 0, registered);
  ExpectWholeRows(out, dim);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[2 * dim], 4.0f);
}

TEST(PsFakeFaultsTest, TornReadIsDetectedAndRetried) { ExpectTornRowRetried(RowLayout::kDense); }

TEST(PsFakeFaultsTest, TornInlineRowIsDetectedAndRetried) {
  ExpectTornRowRetried(RowLayout::kInline);
}

TEST(PsFakeFaultsTest, TornInlineRowScatteredIntoARegisteredBufferIsRetriedInPlace) {
  ExpectTornRowRetried(RowLayout::kInline, /*registered=*/true, /*dim=*/256);
}

TEST(PsFakeFaultsTest, TornReadIntoARegisteredBufferIsRetried) {
  // Zero-copy: the torn row lands in the caller's buffer first; the client
  // must notice (its header disagrees) and re-read it in place.
  auto c =
      StartCluster("fake", 1, 1, {MakeTable(1, "w", 4, 40, kAsp, Initializer::Constant(1.0f))});
  ASSERT_EQ(c.clients.size(), 1u);
  Server& server = *c.servers[0];
  Client& cl = *c.clients[0];
  const std::size_t row = internal::RowBytes(40);
  int rewrites = 0;
  auto f = SplitReads(row, 8, [&](const transport::fake::ReadPiece& p) {
    // First READ: row 2 half copied. Re-READ: row 2 wholly copied (old),
    // rewritten before its header is read.
    const bool mid_row2 = p.length == 4 * row && p.bytes_copied == 2 * row + row / 2;
    const bool after_row2 = p.length == row && p.bytes_copied == row - row / 8;
    if ((mid_row2 || after_row2) && rewrites < 2) {
      ++rewrites;
      ASSERT_TRUE(internal::TEST_SetRow(server, 1, 2, 1.0f + rewrites).ok());
    }
  });
  ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ServerEndpoint(server), f).ok());
  std::vector<float> out(4 * 40);
  ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 4}, out).ok());
  EXPECT_EQ(rewrites, 2);
  EXPECT_EQ(cl.stats().torn_retries, 2u);
  EXPECT_EQ(cl.stats().bytes_staged, 0u) << "the pull copied through staging";
  EXPECT_EQ(cl.stats().zero_copy_calls, 1u);
  ExpectWholeRows(out, 40);
  EXPECT_EQ(out[2 * 40], 3.0f);
}

TEST(PsFakeFaultsTest, RowTornUntilTheDeadlineIsTimedOutAndTheClientStaysUsable) {
  // Row 1 (server 0) is rewritten during every READ of it: the pull gives up
  // at wait_timeout naming the row; rows on server 1 were read meanwhile.
  auto c =
      StartCluster("fake", 2, 1, {MakeTable(1, "w", 4, 40, kAsp, Initializer::Constant(1.0f))}, 8,
                   [](ClientOptions& o) { o.wait_timeout = std::chrono::milliseconds(300); });
  ASSERT_EQ(c.clients.size(), 1u);
  Server& server = *c.servers[0];
  const std::size_t row = internal::RowBytes(40);
  float value = 1.0f;
  // Every row READ is copied in several pieces, row 1 rewritten in between.
  auto f = SplitReads(row, 4, [&](const transport::fake::ReadPiece&) {
    ASSERT_TRUE(internal::TEST_SetRow(server, 1, 1, value += 1.0f).ok());
  });
  ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ServerEndpoint(server), f).ok());
  std::vector<float> out(4 * 40);
  Status s = c.clients[0]->Pull(1, RowRange{0, 4}, out);
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s;
  // Rows 0 and 1 are server 0's shard, checked as one block.
  EXPECT_NE(s.message().find("rows 0-1 (one checked block) of table 'w'"), std::string::npos) << s;
  ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ServerEndpoint(server), {}).ok());
  // Every connection is still in step: the next pulls work and are whole.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.clients[0]->Pull(1, RowRange{0, 4}, out).ok());
    ExpectWholeRows(out, 40);
    EXPECT_EQ(out[1 * 40], value);
    EXPECT_EQ(out[3 * 40], 1.0f);
  }
}

// A device with few SGEs per op (max_segments 1 or 2): pushes from a
// registered buffer send their pieces as WRITEs of their own before the
// header when they cannot be gathered, inline pulls stage rather than scatter;
// the results are the same as with 1024 segments.
TEST(PsFakeFaultsTest, FewSegmentsPerOpGiveTheSameResults) {
  for (std::size_t max_segments : {1u, 2u, 3u, 0u}) {
    SCOPED_TRACE("max_segments " + std::to_string(max_segments));
    auto c = StartCluster("fake", 2, 1, {InlineTable(1, "emb", 9, 256), MakeTable(2, "w", 9, 4)});
    ASSERT_EQ(c.clients.size(), 1u);
    Client& cl = *c.clients[0];
    transport::fake::Faults f;
    f.max_segments = max_segments;
    ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ClientEndpoint(cl), f).ok());
    std::vector<float> arena(2 * 9 * 256, 0.0f);
    std::span<float> grads(arena.data(), 9 * 256), out(arena.data() + 9 * 256, 9 * 256);
    ASSERT_TRUE(cl.RegisterBuffer(arena).ok());
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = -static_cast<float>(i);
    const std::vector<std::uint64_t> ids = {8, 2, 3, 5, 0, 7};  // gradients in five pieces
    for (std::uint32_t table : {1u, 2u}) {
      const std::uint32_t dim = table == 1 ? 256 : 4;
      ASSERT_TRUE(cl.Push(table, RowRange{0, 9}, grads.subspan(0, 9 * dim)).ok());
      ASSERT_TRUE(cl.Push(table, ids, grads.subspan(0, ids.size() * dim)).ok());
      ASSERT_TRUE(cl.Pull(table, RowRange{0, 9}, out.subspan(0, 9 * dim)).ok());
      // Zeros minus lr 1 times the gradients -i (range) and -(k * dim + d) (rows).
      std::vector<float> want(9 * dim, 0.0f);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] += static_cast<float>(i);
      for (std::size_t k = 0; k < ids.size(); ++k) {
        for (std::uint32_t d = 0; d < dim; ++d) {
          want[ids[k] * dim + d] += static_cast<float>(k * dim + d);
        }
      }
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(out[i], want[i], 1e-4f) << "table " << table << " float " << i;
      }
      ASSERT_TRUE(cl.Pull(table, ids, out.subspan(0, ids.size() * dim)).ok());
      for (std::size_t k = 0; k < ids.size(); ++k) {
        for (std::uint32_t d = 0; d < dim; ++d) {
          ASSERT_EQ(out[k * dim + d], want[ids[k] * dim + d]) << "table " << table << " row " << k;
        }
      }
    }
  }
}

// A PushPull of 8 slots (the whole ring) while the server's apply is
// paused: every slot is sent and the pull waits (read-my-writes). No READ of
// rows reaches the server before the apply resumes (the split-READ hook sees
// every READ of a row or more), and then each row holds its push.
TEST(PsFakeFaultsTest, PushPullReadsNoRowBeforeItsPushIsApplied) {
  auto c = StartCluster("fake", 1, 1, {MakeTable(1, "w", 32, 1000)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  Server& server = *c.servers[0];
  std::atomic<bool> paused{true};
  std::atomic<int> reads_while_paused{0}, row_reads{0};
  auto f = SplitReads(internal::RowBytes(1000), 2, [&](const transport::fake::ReadPiece& p) {
    if (p.copied != 1) return;
    ++row_reads;
    if (paused.load()) ++reads_while_paused;
  });
  ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ServerEndpoint(server), f).ok());
  std::vector<float> g(32 * 1000), out(32 * 1000, -1.0f);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 977);
  ASSERT_TRUE(cl.RegisterBuffer(g).ok());
  ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  internal::TEST_PauseApply(server, true);
  auto pushpull = std::async(std::launch::async, [&] {
    return cl.PushPull(1, RowRange{0, 32}, g, out);
  });
  // The pull waits for the slots (pull_waits counts it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (cl.stats().pull_waits == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(cl.stats().pull_waits, 0u);
  EXPECT_EQ(pushpull.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  paused = false;
  internal::TEST_PauseApply(server, false);
  const Status s = pushpull.get();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(reads_while_paused.load(), 0);
  EXPECT_GT(row_reads.load(), 0);
  // Zeros minus lr 1 times the gradient.
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], -g[i]) << i;
  EXPECT_EQ(server.stats().pushes_applied, 8u);
}

// A pipelined PushPull (registered output, dense table: its follower READs
// rows as the server applies the slots covering them) whose row READ is torn
// half way: the server rewrites the row being copied (data, then header, as
// the apply thread does). The follower must reject that block and the
// normal pull re-read it, so every row comes back whole and holding this
// push (or the rewrite, which comes after the row's apply), and each slot is
// applied once. Rounds go on until a tear hit a follower READ (not the
// normal pull's), which the first round does unless the machine is loaded.
TEST(PsFakeFaultsTest, PipelinedPushPullRereadsATornBlockAndAppliesEachSlotOnce) {
  constexpr std::uint64_t kRows = 32;
  constexpr std::uint32_t kDim = 1000;  // 4 rows per 16 KiB slot: 8 slots
  auto c = StartCluster("fake", 1, 1, {MakeTable(1, "w", kRows, kDim)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  Server& server = *c.servers[0];
  const std::size_t row = internal::RowBytes(kDim);
  std::vector<float> want(kRows, 0.0f);
  std::atomic<bool> armed{false};
  std::atomic<int> rewrites{0};
  std::atomic<float> rewrite_value{0.0f};
  // The first row READ of a round (from row 0), at its first piece boundary:
  // the row being copied there is rewritten.
  auto f = SplitReads(row, 2, [&](const transport::fake::ReadPiece& p) {
    if (p.copied != 1 || p.length < row || !armed.exchange(false)) return;
    const std::uint64_t r = (p.bytes_copied - 1) / row;
    ASSERT_TRUE(internal::TEST_SetRow(server, 1, r, rewrite_value.load()).ok());
    want[r] = rewrite_value.load();
    ++rewrites;
  });
  ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ServerEndpoint(server), f).ok());
  std::vector<float> g(kRows * kDim), out(kRows * kDim);
  for (std::uint64_t r = 0; r < kRows; ++r) {
    std::fill_n(g.begin() + r * kDim, kDim, -static_cast<float>(r + 1));
  }
  ASSERT_TRUE(cl.RegisterBuffer(g).ok());
  ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  int rounds = 0;
  while (internal::TEST_FollowerTornBlocks(cl) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    ++rounds;
    SCOPED_TRACE("round " + std::to_string(rounds));
    for (std::uint64_t r = 0; r < kRows; ++r) want[r] += static_cast<float>(r + 1);
    rewrite_value = 1000.0f * rounds;
    armed = true;
    std::fill(out.begin(), out.end(), -1.0f);
    const Status st = cl.PushPull(1, RowRange{0, kRows}, g, out);
    ASSERT_TRUE(st.ok()) << st;
    armed = false;
    for (std::uint64_t r = 0; r < kRows; ++r) {
      for (std::uint32_t d = 0; d < kDim; ++d) ASSERT_EQ(out[r * kDim + d], want[r]) << r;
    }
  }
  EXPECT_GT(internal::TEST_FollowerTornBlocks(cl), 0u) << "no tear hit a follower READ";
  EXPECT_GT(cl.stats().rows_pulled_pipelined, 0u);
  EXPECT_GE(cl.stats().torn_retries, internal::TEST_FollowerTornBlocks(cl));
  EXPECT_EQ(rewrites.load(), rounds);
  ASSERT_TRUE(cl.Flush().ok());
  EXPECT_EQ(server.stats().pushes_applied, 8u * rounds);
  EXPECT_EQ(server.stats().protocol_errors, 0u);
}

// A registered pull of ONE row of an inline table (rows of 1 KiB or more)
// is staged on a connection of few segments per op (verbs-like: 16), one
// contiguous READ and a copy, and scattered into the caller's buffer where
// segments are plenty (tcp-like: 1024); two rows are scattered on both.
TEST(PsFakeFaultsTest, OneRowIsStagedWhereSegmentsAreFew) {
  for (std::size_t max_segments : {16u, 0u}) {
    SCOPED_TRACE("max_segments " + std::to_string(max_segments));
    auto c =
        StartCluster("fake", 1, 1, {InlineTable(1, "emb", 8, 1024, Initializer::Constant(2.0f))});
    ASSERT_EQ(c.clients.size(), 1u);
    Client& cl = *c.clients[0];
    transport::fake::Faults f;
    f.max_segments = max_segments;
    ASSERT_TRUE(transport::fake::SetFaults(*internal::TEST_ClientEndpoint(cl), f).ok());
    std::vector<float> out(2 * 1024, -1.0f);
    ASSERT_TRUE(cl.RegisterBuffer(out).ok());
    std::uint64_t staged = cl.stats().bytes_staged;
    ASSERT_TRUE(cl.Pull(1, RowRange{3, 1}, std::span<float>(out).subspan(0, 1024)).ok());
    EXPECT_EQ(cl.stats().bytes_staged - staged, max_segments == 16 ? 4096u : 0u);
    for (std::size_t i = 0; i < 1024; ++i) ASSERT_EQ(out[i], 2.0f) << i;
    staged = cl.stats().bytes_staged;
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_TRUE(cl.Pull(1, RowRange{5, 2}, out).ok());
    EXPECT_EQ(cl.stats().bytes_staged - staged, 0u);
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 2.0f) << i;
  }
}

TEST(PsFakeFaultsTest, DeadWorkerIsReported) {
  auto c = StartCluster("fake", 1, 2, {MakeTable(1, "w", 4, 1)});
  ASSERT_EQ(c.clients.size(), 2u);
  ASSERT_TRUE(c.clients[0]->Close().ok());
  // Worker 1's cable is pulled.
  ASSERT_TRUE(
      transport::fake::DropConnection(*internal::TEST_ServerEndpoint(*c.servers[0]), 1).ok());
  Status s = c.servers[0]->RunUntil(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("[1]"), std::string::npos) << s;
  const ServerStats st = c.servers[0]->stats();
  ASSERT_EQ(st.dead_workers.size(), 1u);
  EXPECT_EQ(st.dead_workers[0], 1u);
  EXPECT_EQ(st.workers_done, 1u);
  // Worker 1 finds out on its next call, with the server named.
  std::vector<float> out(4);
  Status pulled = c.clients[1]->Pull(1, RowRange{0, 4}, out);
  EXPECT_FALSE(pulled.ok());
  EXPECT_NE(pulled.message().find("server 0"), std::string::npos) << pulled;
}

}  // namespace
}  // namespace rdmaps::testing

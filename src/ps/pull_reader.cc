#include "src/ps/pull_reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>

namespace rdmaps::internal {

using transport::Deadline;
using transport::Op;
using SteadyClock = std::chrono::steady_clock;

namespace {

// Ops one pull batch posts to a server (bounded by the connection's
// max_outstanding): a scattered pull of up to 256 rows is one round trip.
constexpr std::size_t kMaxOpsPerPost = 512;
// Large pulls are cut into READs of at most this size, so checking the rows of
// one overlaps the transfer of the next.
constexpr std::size_t kMaxReadBytes = 256 * 1024;
// Connections whose scattered READ carries fewer rows than this take "few
// segments" per op (verbs: 16 SGEs, 5-8 rows; tcp and fake: 1024 segments,
// 341-512 rows).
constexpr std::uint64_t kFewSegmentsRows = 64;

// Header and row-block strides of a piece's blocks where they land: inline
// blocks in staging keep their remote layout (header, rows, padding); rows
// in the caller's buffer or in dense staging lie back to back.
struct Strides {
  std::size_t header;
  std::size_t rows;
};
Strides StridesOf(const RemoteTable& t, bool user) {
  const std::size_t block_rows = t.rows_per_block * RowBytes(t.info.dim);
  if (!t.inline_headers()) return {sizeof(BlockHeader), block_rows};
  return {t.block_stride, user ? block_rows : t.block_stride};
}

// The READs of the blocks of `pc` (placed): for a dense table the rows (to
// pc.rows) and their headers (to pc.headers); for an inline table both at
// once, into staging or, with a registered caller buffer (blocks of one row,
// ScatterInline), scattered: each header (and the row's padding) to staging,
// each row to the caller's buffer. Returns the bytes they move.
std::size_t AddBlockReads(const ShardRemote& shard, const transport::MemoryRegion* staging,
                          const transport::MemoryRegion* user_mr, const Piece& pc,
                          ReadBatch* batch) {
  const ShardGeometry& g = shard.geo;
  const std::size_t row_bytes = g.row_bytes;
  if (g.inline_headers()) {
    const std::uint64_t remote = shard.base + g.header(pc.block);
    if (!pc.user) {
      // Up to the last row (a shard's last block may be short).
      const std::uint64_t last = pc.block + pc.count - 1;
      const std::size_t bytes =
          (pc.count - 1) * g.block_stride + sizeof(BlockHeader) + g.block_rows(last) * row_bytes;
      batch->Add(Op::Read(pc.headers, staging, bytes, remote, shard.rkey));
      return bytes;
    }
    const std::size_t bytes = pc.count * g.block_stride;
    const auto row = static_cast<std::uint32_t>(row_bytes);
    const auto pad = static_cast<std::uint32_t>(g.block_stride - sizeof(BlockHeader) - row_bytes);
    batch->Add(Op::Read(nullptr, nullptr, bytes, remote, shard.rkey));
    for (std::uint64_t k = 0; k < pc.count; ++k) {
      std::byte* header = pc.headers + k * g.block_stride;
      batch->segments.push_back({header, staging, sizeof(BlockHeader)});
      batch->segments.push_back({pc.rows + k * row_bytes, user_mr, row});
      if (pad > 0) batch->segments.push_back({header + sizeof(BlockHeader), staging, pad});
    }
    batch->ops.back().num_segments = static_cast<std::uint32_t>(pc.count * (pad > 0 ? 3 : 2));
    return bytes;
  }
  const std::uint64_t first = g.first_row(pc.block);
  const std::size_t rows = (g.end_row(pc.block + pc.count - 1) - first) * row_bytes;
  batch->Add(
      Op::Read(pc.rows, pc.user ? user_mr : staging, rows, shard.base + g.row(first), shard.rkey));
  batch->Add(Op::Read(pc.headers, staging, pc.count * sizeof(BlockHeader),
                      shard.base + g.header(pc.block), shard.rkey));
  return rows + pc.count * sizeof(BlockHeader);
}

// Block k of `pc` as a piece of its own (where it already landed).
Piece BlockOf(const RemoteTable& t, const ShardGeometry& g, const Piece& pc, std::uint64_t k) {
  const Strides st = StridesOf(t, pc.user);
  Piece one = pc;
  one.block = pc.block + k;
  one.count = 1;
  one.lo = std::max(pc.lo, g.first_row(one.block));
  one.hi = std::min(pc.hi, g.end_row(one.block));
  one.out_row = pc.out_row + (one.lo - pc.lo);
  one.headers += k * st.header;
  one.rows += k * st.rows;
  return one;
}

// "row 7" or, for a block of several rows, "rows 0-24 (one checked block)".
std::string BlockName(const ShardRemote& shard, std::uint64_t block) {
  const std::uint64_t first = shard.begin + shard.geo.first_row(block);
  const std::uint64_t last = shard.begin + shard.geo.end_row(block) - 1;
  if (first == last) return "row " + std::to_string(first);
  return "rows " + std::to_string(first) + "-" + std::to_string(last) + " (one checked block)";
}

}  // namespace

void RunsOfRange(const RemoteTable& t, std::uint32_t num_servers, RowRange range,
                 std::vector<Run>* runs, std::vector<std::uint32_t>* involved) {
  const std::uint32_t S = num_servers;
  for (std::uint32_t si = ServerOfRow(t.info.rows, S, range.begin); si < S; ++si) {
    const ShardRemote& sh = t.shards[si];
    if (sh.begin >= range.begin + range.count) break;
    const std::uint64_t b = std::max(sh.begin, range.begin);
    const std::uint64_t e = std::min(sh.begin + sh.count, range.begin + range.count);
    if (b >= e) continue;
    runs->push_back({si, b - sh.begin, e - b, b - range.begin});
    involved->push_back(si);
  }
}

void RunsOfRows(const RemoteTable& t, std::uint32_t num_servers,
                std::span<const std::uint64_t> rows, std::vector<Run>* runs,
                std::vector<std::uint32_t>* involved) {
  const std::uint32_t S = num_servers;
  std::vector<bool> used(S, false);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t si = ServerOfRow(t.info.rows, S, rows[i]);
    const std::uint64_t local = rows[i] - t.shards[si].begin;
    used[si] = true;
    if (!runs->empty()) {
      Run& last = runs->back();
      if (last.server == si && last.local + last.count == local && last.out_row + last.count == i) {
        ++last.count;
        continue;
      }
    }
    runs->push_back({si, local, 1, i});
  }
  for (std::uint32_t si = 0; si < S; ++si) {
    if (used[si]) involved->push_back(si);
  }
}

// Plan, Post, Verify and Accept are steps of Read, apart to be read one at
// a time; inlined into it, so that the split costs the hot path no calls
// (measured: ~60 instructions per small pull on fake otherwise).
#define RDMAPS_STEP_INLINE [[gnu::always_inline]] inline

// The constants of one Read.
struct PullReader::Pull {
  const RemoteTable& t;
  std::byte* out;
  std::size_t row_bytes;
  // Inline tables READ headers and rows together (one op per piece).
  bool inl;
  // The caller's registered buffer, where wholly wanted blocks land; null:
  // everything is staged.
  const transport::MemoryRegion* user_mr;
  std::size_t ops_per_piece;
  std::size_t block_bytes;  // the rows of a (full) block
  std::uint64_t max_blocks_per_op;
  // Staging bytes per block.
  std::size_t staged_block(bool user) const {
    return inl ? t.block_stride : sizeof(BlockHeader) + (user ? 0 : block_bytes);
  }
};

// Rows under kScatterMinRowBytes are staged (so blocks of several rows,
// which only rows under kBlockMinRowBytes get, always are). A scattered READ
// carries at most max_segments() / (2 or 3, with padding) rows, so it is
// chosen only when that takes no more ops than staging: always on tcp; on
// verbs (16 segments) for runs of 2 to 8 rows (a pull of one row is staged,
// see below). More ops cost more than the copy on Soft-RoCE (64 rows of 1
// KiB: 1.36x raw in 8 scattered READs, 1.19x staged).

std::uint64_t PullReader::ScatterInline(const RemoteTable& t, const std::vector<Run>& runs) const {
  const std::size_t row_bytes = RowBytes(t.info.dim);
  static_assert(kScatterMinRowBytes >= kBlockMinRowBytes);
  if (row_bytes < kScatterMinRowBytes) return 0;
  const std::size_t segs_per_row = t.block_stride > sizeof(BlockHeader) + row_bytes ? 3 : 2;
  std::uint64_t rows_per_read = std::numeric_limits<std::uint64_t>::max();
  for (const Run& r : runs) {
    rows_per_read = std::min<std::uint64_t>(
        rows_per_read, (*links_)[r.server].conn->max_segments() / segs_per_row);
  }
  if (runs.empty() || rows_per_read == 0) return 0;
  // A single row over a connection with few segments per op (verbs: rxe
  // walks each SGE in software) is staged: one contiguous READ and a copy of
  // the row cost less there than one READ scattered into header and row (a
  // 4 KiB row on Soft-RoCE: 1.23x a raw READ staged, 1.26-1.28x scattered;
  // on an HCA the copy adds about 0.1 us to a 2-3 us READ). tcp (1024
  // segments) scatters for free and keeps it.
  if (runs.size() == 1 && runs[0].count == 1 && rows_per_read < kFewSegmentsRows) return 0;
  const std::uint64_t staged_rows_per_read =
      std::max<std::size_t>(1, kMaxReadBytes / t.block_stride);
  for (const Run& r : runs) {
    if ((r.count + rows_per_read - 1) / rows_per_read >
        (r.count + staged_rows_per_read - 1) / staged_rows_per_read) {
      return 0;
    }
  }
  return rows_per_read;
}

Status PullReader::Read(const RemoteTable& t, const std::vector<Run>& runs, std::span<float> out,
                        const transport::MemoryRegion* user_mr, Deadline deadline) {
  // Rows land straight in `out` when the caller registered it (zero-copy),
  // except for blocks only partly wanted; otherwise in staging, and are
  // copied out once they verify. Headers always go to staging. Inline
  // tables READ headers and rows together, scattered into header and row
  // when zero-copy (ScatterInline says when).
  const bool inl = t.inline_headers();
  std::uint64_t max_blocks_per_scatter = 0;
  if (inl && user_mr) {
    max_blocks_per_scatter = ScatterInline(t, runs);
    if (max_blocks_per_scatter == 0) user_mr = nullptr;
  }
  const std::size_t row_bytes = RowBytes(t.info.dim);
  const std::size_t block_bytes = t.rows_per_block * row_bytes;
  // Remote bytes one READ moves per block.
  const std::size_t read_block = inl ? t.block_stride : block_bytes;
  std::uint64_t max_blocks_per_op = std::max<std::uint64_t>(1, kMaxReadBytes / read_block);
  if (max_blocks_per_scatter > 0) {
    max_blocks_per_op = std::min(max_blocks_per_op, max_blocks_per_scatter);
  }
  const Pull p{t,       reinterpret_cast<std::byte*>(out.data()), row_bytes,   inl,
               user_mr, inl ? std::size_t{1} : std::size_t{2},    block_bytes, max_blocks_per_op};
  const bool any_user = Plan(p, runs);
  std::uint64_t retries = 0, bytes = 0, copied = 0;
  while (true) {
    bool any = false;
    for (std::uint32_t si = 0; si < links_->size(); ++si) {
      pieces_[si].clear();
      if (queues_[si].empty()) continue;
      any = true;
      RDMAPS_RETURN_IF_ERROR(Post(p, si, &bytes));
    }
    if (!any) break;
    for (std::uint32_t si = 0; si < links_->size(); ++si) {
      if (pieces_[si].empty()) continue;
      RDMAPS_RETURN_IF_ERROR(Verify(p, si, deadline, &retries, &bytes, &copied));
    }
  }
  stats_->Update([&](ClientStats& st) {
    st.torn_retries += retries;
    st.bytes_read += bytes;
    st.bytes_staged += copied;
    if (any_user) ++st.zero_copy_calls;
  });
  return Status::OK();
}

// Blocks wholly wanted land in the caller's buffer (zero-copy); a partly
// wanted block at either end of a run is staged.
RDMAPS_STEP_INLINE bool PullReader::Plan(const Pull& p, const std::vector<Run>& runs) {
  queues_.resize(links_->size());
  pieces_.resize(links_->size());
  for (auto& q : queues_) q.clear();
  bool any_user = false;
  for (const Run& r : runs) {
    const ShardGeometry& g = p.t.shards[r.server].geo;
    const std::uint64_t lo = r.local, hi = r.local + r.count;
    const std::uint64_t b0 = g.block_of(lo), b1 = g.block_of(hi - 1) + 1;
    auto add = [&](std::uint64_t from, std::uint64_t to, bool user) {
      const std::uint64_t l = std::max(lo, g.first_row(from));
      queues_[r.server].push_back({from, to - from, l, std::min(hi, g.end_row(to - 1)),
                                   r.out_row + (l - lo), user, nullptr, nullptr});
      any_user |= user;
    };
    const std::uint64_t f0 = g.first_row(b0) == lo ? b0 : b0 + 1;
    const std::uint64_t f1 = g.end_row(b1 - 1) == hi ? b1 : b1 - 1;
    if (!p.user_mr || f0 >= f1) {
      add(b0, b1, false);
      continue;
    }
    if (b0 < f0) add(b0, f0, false);
    add(f0, f1, true);
    if (f1 < b1) add(f1, b1, false);
  }
  return any_user;
}

RDMAPS_STEP_INLINE Status PullReader::Post(const Pull& p, std::uint32_t si, std::uint64_t* bytes) {
  ServerLink& s = (*links_)[si];
  auto& q = queues_[si];
  const ShardRemote& shard = p.t.shards[si];
  std::size_t used = 0;  // staging bytes
  batch_.clear();
  const std::size_t max_ops = std::min(kMaxOpsPerPost, s.conn->max_outstanding());
  while (!q.empty() && batch_.ops.size() + p.ops_per_piece <= max_ops) {
    Piece& r = q.front();
    const std::size_t start = RoundUp(used, kCacheLine);
    const std::size_t per_block = p.staged_block(r.user);
    std::uint64_t n = std::min(r.count, p.max_blocks_per_op);
    if (start + n * per_block > s.staging_bytes) {  // staging is full: what fits
      n = start < s.staging_bytes ? (s.staging_bytes - start) / per_block : 0;
    }
    if (n == 0) break;
    Piece pc = r;
    pc.count = n;
    pc.hi = std::min(r.hi, shard.geo.end_row(r.block + n - 1));
    pc.headers = s.staging.get() + start;
    if (pc.user) {
      pc.rows = p.out + pc.out_row * p.row_bytes;
    } else {
      pc.rows = pc.headers + (p.inl ? sizeof(BlockHeader) : n * sizeof(BlockHeader));
    }
    *bytes += AddBlockReads(shard, s.staging_mr.get(), p.user_mr, pc, &batch_);
    pieces_[si].push_back(pc);
    used = start + n * per_block;
    r.block += n;
    r.count -= n;
    r.out_row += pc.hi - pc.lo;
    r.lo = pc.hi;
    if (r.count == 0) q.pop_front();
  }
  // The client sizes staging to hold a block of every table.
  if (batch_.ops.empty()) return InternalError("staging smaller than one checked block");
  return links_->PostOps(s, batch_.Seal());
}

// Accepts a piece of one block (BlockOf) when the block matches its header,
// copying its wanted rows out when it is staged.
RDMAPS_STEP_INLINE bool PullReader::Accept(const Pull& p, const ShardGeometry& g, const Piece& one,
                                           std::uint64_t* copied) {
  const std::uint64_t first = g.first_row(one.block);
  const auto* header = reinterpret_cast<const BlockHeader*>(one.headers);
  if (!VerifyRow(*header, one.rows, g.block_rows(one.block) * p.row_bytes)) return false;
  if (!one.user) {
    std::memcpy(p.out + one.out_row * p.row_bytes, one.rows + (one.lo - first) * p.row_bytes,
                (one.hi - one.lo) * p.row_bytes);
    *copied += (one.hi - one.lo) * p.row_bytes;
  }
  return true;
}

// Verifies the blocks of each piece as its READs complete (overlapping the
// check with the later READs' transfer); re-READs torn blocks, rows and
// header, until they verify.
RDMAPS_STEP_INLINE Status PullReader::Verify(const Pull& p, std::uint32_t si, Deadline deadline,
                                             std::uint64_t* retries, std::uint64_t* bytes,
                                             std::uint64_t* copied) {
  ServerLink& s = (*links_)[si];
  const ShardRemote& shard = p.t.shards[si];
  const ShardGeometry& g = shard.geo;
  std::vector<Piece> torn;
  // Completions are taken in bulk (up to all of this server's), so many
  // small pieces cost few Waits.
  const std::size_t total_ops = pieces_[si].size() * p.ops_per_piece;
  std::size_t completed = 0, needed = 0;
  for (const Piece& pc : pieces_[si]) {
    needed += p.ops_per_piece;
    if (completed < needed) {
      RDMAPS_RETURN_IF_ERROR(
          links_->DrainSome(s, needed - completed, total_ops - completed, &completed, deadline));
    }
    for (std::uint64_t k = 0; k < pc.count; ++k) {
      const Piece one = BlockOf(p.t, g, pc, k);
      if (!Accept(p, g, one, copied)) torn.push_back(one);
    }
  }
  while (!torn.empty()) {
    *retries += torn.size();
    if (SteadyClock::now() >= deadline) {
      // Complete what the later servers still have in flight, so their
      // connections stay in step for the next call.
      for (std::uint32_t sj = si + 1; sj < links_->size(); ++sj) {
        if (pieces_[sj].empty()) continue;
        RDMAPS_RETURN_IF_ERROR(links_->Drain((*links_)[sj], pieces_[sj].size() * p.ops_per_piece,
                                             SteadyClock::now() + std::chrono::seconds(10)));
      }
      return TimedOutError(BlockName(shard, torn[0].block) + " of table '" + p.t.info.name +
                           "' on " + ServerName(s) + " read torn until the deadline (" +
                           std::to_string(*retries) +
                           " retries): the server rewrites it faster than it can be read");
    }
    const std::size_t per_post =
        std::min(kMaxOpsPerPost, s.conn->max_outstanding()) / p.ops_per_piece;
    for (std::size_t off = 0; off < torn.size(); off += per_post) {
      batch_.clear();
      const std::size_t end = std::min(torn.size(), off + per_post);
      for (std::size_t k = off; k < end; ++k) {
        *bytes += AddBlockReads(shard, s.staging_mr.get(), p.user_mr, torn[k], &batch_);
      }
      RDMAPS_RETURN_IF_ERROR(links_->Exec(s, batch_.Seal(), deadline));
    }
    std::vector<Piece> still;
    for (const Piece& pc : torn) {
      if (!Accept(p, g, pc, copied)) still.push_back(pc);
    }
    torn = std::move(still);
  }
  return Status::OK();
}

}  // namespace rdmaps::internal

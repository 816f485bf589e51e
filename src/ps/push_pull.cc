#include "src/ps/push_pull.h"

#include <algorithm>
#include <cstring>

#include "src/ps/wire.h"

namespace rdmaps::internal {

namespace {

// A follower READ carries at most this many bytes of rows (as a range pull's
// READs: checking one block overlaps the next one's transfer).
constexpr std::size_t kFollowReadBytes = 256 * 1024;

}  // namespace

RangeFollower::RangeFollower(const RemoteTable& t, RowRange range, float* out,
                             const transport::MemoryRegion* out_mr, std::uint64_t required,
                             ServerLinks* links)
    : t_(t),
      range_(range),
      out_(reinterpret_cast<std::byte*>(out)),
      out_mr_(out_mr),
      required_(required),
      links_(links),
      row_bytes_(RowBytes(t.info.dim)),
      shards_(links->size()) {
  for (std::uint32_t si = 0; si < links->size(); ++si) {
    const ShardRemote& shard = t.shards[si];
    const std::uint64_t b = std::max(shard.begin, range.begin);
    const std::uint64_t e = std::min(shard.begin + shard.count, range.begin + range.count);
    if (b >= e) continue;
    Shard& sh = shards_[si];
    const ShardGeometry& g = shard.geo;
    sh.used = true;
    sh.lo = b - shard.begin;
    sh.hi = e - shard.begin;
    sh.covered = sh.lo;
    const std::uint64_t b0 = g.block_of(sh.lo), b1 = g.block_of(sh.hi - 1) + 1;
    sh.f0 = g.first_row(b0) == sh.lo ? b0 : b0 + 1;
    sh.f1 = g.end_row(b1 - 1) == sh.hi ? b1 : b1 - 1;
    if (sh.f1 < sh.f0) sh.f1 = sh.f0;
    // Each block's header lands in the pull staging, one after another.
    const ServerLink& s = (*links)[si];
    sh.f1 = std::min<std::uint64_t>(sh.f1, sh.f0 + s.staging_bytes / sizeof(BlockHeader));
    sh.next = sh.f0;
    sh.ok.assign(sh.f1 - sh.f0, false);
  }
}

void RangeFollower::OnSlot(const ServerLink& s, std::uint64_t seq, std::uint64_t row_end) {
  Shard& sh = shards_[s.index];
  if (!sh.used) return;
  sh.slots.emplace_back(seq, row_end - t_.shards[s.index].begin);
}

bool RangeFollower::Pending(const ServerLink& s) const {
  const Shard& sh = shards_[s.index];
  return sh.used && sh.next < sh.f1;
}

bool RangeFollower::ClockBlocked(const ServerLink& s) const { return s.min_clock < required_; }

Status RangeFollower::Advance(ServerLink& s, std::size_t reserve_ops, bool* posted) {
  *posted = false;
  Shard& sh = shards_[s.index];
  if (!sh.used || sh.next >= sh.f1) return Status::OK();
  while (sh.slots_done < sh.slots.size() && sh.slots[sh.slots_done].first <= s.applied_seq) {
    sh.covered = std::max(sh.covered, sh.slots[sh.slots_done].second);
    ++sh.slots_done;
  }
  if (s.min_clock < required_) return Status::OK();
  const ShardRemote& shard = t_.shards[s.index];
  const ShardGeometry& g = shard.geo;
  // Blocks below the one holding the first row not applied yet (all of them
  // once the run's end is applied).
  const std::uint64_t end = sh.covered >= sh.hi ? sh.f1 : std::min(sh.f1, g.block_of(sh.covered));
  if (end <= sh.next) return Status::OK();
  const std::uint64_t per_op =
      std::max<std::uint64_t>(1, kFollowReadBytes / (std::size_t{t_.rows_per_block} * row_bytes_));
  const std::size_t max_ops = s.conn->max_outstanding();
  transport::Op ops[64];
  std::size_t n_ops = 0;
  const std::size_t first_piece = pieces_.size();
  while (sh.next < end && n_ops + 2 <= std::size(ops) &&
         s.conn->outstanding() + n_ops + 2 + reserve_ops <= max_ops) {
    const std::uint64_t n = std::min(per_op, end - sh.next);
    const std::uint64_t first = g.first_row(sh.next);
    const std::size_t rows = (g.end_row(sh.next + n - 1) - first) * row_bytes_;
    std::byte* dst = out_ + (shard.begin + first - range_.begin) * row_bytes_;
    std::byte* headers = s.staging.get() + (sh.next - sh.f0) * sizeof(BlockHeader);
    ops[n_ops++] = transport::Op::Read(dst, out_mr_, rows, shard.base + g.row(first), shard.rkey);
    ops[n_ops++] = transport::Op::Read(headers, s.staging_mr.get(), n * sizeof(BlockHeader),
                                       shard.base + g.header(sh.next), shard.rkey);
    pieces_.push_back({s.index, sh.next, n});
    bytes_read_ += rows + n * sizeof(BlockHeader);
    sh.next += n;
  }
  if (n_ops == 0) return Status::OK();
  RDMAPS_RETURN_IF_ERROR(links_->PostOps(s, {ops, n_ops}));
  for (std::size_t p = first_piece; p < pieces_.size(); ++p) {
    s.slots_in_flight.push_back({2, false, static_cast<std::int32_t>(p)});
    ++s.reads_in_flight;
  }
  *posted = true;
  return Status::OK();
}

void RangeFollower::Complete(ServerLink& s, std::int32_t piece) {
  const Piece& pc = pieces_[static_cast<std::size_t>(piece)];
  Shard& sh = shards_[s.index];
  const ShardRemote& shard = t_.shards[s.index];
  const ShardGeometry& g = shard.geo;
  for (std::uint64_t b = pc.block; b < pc.block + pc.count; ++b) {
    BlockHeader header;
    std::memcpy(&header, s.staging.get() + (b - sh.f0) * sizeof(BlockHeader), sizeof(header));
    const std::byte* rows = out_ + (shard.begin + g.first_row(b) - range_.begin) * row_bytes_;
    if (VerifyRow(header, rows, g.block_rows(b) * row_bytes_)) {
      sh.ok[b - sh.f0] = true;
      rows_verified_ += g.block_rows(b);
    } else {
      ++torn_blocks_;
    }
  }
}

void RangeFollower::Residual(std::vector<Run>* runs, std::vector<std::uint32_t>* involved) const {
  for (std::uint32_t si = 0; si < shards_.size(); ++si) {
    const Shard& sh = shards_[si];
    if (!sh.used) continue;
    const ShardRemote& shard = t_.shards[si];
    const ShardGeometry& g = shard.geo;
    bool any = false;
    const std::uint64_t b0 = g.block_of(sh.lo), b1 = g.block_of(sh.hi - 1) + 1;
    for (std::uint64_t b = b0; b < b1; ++b) {
      if (b >= sh.f0 && b < sh.f1 && sh.ok[b - sh.f0]) continue;
      const std::uint64_t lo = std::max(sh.lo, g.first_row(b));
      const std::uint64_t hi = std::min(sh.hi, g.end_row(b));
      if (!runs->empty() && runs->back().server == si &&
          runs->back().local + runs->back().count == lo) {
        runs->back().count += hi - lo;
      } else {
        runs->push_back({si, lo, hi - lo, shard.begin + lo - range_.begin});
      }
      any = true;
    }
    if (any) involved->push_back(si);
  }
}

}  // namespace rdmaps::internal

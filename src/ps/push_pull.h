// The pull half of a pipelined PushPull (docs/ps.md, "PushPull"): while the
// push writer sends a range push slot by slot, the follower READs each
// checked block of the range as soon as the server has applied every slot
// covering it (its applied_seq in the control block, read behind the slots),
// in the same in-order op stream as the slots, so the pull's transfer
// overlaps the rest of the push's transfer and apply.
//
// What it pulls: on a dense table into the caller's registered buffer, the
// blocks of the range wanted wholly (a block straddling the range's ends is
// staged by the normal pull). Each block is checked against its header
// when its READ completes; a torn one is left to the normal pull. Whatever it
// did not pull (partial blocks, blocks not applied by the time the push
// ended, torn ones, all of them when the pull's staleness bound is not met
// yet) is Residual(): the client pulls it the usual way (WaitReadable, then
// PullReader::Read). So every row returned was READ after the server
// published an applied_seq covering this push's slots for it (read-my-writes)
// and verified against its header (never torn).
//
// Thread safety: none; used by one call under the client's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "src/ps/directory.h"
#include "src/ps/pull_reader.h"
#include "src/ps/server_links.h"
#include "transport/transport.h"

namespace rdmaps::internal {

class RangeFollower {
 public:
  // The pull of `range` of `t` (dense, within the table) into `out` (the
  // range's floats, inside the registered `out_mr`), allowed once a
  // server's min_clock is at least `required` (the staleness bound).
  RangeFollower(const RemoteTable& t, RowRange range, float* out,
                const transport::MemoryRegion* out_mr, std::uint64_t required, ServerLinks* links);

  // The push writer posted (or rebuilt, after a failover) s's slot `seq`,
  // which covers the range's rows of s's shard up to global row `row_end`.
  void OnSlot(const ServerLink& s, std::uint64_t seq, std::uint64_t row_end);
  // After s's control block was read: posts READs of the blocks its
  // applied_seq now covers (as many as the connection takes beside
  // `reserve_ops` ops for the push), each batch an item of
  // s.slots_in_flight. *posted: whether it posted any.
  Status Advance(ServerLink& s, std::size_t reserve_ops, bool* posted);
  // The READs of item `piece` of s completed: checks its blocks.
  void Complete(ServerLink& s, std::int32_t piece);
  // Whether s has blocks left that Advance could still post.
  bool Pending(const ServerLink& s) const;
  // Whether s's pull is held back by its min_clock (the staleness bound).
  bool ClockBlocked(const ServerLink& s) const;

  // The rows not pulled and verified here, as runs for PullReader::Read
  // (out_row counts rows of `out`), and the servers they involve.
  void Residual(std::vector<Run>* runs, std::vector<std::uint32_t>* involved) const;
  std::uint64_t rows_verified() const { return rows_verified_; }
  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t torn_blocks() const { return torn_blocks_; }

 private:
  struct Shard {
    bool used = false;
    std::uint64_t lo = 0, hi = 0;  // the range's shard-local rows [lo, hi)
    std::uint64_t f0 = 0, f1 = 0;  // blocks wholly wanted (and header room): [f0, f1)
    std::uint64_t next = 0;        // first block not posted yet
    std::uint64_t covered = 0;     // shard-local end of the rows applied
    // Slots not yet known applied: (seq, shard-local row end), in seq order.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> slots;
    std::size_t slots_done = 0;
    std::vector<bool> ok;  // per block of [f0, f1): pulled and verified
  };
  struct Piece {
    std::uint32_t server;
    std::uint64_t block, count;
  };

  const RemoteTable& t_;
  const RowRange range_;
  std::byte* const out_;
  const transport::MemoryRegion* const out_mr_;
  const std::uint64_t required_;
  ServerLinks* const links_;
  std::size_t row_bytes_;
  std::vector<Shard> shards_;
  std::vector<Piece> pieces_;
  std::uint64_t rows_verified_ = 0;
  std::uint64_t bytes_read_ = 0;
  std::uint64_t torn_blocks_ = 0;
};

}  // namespace rdmaps::internal

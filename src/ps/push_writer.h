// The push path of a worker: builds push slots (src/ps/wire.h, "Push") and
// WRITEs them into the worker's ring on each server, one slot per server at
// a time (servers in parallel), within the credits the ring leaves: at most
// ring_slots pushes a server has not applied yet. Credits are refreshed by a
// READ of the control block riding behind a slot once half are used, and
// waited for (by polling the control block) only when none is left.
//
// Gradients in a registered caller buffer are WRITTEN from there (gathered
// behind the slot header, up to kMaxGatherRuns pieces); others are copied
// into the slot first.
//
// Thread safety: none; the client calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "src/ps/directory.h"
#include "src/ps/server_links.h"
#include "transport/transport.h"

namespace rdmaps::internal {

// A push WRITEs gradients straight from a registered caller buffer when they
// are in at most this many pieces; more pieces are gathered by a copy.
inline constexpr std::size_t kMaxGatherRuns = 8;

class PushWriter {
 public:
  PushWriter(ServerLinks* links, ClientStatsRecorder* stats) : links_(links), stats_(stats) {}

  // Pushes the gradients of rows `range` of `t` (within the table), pushed
  // at worker clock `clock`. `user_mr`: registered memory holding `grads`,
  // or null.
  Status PushRange(const RemoteTable& t, RowRange range, std::span<const float> grads,
                   const transport::MemoryRegion* user_mr, std::uint64_t clock,
                   transport::Deadline deadline);
  // The same for row ids `rows` (each within the table; repeats apply once
  // each).
  Status PushRows(const RemoteTable& t, std::span<const std::uint64_t> rows,
                  std::span<const float> grads, const transport::MemoryRegion* user_mr,
                  std::uint64_t clock, transport::Deadline deadline);
  // Sends a slot of `kind` (kClock: `clock` is the new clock; kBye) to every
  // server.
  Status SendControlSlot(SlotKind kind, std::uint64_t clock, transport::Deadline deadline);

 private:
  // Waits (polling the control block) until s has a free ring slot.
  Status EnsureCredit(ServerLink& s, transport::Deadline deadline);
  // Sends the next slot as ONE WRITE_WITH_IMM: the first `bytes` of s.push
  // (the header and whatever payload is staged there), then `data` (pieces
  // of the caller's registered memory, zero-copy; may be empty), gathered.
  // Where the connection takes fewer segments, the pieces go first as
  // WRITEs of their own and the immediate last, so the server sees it only
  // after every piece's data (transport.h's ordering rule).
  Status PostSlot(ServerLink& s, SlotHeader h, std::size_t bytes,
                  std::span<const transport::Segment> data = {});
  // Completes the slot PostSlot posted (and its piggybacked control READ).
  Status FinishSlot(ServerLink& s, transport::Deadline deadline);
  // Sends slots in rounds of one per server (servers in parallel) until
  // has_more(server index) is false for all: waits for a credit, then
  // post_next(link) builds and posts the server's next slot; the round's
  // slots complete before the next round.
  template <typename HasMore, typename PostNext>
  Status SendInRounds(HasMore&& has_more, PostNext&& post_next, transport::Deadline deadline);
  // On error, completes the slots already posted to `posted` (one each) so
  // the connections stay in step, and returns `st`.
  Status DrainOnError(const std::vector<std::uint32_t>& posted, Status st,
                      transport::Deadline deadline);

  ServerLinks* const links_;
  ClientStatsRecorder* const stats_;
};

}  // namespace rdmaps::internal

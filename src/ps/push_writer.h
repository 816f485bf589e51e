// The push path of a worker: builds push slots (src/ps/wire.h, "Push") and
// WRITEs them into the worker's ring on each server, pipelined: up to
// push_depth slots per server in flight (servers in parallel, round robin),
// so the transfer of one slot overlaps the next ones and the server's apply
// of the earlier ones, within the credits the ring leaves: at most
// ring_slots pushes a server has not applied yet. Credits are refreshed by a
// READ of the control block riding behind a slot once half are used (one
// such READ in flight at a time), and waited for (by polling the control
// block) only when none is left. Every call completes all its slots before
// it returns, so the connection is idle for the next call.
//
// Gradients in a registered caller buffer are WRITTEN from there (gathered
// behind the slot header, up to kMaxGatherRuns pieces); others are copied
// into the slot first.
//
// Thread safety: none; the client calls it under its mutex.
#pragma once

#include <algorithm>
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

class RangeFollower;

// A push WRITEs gradients straight from a registered caller buffer when they
// are in at most this many pieces; more pieces are gathered by a copy.
inline constexpr std::size_t kMaxGatherRuns = 8;

// Staging a worker keeps per server for the slots in flight: the pipeline
// is as deep as this many bytes of slots allow (at least 1, at most
// kMaxPushDepth and the ring's slots; 16 slots of the default 64 KiB).
inline constexpr std::size_t kPushStagingBytes = 1 << 20;
inline constexpr std::uint32_t kMaxPushDepth = 16;

// Slots in flight per server for rings of `ring_slots` slots of
// `slot_bytes`, on a connection taking `max_outstanding` ops.
inline std::uint32_t PushPipelineDepth(std::uint32_t slot_bytes, std::uint32_t ring_slots,
                                       std::size_t max_outstanding) {
  std::size_t d = kPushStagingBytes / std::max<std::size_t>(slot_bytes, 1);
  d = std::min<std::size_t>({d, kMaxPushDepth, ring_slots, max_outstanding / (kMaxGatherRuns + 2)});
  return static_cast<std::uint32_t>(std::max<std::size_t>(d, 1));
}

class PushWriter {
 public:
  PushWriter(ServerLinks* links, ClientStatsRecorder* stats) : links_(links), stats_(stats) {}

  // Pushes the gradients of rows `range` of `t` (within the table), pushed
  // at worker clock `clock`. `user_mr`: registered memory holding `grads`,
  // or null. With `follow` (a pipelined PushPull, src/ps/push_pull.h), a
  // control READ rides behind every slot while none is in flight, and the
  // follower READs the rows each one shows applied; once every slot is
  // complete, lone control READs keep it going while the server applies
  // (until a poll shows no progress for kFollowIdle).
  Status PushRange(const RemoteTable& t, RowRange range, std::span<const float> grads,
                   const transport::MemoryRegion* user_mr, std::uint64_t clock,
                   transport::Deadline deadline, RangeFollower* follow = nullptr);
  // The same for row ids `rows` (each within the table; repeats apply once
  // each).
  Status PushRows(const RemoteTable& t, std::span<const std::uint64_t> rows,
                  std::span<const float> grads, const transport::MemoryRegion* user_mr,
                  std::uint64_t clock, transport::Deadline deadline);
  // Sends a kRewind slot (clock = `clock`, first_row = `id`) to each of
  // `servers` (indices).
  Status SendRewind(const std::vector<std::uint32_t>& servers, std::uint64_t clock,
                    std::uint64_t id, transport::Deadline deadline);
  // Sends a slot of `kind` (kClock: `clock` is the new clock; kBye) to every
  // server; with `read_control` a READ of each server's control block rides
  // behind it (posted after this call began: Clock() reads the cuts to
  // relay from it; ServerLink::ctrl_torn says when one came back torn).
  Status SendControlSlot(SlotKind kind, std::uint64_t clock, transport::Deadline deadline,
                         bool read_control = false);
  // After a failover reconnected s: WRITEs again every retained slot the
  // server has not applied (applied_seq < seq <= pushed_seq), in seq order.
  Status Resend(ServerLink& s, transport::Deadline deadline);

 private:
  // Waits (completing the slots in flight, then polling the control block)
  // until s has a free ring slot.
  Status EnsureCredit(ServerLink& s, transport::Deadline deadline);
  // With push_depth slots in flight, completes the oldest until half of
  // them are (the window is refilled in a burst, so a long push waits once
  // per half window, not once per slot): then Staging(s) is free.
  Status MakeRoom(ServerLink& s, transport::Deadline deadline);
  // Where the next slot of s is built (header, ids, copied gradients) and
  // written from. With failover, its retain slot: kept there until
  // acknowledged, it is not copied again (EnsureCredit freed it: the slot's
  // previous push is applied). A retried call's rebuilt slots
  // (pushed_seq < replay_until) are built in the pipeline's staging and
  // leave the retained ones alone.
  static bool StagesInRetain(const ServerLink& s) {
    return s.retain && s.pushed_seq >= s.replay_until;
  }
  static std::byte* Staging(ServerLink& s) {
    if (StagesInRetain(s)) {
      return s.retain.get() + (s.pushed_seq % s.dir.ring_slots) * std::size_t{s.dir.slot_bytes};
    }
    return s.push.get() + (s.pushed_seq % s.push_depth) * std::size_t{s.dir.slot_bytes};
  }
  static const transport::MemoryRegion* StagingMr(const ServerLink& s) {
    return StagesInRetain(s) ? s.retain_mr.get() : s.push_mr.get();
  }
  // Sends the next slot as ONE WRITE_WITH_IMM: the first `bytes` of
  // Staging(s) (the header, written here, and whatever payload is staged
  // there), then `data` (pieces of the caller's registered memory,
  // zero-copy; may be empty), gathered. Where the connection takes fewer
  // segments, the pieces go first as WRITEs of their own and the immediate
  // last, so the server sees it only after every piece's data
  // (transport.h's ordering rule). The slot stays in flight.
  Status PostSlot(ServerLink& s, SlotHeader h, std::size_t bytes,
                  std::span<const transport::Segment> data = {}, bool read_control = false);
  // Completes the oldest slot in flight (and its piggybacked control READ).
  Status FinishOldest(ServerLink& s, transport::Deadline deadline);
  // Completes every slot in flight on s.
  Status FinishAll(ServerLink& s, transport::Deadline deadline);
  // Sends slots round robin, one per server per turn, until has_more(server
  // index) is false for all: makes room and waits for a credit, then
  // post_next(link) builds (in Staging) and posts the server's next slot.
  // Completes every slot before it returns, also on error (so the
  // connections stay in step).
  template <typename HasMore, typename PostNext>
  Status SendPipelined(HasMore&& has_more, PostNext&& post_next, transport::Deadline deadline);
  // The follower's part after the push: see PushRange.
  Status FollowTail(transport::Deadline deadline);
  // Posts a control READ of its own on s (an item of s.slots_in_flight).
  Status PostLoneControl(ServerLink& s);

  ServerLinks* const links_;
  ClientStatsRecorder* const stats_;
  // The follower of the PushRange under way, or null.
  RangeFollower* follow_ = nullptr;
  bool follow_tail_ = false;  // in FollowTail
};

}  // namespace rdmaps::internal

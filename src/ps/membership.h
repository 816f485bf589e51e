// Elastic workers, the server's side (docs/ps.md "Elastic workers"): which
// worker slots of a server are members, the membership epoch, each member's
// Barrier() generation, and what the control block says of each slot.
//
// Without ServerOptions::max_workers a Membership is passive: every slot is
// a member for good (a worker that died holds the clocks back and is named
// by the waits, as before), the epoch stays 0.
//
// In elastic mode a slot is kMember (counted in min_clock, barriers and
// checkpoint cuts), kVacant (no worker joined it yet) or kLeft (its worker
// said goodbye or its connection dropped). Slots [0, initial) start as
// members; a worker joins a vacant or left slot with a kJoin slot, leaves by
// its goodbye or its death. Every join and leave adds 1 to the epoch and is
// logged as "ps server S: membership epoch E: worker W joined at clock C" /
// "... left (graceful|died) at clock C".
//
// Thread safety: none; the server uses it under its apply_mu_ (the apply
// thread, and the accept thread before a bootstrap).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "src/ps/wire.h"

namespace rdmaps::internal {

class Membership {
 public:
  // `slots` worker slots, the first `initial` members; `elastic` per
  // ServerOptions::max_workers; `floor` the clock every initial worker starts at.
  Membership(std::uint32_t slots, std::uint32_t initial, bool elastic, std::uint32_t server_index,
             std::uint64_t floor);

  bool elastic() const { return elastic_; }
  std::uint32_t epoch() const { return epoch_; }
  std::uint32_t members() const;
  // Counted in min_clock, barriers and cuts.
  bool member(std::uint32_t w) const { return !elastic_ || slots_[w].state == State::kMember; }
  // A slot a new connection may take: vacant or left (elastic mode only).
  bool free(std::uint32_t w) const { return elastic_ && slots_[w].state != State::kMember; }
  // Joined by kJoin: Clock() markers at or below the clock it has here are
  // no-ops (this server may have started it above the clock it asked for).
  bool joined(std::uint32_t w) const { return slots_[w].joined; }

  // Worker w's kJoin asks for `clock`, the floor it read. The clock it gets
  // here: max(clock, the floor, `members_min`, the members' minimum clock as
  // this server applied it - the published floor lags it by up to one apply
  // round), or nullopt when it cannot join (not elastic, or w is a member
  // already).
  std::optional<std::uint64_t> Join(std::uint32_t w, std::uint64_t clock,
                                    std::uint64_t members_min);
  // Worker w (a member) said goodbye (died = false) or its connection
  // dropped (died = true), at `clock`.
  void Leave(std::uint32_t w, bool died, std::uint64_t clock);
  // Worker w arrived at Barrier() generation `generation` (kBarrier).
  void Barrier(std::uint32_t w, std::uint64_t generation);

  // The control block's words of slot w: for a member its `clock` and
  // barrier count, else kClockDone (elastic); `liveness` the server's own
  // view of a member (WorkerLiveness).
  void Fill(std::uint32_t w, std::uint64_t clock, std::uint32_t liveness, ControlWorker* cw) const;
  // min over members of `clocks` (kClockDone: none); raises the floor.
  std::uint64_t MinClock(const std::vector<ControlWorker>& filled);
  std::uint64_t floor() const { return floor_; }

  // Re-protection: what a replacement backup copies of each slot (the
  // primary's snapshot, RejoinWorker) so that its members, epochs and
  // barrier counts equal the primary's.
  struct SlotImage {
    std::uint32_t state = 0;  // 0 member, 1 vacant, 2 left
    std::uint32_t epoch = 0;
    std::uint64_t barriers = 0;
    bool joined = false;
    bool died = false;
  };
  SlotImage Image(std::uint32_t w) const;
  // Takes the primary's images, epoch and floor; false (nothing changed)
  // when they cannot be a membership of this one: another slot count, a
  // state out of range, a non-member slot when not elastic.
  bool Load(const std::vector<SlotImage>& slots, std::uint32_t epoch, std::uint64_t floor);

 private:
  enum class State : std::uint8_t { kMember, kVacant, kLeft };
  struct Slot {
    State state = State::kMember;
    bool joined = false;
    bool died = false;  // how it left
    std::uint32_t epoch = 0;
    std::uint64_t barriers = 0;
  };
  const bool elastic_;
  const std::uint32_t server_index_;
  std::uint32_t epoch_ = 0;
  std::uint64_t floor_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace rdmaps::internal

#include "src/ps/membership.h"

#include <algorithm>

#include "src/base/log.h"

namespace rdmaps::internal {

Membership::Membership(std::uint32_t slots, std::uint32_t initial, bool elastic,
                       std::uint32_t server_index, std::uint64_t floor)
    : elastic_(elastic), server_index_(server_index), floor_(floor), slots_(slots) {
  for (std::uint32_t w = initial; w < slots && elastic_; ++w) slots_[w].state = State::kVacant;
  if (elastic_) {
    RDMAPS_LOG(INFO) << "ps server " << server_index_ << ": membership epoch 0: workers [0, "
                     << initial << ") of " << slots << " slots, at clock " << floor;
  }
}

std::uint32_t Membership::members() const {
  return static_cast<std::uint32_t>(std::count_if(
      slots_.begin(), slots_.end(), [](const Slot& s) { return s.state == State::kMember; }));
}

std::optional<std::uint64_t> Membership::Join(std::uint32_t w, std::uint64_t clock,
                                              std::uint64_t members_min) {
  if (!elastic_ || slots_[w].state == State::kMember) return std::nullopt;
  // A barrier under way when it joins is one it was not part of: it counts
  // as arrived there, so that barrier ends with the members it began with.
  std::uint64_t barriers = 0;
  for (const Slot& s : slots_) {
    if (s.state == State::kMember) barriers = std::max(barriers, s.barriers);
  }
  const std::uint64_t start = std::max({clock, floor_, members_min});
  slots_[w] = Slot{State::kMember, true, false, ++epoch_, barriers};
  RDMAPS_LOG(INFO) << "ps server " << server_index_ << ": membership epoch " << epoch_
                   << ": worker " << w << " joined at clock " << start
                   << (start != clock ? " (it asked for " + std::to_string(clock) + ")" : "");
  return start;
}

void Membership::Leave(std::uint32_t w, bool died, std::uint64_t clock) {
  if (!elastic_ || slots_[w].state != State::kMember) return;
  slots_[w].state = State::kLeft;
  slots_[w].died = died;
  ++epoch_;
  RDMAPS_LOG(INFO) << "ps server " << server_index_ << ": membership epoch " << epoch_
                   << ": worker " << w << " left (" << (died ? "died" : "graceful") << ") at clock "
                   << clock;
}

void Membership::Barrier(std::uint32_t w, std::uint64_t generation) {
  // Monotone: a joiner's count may start above the generation it asks for
  // on a server that saw more of a barrier under way than server 0 did.
  slots_[w].barriers = std::max(slots_[w].barriers, generation);
}

void Membership::Fill(std::uint32_t w, std::uint64_t clock, std::uint32_t liveness,
                      ControlWorker* cw) const {
  const Slot& s = slots_[w];
  cw->epoch = s.epoch;
  if (!elastic_ || s.state == State::kMember) {
    cw->clock = clock;
    cw->state = liveness;
    cw->barriers = s.barriers;
    return;
  }
  cw->clock = kClockDone;
  cw->barriers = kClockDone;
  cw->state = static_cast<std::uint32_t>(s.state == State::kVacant ? WorkerLiveness::kVacant
                                         : s.died                  ? WorkerLiveness::kDied
                                                                   : WorkerLiveness::kClosed);
}

std::uint64_t Membership::MinClock(const std::vector<ControlWorker>& filled) {
  std::uint64_t min = kClockDone;
  for (const ControlWorker& cw : filled) min = std::min(min, cw.clock);
  if (min != kClockDone) floor_ = std::max(floor_, min);
  return min;
}

Membership::SlotImage Membership::Image(std::uint32_t w) const {
  const Slot& s = slots_[w];
  return {static_cast<std::uint32_t>(s.state), s.epoch, s.barriers, s.joined, s.died};
}

bool Membership::Load(const std::vector<SlotImage>& slots, std::uint32_t epoch,
                      std::uint64_t floor) {
  if (slots.size() != slots_.size()) return false;
  for (const SlotImage& i : slots) {
    if (i.state > static_cast<std::uint32_t>(State::kLeft) || (!elastic_ && i.state != 0)) {
      return false;
    }
  }
  for (std::size_t w = 0; w < slots.size(); ++w) {
    const SlotImage& i = slots[w];
    slots_[w] = Slot{static_cast<State>(i.state), i.joined, i.died, i.epoch, i.barriers};
  }
  epoch_ = epoch;
  floor_ = floor;
  if (elastic_) {
    RDMAPS_LOG(INFO) << "ps server " << server_index_ << ": membership epoch " << epoch_
                     << " copied from the primary: " << members() << " members of " << slots_.size()
                     << " slots, floor clock " << floor_;
  }
  return true;
}

}  // namespace rdmaps::internal

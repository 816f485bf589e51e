#include "src/ps/push_writer.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "src/ps/push_pull.h"

namespace rdmaps::internal {

using transport::Deadline;
using transport::Op;
using SteadyClock = std::chrono::steady_clock;

namespace {

// Ops a slot takes at most (PostSlot): what a follower leaves free for the
// next slot.
constexpr std::size_t kSlotOps = kMaxGatherRuns + 2;
// A follower's tail gives up on a server whose polls showed no progress for
// this long (the normal pull then waits for it, with the probes of a wait).
constexpr auto kFollowIdle = std::chrono::milliseconds(1);

// Remote address of the ring slot of push `seq` on `s`.
std::uint64_t SlotAddress(const ServerLink& s, std::uint64_t seq) {
  return s.ring.addr + (seq - 1) % s.dir.ring_slots * s.dir.slot_bytes;
}

}  // namespace

Status PushWriter::FinishOldest(ServerLink& s, Deadline deadline) {
  const ServerLink::SlotInFlight f = s.slots_in_flight.front();
  s.slots_in_flight.pop_front();
  if (f.pull != ServerLink::kSlot) --s.reads_in_flight;
  RDMAPS_RETURN_IF_ERROR(links_->Drain(s, f.ops, deadline));
  if (f.pull >= 0 && follow_) follow_->Complete(s, f.pull);
  if (f.ctrl) {
    s.ctrl_inflight = false;
    (void)links_->ParseControl(s);  // torn: ignore, a later poll will tell
    stats_->Update([](ClientStats& st) { ++st.clock_reads; });
    if (follow_) {
      bool posted = false;
      // (Room for the next slot, or in the tail for the next lone poll.)
      RDMAPS_RETURN_IF_ERROR(follow_->Advance(s, follow_tail_ ? 1 : kSlotOps, &posted));
      // In the tail, a poll behind the new READs while this one made progress.
      if (follow_tail_ && posted && follow_->Pending(s)) RDMAPS_RETURN_IF_ERROR(PostLoneControl(s));
    }
  }
  return Status::OK();
}

Status PushWriter::FinishAll(ServerLink& s, Deadline deadline) {
  while (!s.slots_in_flight.empty()) RDMAPS_RETURN_IF_ERROR(FinishOldest(s, deadline));
  return Status::OK();
}

Status PushWriter::MakeRoom(ServerLink& s, Deadline deadline) {
  // (Follower READs in the queue are not slots: slots = size - reads.)
  auto slots = [&] { return s.slots_in_flight.size() - s.reads_in_flight; };
  if (slots() < s.push_depth) return Status::OK();
  const std::size_t keep = s.push_depth / 2;
  // (The transport sleeps rather than spins while many slot bytes are
  // outstanding: tcp's kSpinMaxPendingBytes.)
  while (slots() > keep) RDMAPS_RETURN_IF_ERROR(FinishOldest(s, deadline));
  return Status::OK();
}

Status PushWriter::EnsureCredit(ServerLink& s, Deadline deadline) {
  if (s.pushed_seq < s.replay_until) return Status::OK();  // rebuilt, not sent
  if (s.pushed_seq - s.applied_seq < s.dir.ring_slots) return Status::OK();
  // The control READ riding with a slot in flight may bring the credits.
  RDMAPS_RETURN_IF_ERROR(FinishAll(s, deadline));
  if (s.pushed_seq - s.applied_seq < s.dir.ring_slots) return Status::OK();
  const auto start = SteadyClock::now();
  stats_->Update([](ClientStats& st) { ++st.credit_waits; });
  Backoff backoff;
  MoveProbe probe(*links_);
  while (true) {
    RDMAPS_RETURN_IF_ERROR(links_->ReadControl({s.index}, deadline));
    if (follow_) {
      bool posted = false;
      RDMAPS_RETURN_IF_ERROR(follow_->Advance(s, kSlotOps, &posted));
      RDMAPS_RETURN_IF_ERROR(FinishAll(s, deadline));
    }
    if (s.pushed_seq - s.applied_seq < s.dir.ring_slots) break;
    RDMAPS_RETURN_IF_ERROR(probe.Check({s.index}));  // its primary replaced meanwhile
    if (SteadyClock::now() >= deadline) {
      stats_->AddBlocked(SteadyClock::now() - start);
      return TimedOutError(ServerName(s) + " has consumed only " + std::to_string(s.applied_seq) +
                           " of worker " + std::to_string(links_->worker_id()) + "'s " +
                           std::to_string(s.pushed_seq) +
                           " pushes within wait_timeout: its apply thread is stuck or overloaded");
    }
    backoff.Pause(kOwnPushPollCap);
  }
  stats_->AddBlocked(SteadyClock::now() - start);
  return Status::OK();
}

Status PushWriter::PostSlot(ServerLink& s, SlotHeader h, std::size_t bytes,
                            std::span<const transport::Segment> data, bool read_control) {
  h.seq = s.pushed_seq + 1;
  if (h.seq <= s.replay_until) {
    // A call retried after a failover rebuilds a slot it sent before:
    // Recover sent it again already (or the server has it).
    s.pushed_seq = h.seq;
    return Status::OK();
  }
  std::byte* staged = Staging(s);
  const transport::MemoryRegion* staged_mr = StagingMr(s);
  std::memcpy(staged, &h, sizeof(h));
  CHECK_LE(data.size(), kMaxGatherRuns);
  Op ops[kMaxGatherRuns + 2];
  transport::Segment gather[kMaxGatherRuns + 1];
  std::size_t n = 0;
  std::uint64_t total = bytes;
  const std::uint64_t slot = SlotAddress(s, h.seq);
  const std::uint32_t imm = ImmOfSeq(h.seq);
  if (data.empty()) {
    ops[n++] = Op::WriteWithImm(staged, staged_mr, bytes, slot, s.ring.rkey, imm);
  } else if (data.size() + 1 <= s.conn->max_segments()) {
    gather[0] = {staged, staged_mr, static_cast<std::uint32_t>(bytes)};
    std::copy(data.begin(), data.end(), gather + 1);
    for (const transport::Segment& seg : data) total += seg.length;
    ops[n++] = Op::WriteWithImmGather({gather, data.size() + 1}, slot, s.ring.rkey, imm);
  } else {
    std::uint64_t at = slot + bytes;
    for (const transport::Segment& seg : data) {
      ops[n++] = Op::Write(seg.addr, seg.mr, seg.length, at, s.ring.rkey);
      at += seg.length;
      total += seg.length;
    }
    ops[n++] = Op::WriteWithImm(staged, staged_mr, bytes, slot, s.ring.rkey, imm);
  }
  // Half the credits used: refresh them with a READ behind the write, in the
  // same doorbell, so a steady pusher rarely stops to poll.
  // A follower wants to know as soon as possible: behind every slot.
  const bool refresh = !s.ctrl_inflight && (read_control || follow_ != nullptr ||
                                            (h.seq - s.applied_seq) * 2 >= s.dir.ring_slots);
  if (refresh) {
    ops[n++] = Op::Read(s.ctrl.get(), s.ctrl_mr.get(), s.ctrl_bytes, s.dir.control.addr,
                        s.dir.control.rkey);
  }
  RDMAPS_RETURN_IF_ERROR(links_->PostOps(s, {ops, n}));
  if (s.retain) {
    DCHECK(StagesInRetain(s));
    // Kept until acknowledged: a new primary gets it again (Resend). The
    // slot was staged in its retain slot; the caller's pieces (zero-copy)
    // are copied behind it now, while the NIC reads them.
    std::size_t off = bytes;
    for (const transport::Segment& seg : data) {
      std::memcpy(staged + off, seg.addr, seg.length);
      off += seg.length;
    }
    s.retain_len[(h.seq - 1) % s.dir.ring_slots] = static_cast<std::uint32_t>(off);
  }
  s.ctrl_inflight |= refresh;
  s.slots_in_flight.push_back({static_cast<std::uint32_t>(n), refresh});
  s.pushed_seq = h.seq;
  stats_->Update([&](ClientStats& st) { st.bytes_written += total; });
  return Status::OK();
}

template <typename HasMore, typename PostNext>
Status PushWriter::SendPipelined(HasMore&& has_more, PostNext&& post_next, Deadline deadline) {
  const std::uint32_t S = links_->size();
  Status st;
  for (bool any = true; any && st.ok();) {
    any = false;
    for (std::uint32_t si = 0; si < S && st.ok(); ++si) {
      if (!has_more(si)) continue;
      any = true;
      ServerLink& s = (*links_)[si];
      st = MakeRoom(s, deadline);
      // Follower READs share the connection: room for this slot's ops.
      while (st.ok() && follow_ && !s.slots_in_flight.empty() &&
             s.conn->outstanding() + kSlotOps > s.conn->max_outstanding()) {
        st = FinishOldest(s, deadline);
      }
      if (st.ok()) st = EnsureCredit(s, deadline);
      if (st.ok()) st = post_next(s);
    }
  }
  for (std::uint32_t si = 0; si < S; ++si) {
    Status f = FinishAll((*links_)[si], deadline);
    if (st.ok()) st = f;
  }
  return st;
}

Status PushWriter::PostLoneControl(ServerLink& s) {
  if (s.ctrl_inflight || s.conn->outstanding() + 1 > s.conn->max_outstanding()) {
    return Status::OK();  // (a poll is under way, or the READs in flight will make room)
  }
  const Op op =
      Op::Read(s.ctrl.get(), s.ctrl_mr.get(), s.ctrl_bytes, s.dir.control.addr, s.dir.control.rkey);
  RDMAPS_RETURN_IF_ERROR(links_->PostOps(s, {&op, 1}));
  s.ctrl_inflight = true;
  s.slots_in_flight.push_back({1, true, ServerLink::kLoneControl});
  ++s.reads_in_flight;
  return Status::OK();
}

Status PushWriter::FollowTail(Deadline deadline) {
  follow_tail_ = true;
  Status st;
  auto idle_since = SteadyClock::now();
  Backoff backoff;
  std::uint64_t progress = follow_->bytes_read();
  while (st.ok()) {
    bool pending = false;
    for (std::uint32_t si = 0; si < links_->size() && st.ok(); ++si) {
      ServerLink& s = (*links_)[si];
      // (One held back by the staleness bound is left to the normal pull's wait.)
      if (!follow_->Pending(s) || follow_->ClockBlocked(s)) continue;
      pending = true;
      st = PostLoneControl(s);
    }
    if (!pending) break;
    for (std::uint32_t si = 0; si < links_->size(); ++si) {
      Status f = FinishAll((*links_)[si], deadline);
      if (st.ok()) st = f;
    }
    if (follow_->bytes_read() != progress) {
      progress = follow_->bytes_read();
      idle_since = SteadyClock::now();
      backoff = Backoff();
    } else if (SteadyClock::now() - idle_since >= kFollowIdle) {
      break;
    } else {
      backoff.Pause(kOwnPushPollCap);
    }
  }
  follow_tail_ = false;
  return st;
}

Status PushWriter::PushRange(const RemoteTable& t, RowRange range, std::span<const float> grads,
                             const transport::MemoryRegion* user_mr, std::uint64_t clock,
                             Deadline deadline, RangeFollower* follow) {
  follow_ = follow;
  struct Reset {
    PushWriter* w;
    ~Reset() { w->follow_ = nullptr; }
  } reset{this};
  const std::uint32_t S = links_->size();
  const std::uint32_t dim = t.info.dim;
  std::uint64_t copied = 0;
  // Per server the remaining sub-range; each round sends one slot per server.
  std::vector<RowRange> todo(S);
  for (std::uint32_t si = 0; si < S; ++si) {
    const ShardRemote& sh = t.shards[si];
    const std::uint64_t b = std::max(sh.begin, range.begin);
    const std::uint64_t e = std::min(sh.begin + sh.count, range.begin + range.count);
    if (b < e) todo[si] = {b, e - b};
  }
  auto has_more = [&](std::uint32_t si) { return todo[si].count > 0; };
  auto post_next = [&](ServerLink& s) {
    const std::uint32_t si = s.index;
    const std::uint64_t cap = SlotRowCapacity(s.dir.slot_bytes, dim, false);
    const std::uint64_t n = std::min(cap, todo[si].count);
    SlotHeader h{};
    h.clock = clock;
    h.table = t.info.id;
    h.kind = static_cast<std::uint32_t>(SlotKind::kRange);
    h.num_rows = static_cast<std::uint32_t>(n);
    h.first_row = todo[si].begin;
    const std::size_t bytes = n * dim * sizeof(float);
    const float* src = grads.data() + (todo[si].begin - range.begin) * dim;
    Status st;
    if (user_mr) {
      const transport::Segment data{const_cast<float*>(src), user_mr,
                                    static_cast<std::uint32_t>(bytes)};
      st = PostSlot(s, h, sizeof(SlotHeader), {&data, 1});
    } else {
      std::memcpy(Staging(s) + sizeof(SlotHeader), src, bytes);
      copied += bytes;
      st = PostSlot(s, h, sizeof(SlotHeader) + bytes);
    }
    if (st.ok()) {
      todo[si].begin += n;
      todo[si].count -= n;
      if (follow_) follow_->OnSlot(s, s.pushed_seq, todo[si].begin);
    }
    return st;
  };
  RDMAPS_RETURN_IF_ERROR(SendPipelined(has_more, post_next, deadline));
  if (follow_) RDMAPS_RETURN_IF_ERROR(FollowTail(deadline));
  stats_->Update([&](ClientStats& st) {
    st.bytes_staged += copied;
    if (user_mr) ++st.zero_copy_calls;
  });
  return Status::OK();
}

Status PushWriter::PushRows(const RemoteTable& t, std::span<const std::uint64_t> rows,
                            std::span<const float> grads, const transport::MemoryRegion* user_mr,
                            std::uint64_t clock, Deadline deadline) {
  const std::uint32_t S = links_->size();
  const std::uint32_t dim = t.info.dim;
  const std::size_t row_bytes = RowBytes(dim);
  std::uint64_t copied = 0;
  bool zero_copy = false;
  std::vector<std::vector<std::uint32_t>> by_server(S);  // indices into rows
  for (std::size_t i = 0; i < rows.size(); ++i) {
    by_server[ServerOfRow(t.info.rows, S, rows[i])].push_back(static_cast<std::uint32_t>(i));
  }
  std::vector<std::size_t> next(S, 0);
  transport::Segment data[kMaxGatherRuns];
  auto has_more = [&](std::uint32_t si) { return next[si] < by_server[si].size(); };
  auto post_next = [&](ServerLink& s) {
    const std::uint32_t si = s.index;
    const auto& idx = by_server[si];
    const std::uint64_t cap = SlotRowCapacity(s.dir.slot_bytes, dim, true);
    const std::size_t n = std::min<std::size_t>(cap, idx.size() - next[si]);
    const std::uint32_t* slot_idx = idx.data() + next[si];
    SlotHeader h{};
    h.clock = clock;
    h.table = t.info.id;
    h.kind = static_cast<std::uint32_t>(SlotKind::kRows);
    h.num_rows = static_cast<std::uint32_t>(n);
    std::byte* ids = Staging(s) + sizeof(SlotHeader);
    for (std::size_t k = 0; k < n; ++k) std::memcpy(ids + k * 8, &rows[slot_idx[k]], 8);
    // Gradients of consecutive indices are one piece of the caller's
    // buffer: WRITE them from there when there are few pieces.
    std::size_t pieces = 0;
    if (user_mr) {
      for (std::size_t k = 0; k < n && pieces <= kMaxGatherRuns; ++pieces) {
        std::size_t e = k + 1;
        while (e < n && slot_idx[e] == slot_idx[e - 1] + 1) ++e;
        if (pieces < kMaxGatherRuns) {
          data[pieces] = {const_cast<float*>(grads.data()) + std::size_t{slot_idx[k]} * dim,
                          user_mr, static_cast<std::uint32_t>((e - k) * row_bytes)};
        }
        k = e;
      }
    }
    Status st;
    if (user_mr && pieces <= kMaxGatherRuns) {
      zero_copy = true;
      st = PostSlot(s, h, sizeof(SlotHeader) + n * 8, {data, pieces});
    } else {
      std::byte* g = ids + n * 8;
      for (std::size_t k = 0; k < n; ++k) {
        std::memcpy(g + k * row_bytes, grads.data() + std::size_t{slot_idx[k]} * dim, row_bytes);
      }
      copied += n * row_bytes;
      st = PostSlot(s, h, sizeof(SlotHeader) + n * (8 + row_bytes));
    }
    if (st.ok()) next[si] += n;
    return st;
  };
  RDMAPS_RETURN_IF_ERROR(SendPipelined(has_more, post_next, deadline));
  stats_->Update([&](ClientStats& st) {
    st.bytes_staged += copied;
    if (zero_copy) ++st.zero_copy_calls;
  });
  return Status::OK();
}

Status PushWriter::SendControlSlot(SlotKind kind, std::uint64_t clock, Deadline deadline,
                                   bool read_control) {
  std::vector<bool> sent(links_->size(), false);
  auto has_more = [&](std::uint32_t si) { return !sent[si]; };
  auto post_next = [&](ServerLink& s) {
    SlotHeader h{};
    h.clock = clock;
    h.kind = static_cast<std::uint32_t>(kind);
    // No slot is in flight when a call starts, so this READ is a new one.
    RDMAPS_RETURN_IF_ERROR(PostSlot(s, h, sizeof(SlotHeader), {}, read_control));
    sent[s.index] = true;
    return Status::OK();
  };
  return SendPipelined(has_more, post_next, deadline);
}

Status PushWriter::Resend(ServerLink& s, Deadline deadline) {
  if (!s.retain) return Status::OK();
  const std::size_t batch = std::max<std::size_t>(1, s.conn->max_outstanding() / 2);
  std::vector<Op> ops;
  std::uint64_t resent = 0;
  for (std::uint64_t seq = s.applied_seq + 1; seq <= s.pushed_seq; ++seq) {
    const std::size_t at = (seq - 1) % s.dir.ring_slots;
    ops.push_back(Op::WriteWithImm(s.retain.get() + at * std::size_t{s.dir.slot_bytes},
                                   s.retain_mr.get(), s.retain_len[at], SlotAddress(s, seq),
                                   s.ring.rkey, ImmOfSeq(seq)));
    ++resent;
    if (ops.size() == batch || seq == s.pushed_seq) {
      RDMAPS_RETURN_IF_ERROR(links_->Exec(s, ops, deadline));
      ops.clear();
    }
  }
  stats_->Update([&](ClientStats& st) { st.pushes_resent += resent; });
  return Status::OK();
}

Status PushWriter::SendRewind(const std::vector<std::uint32_t>& servers, std::uint64_t clock,
                              std::uint64_t id, Deadline deadline) {
  std::vector<bool> todo(links_->size(), false);
  for (std::uint32_t i : servers) todo[i] = true;
  auto has_more = [&](std::uint32_t si) { return bool(todo[si]); };
  auto post_next = [&](ServerLink& s) {
    SlotHeader h{};
    h.clock = clock;
    h.kind = static_cast<std::uint32_t>(SlotKind::kRewind);
    h.first_row = id;
    RDMAPS_RETURN_IF_ERROR(PostSlot(s, h, sizeof(SlotHeader)));
    todo[s.index] = false;
    return Status::OK();
  };
  return SendPipelined(has_more, post_next, deadline);
}

}  // namespace rdmaps::internal

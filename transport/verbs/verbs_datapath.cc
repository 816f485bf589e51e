// The verbs data path: posting work requests and turning completions into
// one Completion per op. Setup lives in verbs_transport.cc (lifecycle),
// verbs_cm.cc (connections) and verbs_device.cc (the device).
//
// Selective signaling. A signaled send WR costs a CQE and a PCIe write of it
// per op; on RC a signaled CQE also says every earlier WR on the QP has
// completed, so we ask for one CQE in `signal_every_` WRs plus one for the
// last WR of every Post (else a short batch would never report), and
// synthesize the unsignaled ops' Completions in posting order when a later
// CQE arrives. The SQ is max_outstanding_ deep and an op counts as
// outstanding until the caller polls it, so the SQ can never overflow.
//
// Errors. A failed WR always produces a CQE, signaled or not. Ops before it
// completed (RC completes in order); it carries the mapped error; the QP is
// now in the error state, so every later op flushes and becomes Cancelled.
//
// Clock reads. Where the clocksource is not the TSC - virtual machines, e.g.
// the TCG VM of our Soft-RoCE tests, whose clocksource is the HPET -
// steady_clock::now() is a syscall plus an emulated device read, 1.5-3.5 us,
// comparable to a whole rxe round trip. So the per-op path reads no precise
// clock: Post stamps ops with the coarse clock (a memory read in the vDSO;
// op_timeout has millisecond granularity anyway), and Wait polls first and
// then reads the clock only every kPollsPerClockRead polls while spinning.
#include <endian.h>
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/verbs/verbs_internal.h"

namespace rdmaps::transport::verbs::internal {
namespace {

constexpr int kPollBatch = 32;
// Polls between two clock reads while Wait spins: a poll of an empty CQ is a
// few loads, a clock read can cost a thousand times more (see above).
constexpr std::uint32_t kPollsPerClockRead = 64;

ibv_wr_opcode ToOpcode(OpType t) {
  switch (t) {
    case OpType::kRead:
      return IBV_WR_RDMA_READ;
    case OpType::kWrite:
      return IBV_WR_RDMA_WRITE;
    case OpType::kWriteWithImm:
      return IBV_WR_RDMA_WRITE_WITH_IMM;
    case OpType::kFetchAdd:
      return IBV_WR_ATOMIC_FETCH_AND_ADD;
    case OpType::kCompareSwap:
      return IBV_WR_ATOMIC_CMP_AND_SWP;
  }
  return IBV_WR_RDMA_READ;
}

bool IsAtomic(OpType t) { return t == OpType::kFetchAdd || t == OpType::kCompareSwap; }

}  // namespace

Status WcStatusToStatus(const ibv_wc& wc, OpType type) {
  std::string what = std::string(OpTypeName(type)) + " failed: " + ibv_wc_status_str(wc.status) +
                     " (vendor error " + std::to_string(wc.vendor_err) + ")";
  switch (wc.status) {
    case IBV_WC_SUCCESS:
      return Status::OK();
    case IBV_WC_REM_ACCESS_ERR:
      return PermissionDeniedError(
          what +
          ": the target refused the access - the rkey is unknown or was "
          "deregistered, the region lacks the access right, or the address "
          "range lies outside it; re-fetch the RemoteRegion from the peer");
    case IBV_WC_REM_INV_REQ_ERR:
      return InvalidArgumentError(what +
                                  ": the target found the request invalid (length beyond its "
                                  "limits, or an atomic on an unaligned address)");
    case IBV_WC_WR_FLUSH_ERR:
      return CancelledError(what +
                            ": flushed because the connection closed or an "
                            "earlier op on it failed");
    case IBV_WC_RETRY_EXC_ERR:
      return UnavailableError(what +
                              ": transport retry counter exceeded - the peer stopped answering "
                              "(process gone, link down, or wrong GID/route); check the peer is "
                              "alive and reachable (`rdmaps-doctor --peer ADDR`)");
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return UnavailableError(what +
                              ": receiver-not-ready retries exceeded - the "
                              "peer posted no receive for a WRITE_WITH_IMM");
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
      return UnavailableError(what +
                              ": the target could not complete the op "
                              "(its queue pair failed); reconnect");
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      return InvalidArgumentError(what +
                                  ": the local buffer is not covered by a "
                                  "live registration on this endpoint");
    default:
      return IOError(what);
  }
}

Status VerbsConnection::ValidateLocal(const void* addr, const MemoryRegion* local_mr,
                                      std::uint64_t length) const {
  const auto* mr = dynamic_cast<const VerbsMemoryRegion*>(local_mr);
  if (mr == nullptr || mr->shared() != shared_.get()) {
    return InvalidArgumentError(
        "op's local_mr is null or was not registered on this endpoint; register "
        "the local buffer with this Endpoint::Register");
  }
  if (!mr->Contains(addr, length)) {
    return InvalidArgumentError("op's local buffer [" + std::to_string(length) +
                                " bytes] lies outside its local_mr");
  }
  return Status::OK();
}

Status VerbsConnection::Validate(const Op& op) const {
  if (op.num_segments > 0) {
    RDMAPS_RETURN_IF_ERROR(ValidateSegments(
        op, max_segments_, [this](const void* a, const MemoryRegion* m, std::uint64_t n) {
          return ValidateLocal(a, m, n);
        }));
  } else {
    RDMAPS_RETURN_IF_ERROR(ValidateLocal(op.local, op.local_mr, op.length));
  }
  if (op.length > shared_->dev_attr.max_mr_size || op.length > (1ull << 31)) {
    return InvalidArgumentError("op length " + std::to_string(op.length) +
                                " exceeds the 2 GiB message limit; split it");
  }
  if (IsAtomic(op.type)) {
    if (op.length != 8) {
      return InvalidArgumentError("atomic op needs length 8, got " + std::to_string(op.length));
    }
    if (op.remote_addr % 8 != 0) {
      return InvalidArgumentError("atomic op on misaligned remote address 0x" + [&] {
        char b[32];
        std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(op.remote_addr));
        return std::string(b);
      }() + "; atomics need 8-byte alignment");
    }
  }
  return Status::OK();
}

Status VerbsConnection::Post(std::span<const Op> ops) {
  if (ops.empty()) return Status::OK();
  if (closed_.load(std::memory_order_relaxed)) {
    return UnavailableError("Post on a closed verbs connection to " + peer_.address);
  }
  if (broken_.load(std::memory_order_acquire)) {
    return UnavailableError("connection to " + peer_.address +
                            " is broken: " + health().ToString() + "; reconnect");
  }
  for (const Op& op : ops) RDMAPS_RETURN_IF_ERROR(Validate(op));
  if (outstanding() + ops.size() > max_outstanding_) {
    return ResourceExhaustedError(
        "batch of " + std::to_string(ops.size()) + " ops would exceed max_outstanding " +
        std::to_string(max_outstanding_) + " (" + std::to_string(outstanding()) +
        " outstanding); poll completions first");
  }

  const std::size_t n = ops.size();
  std::size_t total_sges = 0;
  for (const Op& op : ops) total_sges += std::max<std::size_t>(op.num_segments, 1);
  wrs_.assign(n, ibv_send_wr{});
  sges_.assign(total_sges, ibv_sge{});  // not resized below: the WRs point into it
  std::size_t next_sge = 0;
  const auto now = CoarseNowCeil();
  const std::uint64_t first_seq = next_seq_;
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = ops[i];
    ibv_send_wr& wr = wrs_[i];
    const std::uint64_t seq = first_seq + i;
    wr.wr_id = seq;
    wr.next = (i + 1 < n) ? &wrs_[i + 1] : nullptr;
    wr.opcode = ToOpcode(op.type);
    if (op.num_segments > 0) {
      wr.sg_list = &sges_[next_sge];
      for (std::uint32_t k = 0; k < op.num_segments; ++k) {
        const Segment& seg = op.segments[k];
        if (seg.length == 0) continue;
        ibv_sge& sge = sges_[next_sge++];
        sge.addr = reinterpret_cast<std::uint64_t>(seg.addr);
        sge.length = seg.length;
        sge.lkey = seg.mr->lkey();
        ++wr.num_sge;
      }
      if (wr.num_sge == 0) wr.sg_list = nullptr;
    } else if (op.length > 0) {
      ibv_sge& sge = sges_[next_sge++];
      sge.addr = reinterpret_cast<std::uint64_t>(op.local);
      sge.length = static_cast<std::uint32_t>(op.length);
      sge.lkey = op.local_mr->lkey();
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    unsigned flags = 0;
    if (i + 1 == n || seq % signal_every_ == signal_every_ - 1) {
      flags |= IBV_SEND_SIGNALED;
    }
    if (op.flags & kFence) flags |= IBV_SEND_FENCE;
    if ((op.type == OpType::kWrite || op.type == OpType::kWriteWithImm) && op.length > 0 &&
        op.length <= max_inline_) {
      flags |= IBV_SEND_INLINE;  // the CPU copies now; no DMA read of `local`
    }
    wr.send_flags = flags;
    if (IsAtomic(op.type)) {
      wr.wr.atomic.remote_addr = op.remote_addr;
      wr.wr.atomic.rkey = op.rkey;
      wr.wr.atomic.compare_add = op.compare_add;
      wr.wr.atomic.swap = op.swap;
    } else {
      wr.wr.rdma.remote_addr = op.remote_addr;
      wr.wr.rdma.rkey = op.rkey;
      if (op.type == OpType::kWriteWithImm) wr.imm_data = htobe32(op.imm);
    }
  }

  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_.get(), wrs_.data(), &bad);  // one doorbell
  std::size_t posted = n;
  if (rc != 0) posted = static_cast<std::size_t>(bad - wrs_.data());
  for (std::size_t i = 0; i < posted; ++i) {
    pending_.push_back({first_seq + i, ops[i].context, ops[i].type, now});
  }
  next_seq_ = first_seq + posted;
  if (rc != 0) {
    Status s = ErrnoError("ibv_post_send to " + peer_.address, rc);
    if (posted > 0) {
      // The posted prefix has no signaled tail: fail the connection so its
      // ops flush and complete instead of waiting forever.
      SetHealth(s);
      MoveQpToError();
      s = s.WithContext(std::to_string(posted) + " of " + std::to_string(n) +
                        " ops were posted and will complete as Cancelled");
    }
    return s;
  }
  return Status::OK();
}

void VerbsConnection::OnWc(const ibv_wc& wc) {
  // The handshake's sends are not the data path's ops; had one failed, the
  // QP is in error and the data path's own ops say so.
  if (wc.wr_id == kHandshakeWrId) return;
  const std::uint64_t seq = wc.wr_id;
  if (wc.status == IBV_WC_SUCCESS && !errored_) {
    while (!pending_.empty() && pending_.front().seq <= seq) {
      const PendingOp& p = pending_.front();
      ready_.push_back({p.context, p.type, Status::OK()});
      pending_.pop_front();
    }
    return;
  }
  if (!errored_) {
    // Everything before the first failed WR completed successfully.
    while (!pending_.empty() && pending_.front().seq < seq) {
      const PendingOp& p = pending_.front();
      ready_.push_back({p.context, p.type, Status::OK()});
      pending_.pop_front();
    }
    errored_ = true;
    if (!pending_.empty() && pending_.front().seq == seq) {
      const PendingOp& p = pending_.front();
      Status s = WcStatusToStatus(wc, p.type);
      if (wc.status == IBV_WC_WR_FLUSH_ERR) {
        // Flushed before anything failed: we closed it, the peer left, or
        // the QP died. Say why when we know.
        Status h = health();
        s = h.ok() || h.code() == StatusCode::kCancelled
                ? s
                : Status(h.code(),
                         std::string(OpTypeName(p.type)) + " not executed: " + h.message());
      }
      SetHealth(s);
      ready_.push_back({p.context, p.type, std::move(s)});
      pending_.pop_front();
    }
    return;
  }
  while (!pending_.empty() && pending_.front().seq <= seq) {
    const PendingOp& p = pending_.front();
    ready_.push_back({p.context, p.type,
                      CancelledError(std::string(OpTypeName(p.type)) +
                                     " cancelled: an earlier op on this connection "
                                     "failed or it was closed (" +
                                     health().ToString() + ")")});
    pending_.pop_front();
  }
}

Status VerbsConnection::PostHandshakeSends(std::span<const std::uint32_t> imms) {
  std::vector<ibv_send_wr> wrs(imms.size());
  for (std::size_t i = 0; i < imms.size(); ++i) {
    ibv_send_wr& wr = wrs[i];
    wr.wr_id = kHandshakeWrId;
    wr.next = i + 1 < imms.size() ? &wrs[i + 1] : nullptr;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htobe32(imms[i]);
    wr.send_flags = i + 1 == imms.size() ? IBV_SEND_SIGNALED : 0;
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp_.get(), wrs.data(), &bad); rc != 0) {
    return ErrnoError("ibv_post_send (handshake) to " + peer_.address, rc);
  }
  return Status::OK();
}

std::size_t VerbsConnection::DrainCq() {
  if (!cq_) return 0;
  std::size_t total = 0;
  ibv_wc wcs[kPollBatch];
  while (true) {
    int got = ibv_poll_cq(cq_.get(), kPollBatch, wcs);
    if (got <= 0) break;
    for (int i = 0; i < got; ++i) OnWc(wcs[i]);
    total += static_cast<std::size_t>(got);
    if (got < kPollBatch) break;
  }
  return total;
}

std::size_t VerbsConnection::MoveReady(std::span<Completion> out) {
  std::size_t n = std::min(out.size(), ready_.size());
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = std::move(ready_.front());
    ready_.pop_front();
  }
  return n;
}

std::size_t VerbsConnection::Poll(std::span<Completion> out) {
  if (ready_.size() < out.size()) DrainCq();
  return MoveReady(out);
}

void VerbsConnection::FailOldestForTimeout() {
  if (pending_.empty()) return;
  const PendingOp p = pending_.front();
  pending_.pop_front();
  Status s = TimedOutError(
      std::string(OpTypeName(p.type)) + " to " + peer_.address +
      " got no answer within op_timeout " + std::to_string(shared_->options.op_timeout.count()) +
      " ms; the peer or the fabric is stuck - check it with `rdmaps-doctor --peer`");
  SetHealth(s);
  ready_.push_back({p.context, p.type, std::move(s)});
  errored_ = true;
  MoveQpToError();  // the rest flush and complete as Cancelled
}

Result<std::size_t> VerbsConnection::Wait(std::span<Completion> out, Deadline deadline) {
  if (outstanding() == 0) {
    return FailedPreconditionError("Wait with no outstanding ops: post first");
  }
  if (out.empty()) return InvalidArgumentError("Wait needs room for one completion");
  SteadyClock::time_point spin_until{};  // set at the first clock read
  bool clock_read = false;
  std::uint32_t polls_left = 0;  // polls before the next clock read
  while (true) {
    std::size_t n = Poll(out);
    if (n > 0) return n;
    if (polls_left > 0) {
      --polls_left;
      continue;
    }
    const auto now = SteadyClock::now();
    if (!clock_read) {
      spin_until = now + busy_poll_;
      clock_read = true;
    }
    if (!pending_.empty() && now >= pending_.front().posted + shared_->options.op_timeout) {
      FailOldestForTimeout();
      continue;
    }
    if (now >= deadline) return std::size_t{0};
    if (now < spin_until) {
      polls_left = kPollsPerClockRead;
      continue;
    }

    // Sleep in the kernel: arm, re-check (a CQE may have raced the arm), wait.
    if (ibv_req_notify_cq(cq_.get(), 0) != 0) {
      return IOError("ibv_req_notify_cq failed on the connection to " + peer_.address);
    }
    n = Poll(out);
    if (n > 0) return n;
    auto wake = deadline;
    if (!pending_.empty()) {
      wake = std::min(wake, pending_.front().posted + shared_->options.op_timeout);
    }
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - SteadyClock::now());
    pollfd pfd{channel_->fd, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::clamp<std::int64_t>(ms.count(), 0, 1000)));
    if (rc < 0 && errno != EINTR) return ErrnoError("poll on the completion channel", errno);
    if (rc > 0) {
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(channel_.get(), &ev_cq, &ev_ctx) == 0) {
        ibv_ack_cq_events(ev_cq, 1);
      }
    }
  }
}

}  // namespace rdmaps::transport::verbs::internal

// The tcp backend's hot path: posting ops and reaping their responses on the
// initiator (TcpConnection, run by the caller's thread), and serving inbound
// ops on the target (EndpointCore::Serve, run by the progress thread).
// Both halves of the wire protocol's hot path in one file (over 700 lines) so
// that the request and response framing each side assumes of the other can
// be read together.
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "src/base/log.h"
#include "transport/racy_copy.h"
#include "transport/tcp/tcp_frames.h"
#include "transport/tcp/tcp_internal.h"

namespace rdmaps::transport::tcp {
namespace {

constexpr int kMaxIov = 256;

bool IsMutation(std::uint8_t opcode) { return opcode != static_cast<std::uint8_t>(WireOp::kRead); }

WireOp ToWire(OpType t) {
  switch (t) {
    case OpType::kRead:
      return WireOp::kRead;
    case OpType::kWrite:
      return WireOp::kWrite;
    case OpType::kWriteWithImm:
      return WireOp::kWriteWithImm;
    case OpType::kFetchAdd:
      return WireOp::kFetchAdd;
    case OpType::kCompareSwap:
      return WireOp::kCompareSwap;
  }
  return WireOp::kRead;
}

bool IsAtomic(OpType t) { return t == OpType::kFetchAdd || t == OpType::kCompareSwap; }

std::string Hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// Under TSan these go through syscall(2), which TSan does not intercept: the
// kernel's copy from/to registered memory is DMA-like by design (see
// transport/racy_copy.h for why a suppression alone is not enough).
__attribute__((noinline)) ssize_t RacySendmsg(int fd, const msghdr* msg) {
#ifdef RDMAPS_TSAN
  return ::syscall(SYS_sendmsg, fd, msg, MSG_NOSIGNAL);
#else
  return ::sendmsg(fd, msg, MSG_NOSIGNAL);
#endif
}

__attribute__((noinline)) ssize_t RacyReadv(int fd, const iovec* iov, int count) {
#ifdef RDMAPS_TSAN
  return ::syscall(SYS_readv, fd, iov, count);
#else
  return ::readv(fd, iov, count);
#endif
}

// ---------------------------------------------------------------------------
// TxQueue

TxQueue::TxQueue() { own_.reserve(4096); }

std::byte* TxQueue::AppendOwned(std::size_t n) {
  std::size_t off = own_.size();
  own_.resize(off + n);
  if (!segs_.empty() && segs_.back().ptr == nullptr && head_ < segs_.size() &&
      segs_.back().offset + segs_.back().length == off) {
    segs_.back().length += n;
  } else {
    segs_.push_back(Segment{nullptr, off, n, 0});
  }
  return own_.data() + off;
}

void TxQueue::AppendExternal(const void* p, std::size_t n, std::uint32_t rkey_or_zero) {
  if (n == 0) return;
  segs_.push_back(Segment{static_cast<const std::byte*>(p), 0, n, rkey_or_zero});
  if (rkey_or_zero != 0) ++region_ranges_;
}

bool TxQueue::RegionRangesValid(const RegionTable& table) const {
  if (region_ranges_ == 0) return true;
  for (std::size_t i = head_; i < segs_.size(); ++i) {
    const Segment& s = segs_[i];
    if (s.rkey == 0) continue;
    const RegionEntry* e = table.FindLocked(s.rkey);
    if (e == nullptr) return false;
  }
  return true;
}

bool TxQueue::RegionRangesOverlap(const std::byte* p, std::size_t n) const {
  if (region_ranges_ == 0) return false;
  for (std::size_t i = head_; i < segs_.size(); ++i) {
    const Segment& s = segs_[i];
    if (s.rkey == 0) continue;
    const std::byte* b = s.ptr + (i == head_ ? head_sent_ : 0);
    if (b < p + n && p < s.ptr + s.length) return true;
  }
  return false;
}

void TxQueue::Clear() {
  own_.clear();
  segs_.clear();
  head_ = 0;
  head_sent_ = 0;
  region_ranges_ = 0;
}

Result<bool> TxQueue::Flush(int fd) {
  while (head_ < segs_.size()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (std::size_t i = head_; i < segs_.size() && n < kMaxIov; ++i, ++n) {
      const Segment& s = segs_[i];
      const std::byte* base = s.ptr != nullptr ? s.ptr : own_.data() + s.offset;
      std::size_t skip = i == head_ ? head_sent_ : 0;
      iov[n].iov_base = const_cast<std::byte*>(base + skip);
      iov[n].iov_len = s.length - skip;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    ssize_t w = RacySendmsg(fd, &msg);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      return UnavailableError(std::string("send failed: ") + std::strerror(errno));
    }
    auto left = static_cast<std::size_t>(w);
    while (left > 0) {
      Segment& s = segs_[head_];
      std::size_t rest = s.length - head_sent_;
      if (left >= rest) {
        left -= rest;
        if (s.rkey != 0) --region_ranges_;
        ++head_;
        head_sent_ = 0;
      } else {
        head_sent_ += left;
        left = 0;
      }
    }
  }
  Clear();
  return true;
}

// ---------------------------------------------------------------------------
// Target: serving inbound ops (progress thread).

void EndpointCore::Enqueue(Inbound& in, std::uint8_t opcode, std::uint8_t status,
                           std::uint32_t length, std::uint64_t value) {
  ResponseWire r{};
  r.magic = kResponseMagic;
  r.opcode = opcode;
  r.status = status;
  r.length.set(length);
  r.value.set(value);
  std::memcpy(in.tx.AppendOwned(sizeof(r)), &r, sizeof(r));
}

void EndpointCore::ErrorResponse(Inbound& in, std::uint8_t opcode, const Status& status) {
  std::string msg = status.message().substr(0, kMaxMessageBytes);
  Enqueue(in, opcode, static_cast<std::uint8_t>(status.code()),
          static_cast<std::uint32_t>(msg.size()), 0);
  std::memcpy(in.tx.AppendOwned(msg.size()), msg.data(), msg.size());
  // Like an RC queue pair after a remote access error: execute nothing more.
  in.phase = Inbound::Phase::kDraining;
  in.in_payload = false;
  in.rx_begin = in.rx_end = 0;
  in.deadline = DeadlineAfter(options_.op_timeout);
}

void EndpointCore::FinishWrite(Inbound& in) {
  const RequestWire& req = in.payload_req;
  in.in_payload = false;
  Enqueue(in, req.opcode, 0, 0, 0);
  if (req.opcode == static_cast<std::uint8_t>(WireOp::kWriteWithImm)) {
    Notification n;
    n.kind = Notification::Kind::kImmediate;
    n.peer_id = in.peer_id;
    n.connection = in.session;
    n.imm = req.imm.get();
    n.length = req.length.get();
    PushNotification(n);
  }
}

bool EndpointCore::MayChangePendingReads(const Inbound& in, const RequestWire& req) const {
  if ((req.flags & kWireFence) != 0) return true;
  const RegionEntry* e = regions_->FindLocked(req.rkey.get());
  const std::uint64_t addr = req.remote_addr.get(), len = req.length.get();
  const auto base = reinterpret_cast<std::uintptr_t>(e ? e->base : nullptr);
  // (An op Execute refuses changes nothing; it is judged there.)
  if (e == nullptr || !RegionContains(base, e->size, addr, len)) return true;
  return in.tx.RegionRangesOverlap(e->base + (addr - base), len);
}

Status EndpointCore::Execute(Inbound& in, const RequestWire& req) {
  const auto op = static_cast<WireOp>(req.opcode);
  const std::uint64_t addr = req.remote_addr.get();
  const std::uint64_t len = req.length.get();
  const std::uint32_t rkey = req.rkey.get();
  std::uint32_t need = kRemoteRead;
  if (op == WireOp::kWrite || op == WireOp::kWriteWithImm) need = kRemoteWrite;
  if (op == WireOp::kFetchAdd || op == WireOp::kCompareSwap) need = kRemoteAtomic;

  const RegionEntry* e = regions_->FindLocked(rkey);
  Status refuse;
  const auto base = reinterpret_cast<std::uintptr_t>(e ? e->base : nullptr);
  if (e == nullptr) {
    refuse = PermissionDeniedError("rkey " + Hex(rkey) + " is not registered at peer " +
                                   std::to_string(options_.peer_id) +
                                   " (never registered, or deregistered); fetch a fresh "
                                   "RemoteRegion from the target");
  } else if ((e->access & need) == 0) {
    const char* right = need == kRemoteRead    ? "kRemoteRead"
                        : need == kRemoteWrite ? "kRemoteWrite"
                                               : "kRemoteAtomic";
    refuse = PermissionDeniedError("region rkey " + Hex(rkey) + " at peer " +
                                   std::to_string(options_.peer_id) + " lacks " + right +
                                   "; register it with that access right");
  } else if (!RegionContains(base, e->size, addr, len)) {
    refuse =
        OutOfRangeError("[" + Hex(addr) + ", +" + std::to_string(len) +
                        ") is outside region rkey " + Hex(rkey) + " [" + Hex(base) + ", +" +
                        std::to_string(e->size) + ") at peer " + std::to_string(options_.peer_id));
  } else if (need == kRemoteAtomic && (addr % 8 != 0)) {
    refuse = InvalidArgumentError("atomic at " + Hex(addr) + " is not 8-byte aligned");
  }
  if (!refuse.ok()) {
    ErrorResponse(in, req.opcode, refuse);
    return Status::OK();
  }
  std::byte* p = e->base + (addr - base);
  switch (op) {
    case WireOp::kRead:
      Enqueue(in, req.opcode, 0, static_cast<std::uint32_t>(len), 0);
      if (len <= kCopyThreshold) {
        RacyCopyFrom(in.tx.AppendOwned(len), p, len);
      } else {
        in.tx.AppendExternal(p, len, rkey);
      }
      break;
    case WireOp::kWrite:
    case WireOp::kWriteWithImm: {
      in.in_payload = true;
      in.payload_req = req;
      in.payload_done = 0;
      std::size_t avail = std::min<std::size_t>(in.rx_end - in.rx_begin, len);
      RacyCopyTo(p, in.rx.get() + in.rx_begin, avail);
      in.rx_begin += avail;
      in.payload_done = avail;
      if (avail == len) FinishWrite(in);
      break;
    }
    case WireOp::kFetchAdd:
    case WireOp::kCompareSwap: {
      std::uint64_t old;
      RacyCopyFrom(&old, p, sizeof(old));
      std::uint64_t next = old;
      if (op == WireOp::kFetchAdd) {
        next = old + req.compare_add.get();
      } else if (old == req.compare_add.get()) {
        next = req.swap.get();
      }
      if (next != old) RacyCopyTo(p, &next, sizeof(next));
      Enqueue(in, req.opcode, 0, 0, old);
      break;
    }
  }
  return Status::OK();
}

Status EndpointCore::ContinuePayload(Inbound& in, bool* blocked) {
  *blocked = false;
  const RequestWire& req = in.payload_req;
  const RegionEntry* e = regions_->FindLocked(req.rkey.get());
  if (e == nullptr) {
    ErrorResponse(in, req.opcode,
                  PermissionDeniedError("region rkey " + Hex(req.rkey.get()) + " at peer " +
                                        std::to_string(options_.peer_id) +
                                        " was deregistered while a WRITE into it was arriving"));
    return Status::OK();
  }
  std::byte* p = e->base + (req.remote_addr.get() - reinterpret_cast<std::uintptr_t>(e->base)) +
                 in.payload_done;
  const std::uint64_t left = req.length.get() - in.payload_done;
  // Straight into registered memory; the start of what follows the payload
  // (kDirectLookahead) lands in rx.
  in.rx_begin = in.rx_end = 0;
  iovec iov[2] = {{p, left}, {in.rx.get(), kDirectLookahead}};
  ssize_t r = RacyReadv(in.fd.get(), iov, 2);
  if (r == 0) return CancelledError("peer closed the connection in the middle of a WRITE");
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      *blocked = true;
      return Status::OK();
    }
    return UnavailableError(std::string("recv failed: ") + std::strerror(errno));
  }
  in.last_progress = SteadyClock::now();
  in.after_direct = true;
  auto got = static_cast<std::uint64_t>(r);
  if (got >= left) {
    in.payload_done += left;
    in.rx_end = static_cast<std::size_t>(got - left);
    FinishWrite(in);
  } else {
    in.payload_done += got;
  }
  return Status::OK();
}

Status EndpointCore::Serve(Inbound& in) {
  ReaderLock lock(regions_->mu());
  if (!in.tx.RegionRangesValid(*regions_)) {
    return UnavailableError(
        "a region was deregistered while a READ response from it was "
        "still being sent; the peer's op cannot complete");
  }
  bool drained = false;  // The last recv left the socket empty.
  // At most kRounds reads from the socket per call (fairness between peers);
  // the last round still executes what the reads before it brought into rx,
  // because epoll (level-triggered on the socket) would not call again for
  // requests that already left the socket.
  constexpr int kRounds = 16;
  for (int round = 0;; ++round) {
    const bool last = round + 1 >= kRounds;
    if (in.phase == Inbound::Phase::kDraining) {
      RDMAPS_ASSIGN_OR_RETURN(bool sent, in.tx.Flush(in.fd.get()));
      if (!sent) return Status::OK();
      ::shutdown(in.fd.get(), SHUT_WR);
      std::byte sink[4096];
      for (;;) {
        ssize_t r = ::recv(in.fd.get(), sink, sizeof(sink), 0);
        if (r > 0) continue;
        if (r == 0) return CancelledError("closed after a failed op");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
        return CancelledError("closed after a failed op");
      }
    }
    if (in.in_payload) {
      bool blocked = last;  // (last: rx is empty, the rest is in the socket)
      if (!last) RDMAPS_RETURN_IF_ERROR(ContinuePayload(in, &blocked));
      if (!blocked) continue;
      // The acknowledgements held back below go now: nothing more to read.
      RDMAPS_ASSIGN_OR_RETURN(bool sent, in.tx.Flush(in.fd.get()));
      (void)sent;  // UpdateEpoll waits for writability if needed
      return Status::OK();
    }
    // Execute every complete request already received.
    while (in.phase == Inbound::Phase::kServing && !in.in_payload &&
           in.rx_end - in.rx_begin >= sizeof(RequestWire)) {
      RequestWire req;
      std::memcpy(&req, in.rx.get() + in.rx_begin, sizeof(req));
      RDMAPS_RETURN_IF_ERROR(CheckRequest(req));
      if (in.tx.owned_bytes() > kMaxTxBacklog) {
        RDMAPS_ASSIGN_OR_RETURN(bool sent, in.tx.Flush(in.fd.get()));
        if (!sent) return Status::OK();
      }
      if (req.opcode == static_cast<std::uint8_t>(WireOp::kWriteWithImm) && NotificationsFull()) {
        // Like a receiver that is not ready: leave the request unread until
        // WaitNotifications has drained the queue (ResumePaused).
        in.paused = true;
        if (!in.paused_listed) {
          in.paused_listed = true;
          paused_.push_back(&in);
        }
        // Publish the pause, then look again: either the consumer sees
        // any_paused_ when it drains, or we see the drained queue here.
        any_paused_.store(true);
        if (NotificationsFull()) {
          RDMAPS_ASSIGN_OR_RETURN(bool sent, in.tx.Flush(in.fd.get()));
          (void)sent;  // UpdateEpoll waits for writability if needed
          return Status::OK();
        }
      }
      in.paused = false;
      if (IsMutation(req.opcode) && in.tx.HasRegionRanges() && MayChangePendingReads(in, req)) {
        // A pending READ response still points at registered memory that
        // this op may change: send it first. (A WRITE elsewhere -- a push
        // slot behind the READs of a pipelined PushPull -- goes on.)
        RDMAPS_ASSIGN_OR_RETURN(bool sent, in.tx.Flush(in.fd.get()));
        if (!sent) return Status::OK();
      }
      in.rx_begin += sizeof(req);
      RDMAPS_RETURN_IF_ERROR(Execute(in, req));
    }
    if (in.phase == Inbound::Phase::kDraining) continue;
    // While the next WRITE's payload is being read, up to kMaxHeldAcks
    // acknowledgements wait for it (sent above once the socket is empty or
    // the round limit reached): pipelined push slots get their acks a few
    // per send, not a TCP segment (and a wake-up of the initiator) each.
    const bool hold = in.in_payload && !last && !in.tx.HasRegionRanges() &&
                      in.tx.owned_bytes() < kMaxHeldAcks * sizeof(ResponseWire);
    if (hold && !in.tx.empty()) acks_held_.fetch_add(1, std::memory_order_relaxed);
    if (!hold) {
      RDMAPS_ASSIGN_OR_RETURN(bool sent, in.tx.Flush(in.fd.get()));
      if (!sent) return Status::OK();  // Back-pressure: wait until the peer reads.
      // Their acknowledgements are out: the WRITE_WITH_IMMs of a long train
      // reach the notification waiter now, a few at a time, not at the end
      // of the round (the apply of a pipelined push follows its transfer,
      // instead of starting on the last 16 slots after it).
      if (in.in_payload) DeliverNotifications();
    }
    if (in.in_payload) continue;
    // epoll is level-triggered: a recv now would most likely say EAGAIN.
    if (drained) return Status::OK();
    // Need more bytes for the next header (what rx holds is not a whole
    // request, so epoll calls again when they arrive).
    if (last) return Status::OK();
    if (in.rx_begin == in.rx_end) {
      in.rx_begin = in.rx_end = 0;
    } else if (in.rx_begin > kRxBufferBytes / 2) {
      std::memmove(in.rx.get(), in.rx.get() + in.rx_begin, in.rx_end - in.rx_begin);
      in.rx_end -= in.rx_begin;
      in.rx_begin = 0;
    }
    // Right after a payload read in place, read only the next headers'
    // worth: a next large payload then goes in place too.
    const std::size_t room = kRxBufferBytes - in.rx_end;
    const std::size_t want = in.after_direct ? std::min(room, kDirectLookahead) : room;
    in.after_direct = false;
    ssize_t r = ::recv(in.fd.get(), in.rx.get() + in.rx_end, want, 0);
    if (r == 0) {
      if (in.rx_begin != in.rx_end) {
        return InvalidArgumentError("peer closed the connection after a truncated request");
      }
      return CancelledError("peer closed the connection");
    }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Status::OK();
      return UnavailableError(std::string("recv failed: ") + std::strerror(errno));
    }
    drained = static_cast<std::size_t>(r) < want;
    in.rx_end += static_cast<std::size_t>(r);
    in.last_progress = SteadyClock::now();
  }
  return Status::OK();
}

// ---------------------------------------------------------------------------
// Initiator: TcpConnection (the caller's thread).

TcpConnection::TcpConnection(Fd fd, PeerInfo peer, std::shared_ptr<Inbound> served,
                             const EndpointOptions& options, const RegionTable* table)
    : max_outstanding_(options.max_outstanding),
      op_timeout_(options.op_timeout),
      busy_poll_(options.busy_poll),
      table_(table),
      peer_(std::move(peer)),
      served_(std::move(served)),
      fd_(std::move(fd)),
      rx_(new std::byte[kRxBufferBytes]) {}

TcpConnection::~TcpConnection() { Close(); }

std::string TcpConnection::Describe() const {
  return "peer " + std::to_string(peer_.peer_id) + " (" + peer_.address + ")";
}

Status TcpConnection::Validate(const Op& op) const {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(std::string(OpTypeName(op.type)) + " to " + Describe() + ": " +
                                why);
  };
  if (static_cast<std::uint8_t>(op.type) > static_cast<std::uint8_t>(OpType::kCompareSwap)) {
    return bad("unknown op type");
  }
  if (op.length > kMaxOpBytes) {
    return bad("length " + std::to_string(op.length) + " exceeds the tcp limit of " +
               std::to_string(kMaxOpBytes) + " bytes; split the op");
  }
  if (IsAtomic(op.type)) {
    if (op.length != 8) return bad("atomics move exactly 8 bytes");
    if (op.remote_addr % 8 != 0) return bad("remote address is not 8-byte aligned");
  }
  if (op.num_segments > 0) {
    Status s = ValidateSegments(op, kMaxSegments,
                                [this](const void* a, const MemoryRegion* m, std::uint64_t n) {
                                  return ValidateLocal(a, m, n);
                                });
    return s.ok() ? s : bad(s.message());
  }
  if (op.length > 0 || IsAtomic(op.type)) {
    Status s = ValidateLocal(op.local, op.local_mr, op.length);
    if (!s.ok()) return bad(s.message());
  }
  return Status::OK();
}

Status TcpConnection::ValidateLocal(const void* addr, const MemoryRegion* local_mr,
                                    std::uint64_t length) const {
  if (local_mr == nullptr) return InvalidArgumentError("local_mr is null");
  auto* mr = dynamic_cast<const TcpMemoryRegion*>(local_mr);
  if (mr == nullptr || mr->table() != table_) {
    return InvalidArgumentError("local_mr was not registered on this endpoint");
  }
  if (addr == nullptr || !mr->Contains(addr, length)) {
    return InvalidArgumentError("local buffer lies outside local_mr");
  }
  return Status::OK();
}

Status TcpConnection::Post(std::span<const Op> ops) {
  if (closed_) return UnavailableError("Post on a closed connection to " + Describe());
  if (!health_.ok()) {
    return UnavailableError("connection to " + Describe() + " is in error (" + health_.ToString() +
                            "); open a new connection");
  }
  for (const Op& op : ops) RDMAPS_RETURN_IF_ERROR(Validate(op));
  if (outstanding() + ops.size() > max_outstanding_) {
    return ResourceExhaustedError("Post of " + std::to_string(ops.size()) + " ops would exceed " +
                                  std::to_string(max_outstanding_) +
                                  " outstanding ops; poll completions first");
  }
  const auto now = SteadyClock::now();
  for (const Op& op : ops) {
    RequestWire req{};
    req.magic = kRequestMagic;
    req.opcode = static_cast<std::uint8_t>(ToWire(op.type));
    req.flags = (op.flags & kFence) ? kWireFence : 0;
    req.imm.set(op.imm);
    req.remote_addr.set(op.remote_addr);
    req.rkey.set(op.rkey);
    req.length.set(static_cast<std::uint32_t>(op.length));
    req.compare_add.set(op.compare_add);
    req.swap.set(op.swap);
    std::memcpy(tx_.AppendOwned(sizeof(req)), &req, sizeof(req));
    if (op.type == OpType::kRead) {
      pending_.push_back(Pending{op.context, op.type, static_cast<std::byte*>(op.local),
                                 static_cast<std::uint32_t>(op.length), now, op.num_segments});
      pending_bytes_ += op.length;
      segments_.insert(segments_.end(), op.segments, op.segments + op.num_segments);
      continue;
    }
    if (op.type == OpType::kWrite || op.type == OpType::kWriteWithImm) {
      if (op.num_segments == 0) tx_.AppendExternal(op.local, op.length, 0);
      for (std::uint32_t k = 0; k < op.num_segments; ++k) {
        tx_.AppendExternal(op.segments[k].addr, op.segments[k].length, 0);
      }
    }
    pending_.push_back(Pending{op.context, op.type, static_cast<std::byte*>(op.local),
                               static_cast<std::uint32_t>(op.length), now, 0});
    pending_bytes_ += op.length;
  }
  auto sent = tx_.Flush(fd_.get());
  if (!sent.ok()) {
    Fail(UnavailableError("lost the connection to " + Describe() + ": " + sent.status().message()),
         StatusCode::kUnavailable, "lost the connection to " + Describe());
  }
  return Status::OK();
}

void TcpConnection::CompleteHead(Status status) {
  const Pending p = pending_.front();
  pending_.pop_front();
  pending_bytes_ -= p.length;
  segments_.erase(segments_.begin(), segments_.begin() + p.num_segments);
  ready_.push_back(Completion{p.context, p.type, std::move(status)});
}

void TcpConnection::Fail(Status first, StatusCode rest_code, const std::string& rest_message) {
  if (health_.ok()) health_ = first;
  if (!pending_.empty()) CompleteHead(std::move(first));
  while (!pending_.empty()) CompleteHead(Status(rest_code, rest_message));
  fd_.Reset();
  tx_ = TxQueue();
  have_header_ = false;
}

void TcpConnection::ReadResponses() {
  bool drained = false;  // The last recv left the socket empty: let the caller come back.
  for (;;) {
    // Parse what rx_ holds.
    while (!pending_.empty()) {
      if (!have_header_) {
        if (rx_end_ - rx_begin_ < sizeof(ResponseWire)) break;
        std::memcpy(&header_, rx_.get() + rx_begin_, sizeof(header_));
        rx_begin_ += sizeof(header_);
        const Pending& p = pending_.front();
        const char* bad = CheckResponse(header_, {static_cast<std::uint8_t>(ToWire(p.type)),
                                                  static_cast<std::uint32_t>(p.length)});
        const std::string malformed = bad ? bad : "";
        if (!malformed.empty()) {
          RDMAPS_LOG(WARNING) << "tcp transport: malformed response from " << Describe() << ": "
                              << malformed << "; closing the connection";
          Fail(UnavailableError("malformed response from " + Describe() + " (" + malformed +
                                "); the connection is closed"),
               StatusCode::kCancelled, "flushed: the connection to " + Describe() + " failed");
          return;
        }
        have_header_ = true;
        payload_done_ = 0;
        seg_index_ = seg_offset_ = 0;
        error_payload_.clear();
      }
      const Pending& p = pending_.front();
      const std::uint32_t len = header_.length.get();
      std::size_t avail = std::min<std::size_t>(rx_end_ - rx_begin_, len - payload_done_);
      if (header_.status == 0) {
        if (p.type == OpType::kRead) {
          TakePayload(p, rx_.get() + rx_begin_, avail);
        } else {
          payload_done_ += static_cast<std::uint32_t>(avail);
        }
      } else {
        error_payload_.append(reinterpret_cast<const char*>(rx_.get() + rx_begin_), avail);
        payload_done_ += static_cast<std::uint32_t>(avail);
      }
      rx_begin_ += avail;
      if (payload_done_ < len) {
        // Large READ: the rest goes straight into the caller's buffer, unless
        // it is scattered into small segments (a readv into many small
        // iovecs costs more than receiving into rx_ and copying).
        if (header_.status == 0 && p.type == OpType::kRead && rx_begin_ == rx_end_ &&
            (p.num_segments == 0 || p.length / p.num_segments >= kDirectSegmentBytes)) {
          if (ReadPayloadDirect(p, len)) continue;
          return;
        }
        break;
      }
      have_header_ = false;
      if (header_.status == 0) {
        std::uint64_t value = header_.value.get();
        if (IsAtomic(p.type)) RacyCopyTo(p.local, &value, sizeof(value));
        CompleteHead(Status::OK());
      } else {
        Status s(
            static_cast<StatusCode>(header_.status),
            std::string(OpTypeName(p.type)) + " refused by " + Describe() + ": " + error_payload_);
        Fail(std::move(s), StatusCode::kCancelled,
             "flushed: an earlier op on the connection to " + Describe() + " failed");
        return;
      }
    }
    if (pending_.empty() || !fd_.valid() || drained) return;
    if (rx_begin_ == rx_end_) {
      rx_begin_ = rx_end_ = 0;
    } else if (rx_begin_ > kRxBufferBytes / 2) {
      std::memmove(rx_.get(), rx_.get() + rx_begin_, rx_end_ - rx_begin_);
      rx_end_ -= rx_begin_;
      rx_begin_ = 0;
    }
    // Right after a payload read in place, only the next headers' worth
    // (as the served side does).
    const std::size_t room = kRxBufferBytes - rx_end_;
    const std::size_t want = after_direct_ ? std::min(room, kDirectLookahead) : room;
    after_direct_ = false;
    ssize_t r = ::recv(fd_.get(), rx_.get() + rx_end_, want, MSG_DONTWAIT);
    if (r > 0) {
      drained = static_cast<std::size_t>(r) < want;
      rx_end_ += static_cast<std::size_t>(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    std::string why = r == 0 ? "closed the connection" : std::string(std::strerror(errno));
    Fail(UnavailableError(Describe() + " vanished (" + why + ")"), StatusCode::kUnavailable,
         Describe() + " vanished (" + why + ")");
    return;
  }
}

void TcpConnection::TakePayload(const Pending& p, const std::byte* src, std::size_t n) {
  if (p.num_segments == 0) {
    if (src != nullptr) RacyCopyTo(p.local + payload_done_, src, n);
    payload_done_ += static_cast<std::uint32_t>(n);
    return;
  }
  payload_done_ += static_cast<std::uint32_t>(n);
  while (n > 0) {
    const Segment& seg = segments_[seg_index_];
    const std::size_t take = std::min<std::size_t>(n, seg.length - seg_offset_);
    if (src != nullptr) {
      RacyCopyTo(static_cast<std::byte*>(seg.addr) + seg_offset_, src, take);
      src += take;
    }
    n -= take;
    seg_offset_ += take;
    if (seg_offset_ == seg.length) {
      ++seg_index_;
      seg_offset_ = 0;
    }
  }
}

bool TcpConnection::ReadPayloadDirect(const Pending& p, std::uint32_t len) {
  rx_begin_ = rx_end_ = 0;
  // The rest of the payload (its first kIov - 1 pieces), then rx_ for the
  // start of what follows it (kDirectLookahead: a next large payload goes
  // straight into place too).
  constexpr std::size_t kIov = 1024;  // IOV_MAX on Linux; later segments go through rx_
  iov_.resize(kIov);
  std::size_t n = 0, local_bytes = 0;
  if (p.num_segments == 0) {
    iov_[n++] = {p.local + payload_done_, len - payload_done_};
    local_bytes = len - payload_done_;
  } else {
    std::size_t off = seg_offset_;
    for (std::size_t i = seg_index_; i < p.num_segments && n + 1 < kIov; ++i, off = 0) {
      const Segment& seg = segments_[i];
      if (seg.length == off) continue;
      iov_[n++] = {static_cast<std::byte*>(seg.addr) + off, seg.length - off};
      local_bytes += seg.length - off;
    }
  }
  iov_[n++] = {rx_.get(), kDirectLookahead};
  ssize_t r = RacyReadv(fd_.get(), iov_.data(), static_cast<int>(n));
  if (r > 0) {
    after_direct_ = true;
    const auto got = static_cast<std::size_t>(r);
    const std::size_t into_local = std::min(got, local_bytes);
    TakePayload(p, nullptr, into_local);  // readv put them in place
    rx_end_ = got - into_local;
    return true;
  }
  if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    Fail(UnavailableError(Describe() + " vanished (the connection closed mid-response)"),
         StatusCode::kUnavailable, Describe() + " vanished");
  }
  return false;
}

void TcpConnection::Progress() {
  if (!fd_.valid() || pending_.empty()) return;
  if (!tx_.empty()) {
    auto sent = tx_.Flush(fd_.get());
    if (!sent.ok()) {
      Fail(
          UnavailableError("lost the connection to " + Describe() + ": " + sent.status().message()),
          StatusCode::kUnavailable, "lost the connection to " + Describe());
      return;
    }
  }
  ReadResponses();
  if (!pending_.empty() && fd_.valid() &&
      SteadyClock::now() - pending_.front().posted >= op_timeout_) {
    Fail(TimedOutError(std::string(OpTypeName(pending_.front().type)) + " to " + Describe() +
                       " got no answer within op_timeout (" + std::to_string(op_timeout_.count()) +
                       " ms); the peer is overloaded or gone"),
         StatusCode::kCancelled, "flushed: an earlier op to " + Describe() + " timed out");
  }
}

std::size_t TcpConnection::Drain(std::span<Completion> out) {
  std::size_t n = 0;
  while (n < out.size() && !ready_.empty()) {
    out[n++] = std::move(ready_.front());
    ready_.pop_front();
  }
  return n;
}

std::size_t TcpConnection::Poll(std::span<Completion> out) {
  if (ready_.size() < out.size()) Progress();
  return Drain(out);
}

Result<std::size_t> TcpConnection::Wait(std::span<Completion> out, Deadline deadline) {
  if (outstanding() == 0) {
    return FailedPreconditionError("Wait on a connection with nothing outstanding");
  }
  if (out.empty()) return InvalidArgumentError("Wait needs room for at least one completion");
  const auto spin_until =
      SteadyClock::now() +
      (pending_bytes_ <= kSpinMaxPendingBytes ? busy_poll_ : std::chrono::microseconds(0));
  for (;;) {
    if (ready_.empty()) Progress();
    if (!ready_.empty()) return Drain(out);
    const auto now = SteadyClock::now();
    if (now >= deadline) return std::size_t{0};
    if (now < spin_until) continue;
    // Sleep in the kernel until the socket moves, the deadline, or the
    // oldest op's timeout.
    Deadline until = std::min(deadline, pending_.front().posted + op_timeout_);
    pollfd p{fd_.get(), static_cast<short>(POLLIN | (tx_.empty() ? 0 : POLLOUT)), 0};
    int rc = ::poll(&p, 1, PollTimeoutMs(until));
    if (rc < 0 && errno != EINTR) {
      Fail(ErrnoError("poll", errno), StatusCode::kCancelled, "flushed after a poll failure");
    }
  }
}

void TcpConnection::Close() {
  if (closed_) return;
  closed_ = true;
  if (!pending_.empty()) {
    Fail(CancelledError("connection to " + Describe() + " closed"), StatusCode::kCancelled,
         "connection to " + Describe() + " closed");
  }
  if (health_.ok()) health_ = CancelledError("connection to " + Describe() + " was closed");
  fd_.Reset();
  if (served_) served_->Shutdown();
}

}  // namespace rdmaps::transport::tcp

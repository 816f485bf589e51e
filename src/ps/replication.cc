#include "src/ps/replication.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "src/base/log.h"

namespace rdmaps::internal {

using transport::Deadline;
using transport::DeadlineAfter;
using transport::Op;
using SteadyClock = std::chrono::steady_clock;

namespace {

WireRegion Wire(const transport::MemoryRegion& mr) {
  return {reinterpret_cast<std::uint64_t>(mr.data()), mr.size(), mr.rkey(), 0};
}

}  // namespace

// Posts `ops` on `conn` and waits for all their completions.
Status PostAndWait(transport::Connection& conn, std::span<const Op> ops, Deadline deadline) {
  RDMAPS_RETURN_IF_ERROR(conn.Post(ops));
  transport::Completion c[4];
  std::size_t got = 0;
  Status first;
  while (got < ops.size()) {
    auto r = conn.Wait({c, std::min<std::size_t>(ops.size() - got, 4)}, deadline);
    if (!r.ok()) return r.status();
    if (*r == 0) return TimedOutError("no completion by the deadline");
    for (std::size_t i = 0; i < *r; ++i) {
      if (!c[i].status.ok() && first.ok()) first = c[i].status;
    }
    got += *r;
  }
  return first;
}

std::size_t UsedSlotBytes(const SlotHeader& h, std::uint32_t dim, std::uint32_t slot_bytes) {
  std::uint64_t per_row = 0;
  if (h.kind == static_cast<std::uint32_t>(SlotKind::kRange)) per_row = RowBytes(dim);
  if (h.kind == static_cast<std::uint32_t>(SlotKind::kRows)) per_row = RowBytes(dim) + 8;
  // num_rows < 2^32, per_row < 2^27: the product fits 64 bits.
  const std::uint64_t used = sizeof(SlotHeader) + std::uint64_t{h.num_rows} * per_row;
  return static_cast<std::size_t>(std::min<std::uint64_t>(used, slot_bytes));
}

// ---- primary -------------------------------------------------------------------

Status LogSender::AllocateStaging() {
  if (staging_) return Status::OK();
  staging_ = AllocateRegionMemory(kMaxBatch * kLogRecordBytes + sizeof(LogControl));
  if (!staging_) return ResourceExhaustedError("allocating the log staging failed");
  RDMAPS_ASSIGN_OR_RETURN(
      staging_mr_,
      endpoint_->Register(staging_.get(), kMaxBatch * kLogRecordBytes + sizeof(LogControl),
                          transport::kAccessNone));
  return Status::OK();
}

Status LogSender::Connect(const std::string& backup_address, Deadline deadline) {
  boot_ = AllocateRegionMemory(sizeof(LogBootstrap));
  if (!boot_) return ResourceExhaustedError("allocating the log staging failed");
  RDMAPS_ASSIGN_OR_RETURN(
      boot_mr_, endpoint_->Register(boot_.get(), sizeof(LogBootstrap), transport::kRemoteWrite));
  RDMAPS_RETURN_IF_ERROR(AllocateStaging());
  ReplHello hello{kReplHelloMagic, static_cast<std::uint32_t>(epoch_.load()),
                  reinterpret_cast<std::uint64_t>(boot_.get()), boot_mr_->rkey(), shard_};
  transport::ConnectOptions copts;
  copts.user_data.resize(sizeof(hello));
  std::memcpy(copts.user_data.data(), &hello, sizeof(hello));
  while (true) {
    auto r = endpoint_->Connect(backup_address, copts, deadline);
    if (r.ok()) {
      conn_ = std::move(r).value();
      conn_->set_busy_poll(busy_poll_);
      break;
    }
    if (r.status().code() != StatusCode::kUnavailable || SteadyClock::now() >= deadline) {
      return r.status().WithContext("ps server " + std::to_string(shard_) +
                                    " connecting to its backup at " + backup_address +
                                    " (start the backup first; is the address right?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<transport::Notification> notes(8);
  while (true) {
    auto r = endpoint_->WaitNotifications(notes, deadline);
    if (!r.ok()) return r.status().WithContext("waiting for the backup's log bootstrap");
    if (*r == 0) {
      return TimedOutError("ps server " + std::to_string(shard_) + ": the backup at " +
                           backup_address +
                           " accepted the connection but sent no log bootstrap; is it a backup "
                           "of this shard (ReplicaRole::kBackup, the same server_index)?");
    }
    bool got = false;
    for (std::size_t i = 0; i < *r; ++i) {
      got |=
          notes[i].kind == transport::Notification::Kind::kImmediate && notes[i].imm == kLogBootImm;
    }
    if (got) break;
  }
  std::memcpy(&backup_, boot_.get(), sizeof(backup_));
  return CheckLogBootstrap(backup_, shard_, push_slot_bytes_, backup_address);
}

Status CheckLogBootstrap(const LogBootstrap& b, std::uint32_t shard, std::uint32_t push_slot_bytes,
                         const std::string& backup_address) {
  // The backup's words: checked before they address anything.
  if (b.magic != kLogBootMagic || b.shard != shard || b.slots == 0 ||
      b.record_bytes != kLogRecordBytes + push_slot_bytes ||
      b.ring.length / b.record_bytes < b.slots || b.control.length < sizeof(LogControl)) {
    return FailedPreconditionError("ps server " + std::to_string(shard) + ": the backup at " +
                                   backup_address +
                                   " describes a log ring that does not fit this server (another "
                                   "shard, or other push_slot_bytes?)");
  }
  return Status::OK();
}

Status LogSender::Register(const std::string& self, const std::string& backup_address) {
  self_ = self;
  RDMAPS_ASSIGN_OR_RETURN(ShardAssignment a, decider_->Register(shard_, self, backup_address));
  if (a.epoch != epoch_.load()) {
    return FailedPreconditionError("shard " + std::to_string(shard_) + " is at epoch " +
                                   std::to_string(a.epoch) + "; this primary expected " +
                                   std::to_string(epoch_.load()));
  }
  return Status::OK();
}

Status LogSender::Drain(std::uint64_t held, bool read, Deadline deadline) {
  transport::Completion c[16];
  while (held_ < held || (read && read_pending_)) {
    auto r = conn_->Wait(c, deadline);
    if (!r.ok()) return r.status();
    if (*r == 0) return TimedOutError("no log write completion by the deadline");
    for (std::size_t i = 0; i < *r; ++i) {
      --outstanding_;
      if (!c[i].status.ok()) return c[i].status;
      if (c[i].context == kReadContext) {
        read_pending_ = false;
      } else if (c[i].context != 0) {
        // In posting order: every record up to this one is in the ring.
        held_ = std::max(held_, c[i].context);
      }
    }
  }
  return Status::OK();
}

Status LogSender::Flush(std::vector<Op>* ops) {
  if (ops->empty()) return Status::OK();
  RDMAPS_RETURN_IF_ERROR(conn_->Post(*ops));
  outstanding_ += ops->size();
  ops->clear();
  return Status::OK();
}

Status LogSender::WaitCredit(std::uint64_t need, std::vector<Op>* ops, Deadline deadline) {
  while (next_index_ + need - 1 - acked_index_ > backup_.slots) {
    RDMAPS_RETURN_IF_ERROR(Flush(ops));
    // Room for the READ among the ops in flight.
    if (outstanding_ + 1 > max_outstanding_) {
      RDMAPS_RETURN_IF_ERROR(Drain(held_ + 1, false, deadline));
    }
    std::byte* ctl = staging_.get() + kMaxBatch * kLogRecordBytes;
    ops->push_back(Op::Read(ctl, staging_mr_.get(), sizeof(LogControl), backup_.control.addr,
                            backup_.control.rkey, kReadContext));
    read_pending_ = true;
    credit_reads_.fetch_add(1, std::memory_order_relaxed);
    RDMAPS_RETURN_IF_ERROR(Flush(ops));
    RDMAPS_RETURN_IF_ERROR(Drain(0, true, deadline));
    LogControl c;
    std::memcpy(&c, ctl, sizeof(c));
    acked_index_ = std::max(acked_index_, std::min(c.applied_index, next_index_ - 1));
    if (next_index_ + need - 1 - acked_index_ <= backup_.slots) break;
    if (SteadyClock::now() >= deadline) return TimedOutError("the backup applies no log record");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return Status::OK();
}

Status LogSender::Forward(std::uint32_t w, const std::byte* slot, std::size_t bytes,
                          const transport::MemoryRegion* slot_mr) {
  const Item item{w, slot, bytes, slot_mr};
  return ForwardBatch({&item, 1});
}

Status LogSender::ForwardBatch(std::span<const Item> items) {
  RDMAPS_RETURN_IF_ERROR(Post(items));
  return WaitHeld(posted());
}

Status LogSender::Post(std::span<const Item> items) {
  if (fenced_.load()) return FailedPreconditionError("this primary is fenced");
  if (alone_ || items.empty()) return Status::OK();
  if (killed_.load()) return Lost(UnavailableError("killed"));
  const Deadline deadline = DeadlineAfter(op_timeout_);
  const std::size_t ops_per = conn_->max_segments() >= 2 ? 1 : 2;
  max_outstanding_ = std::max<std::size_t>(ops_per + 1, conn_->max_outstanding());
  std::vector<Op>& ops = ops_;
  ops.clear();
  for (const Item& it : items) {
    const std::uint64_t index = next_index_;
    // A free record in the backup's ring, a free staging header (the one
    // of index - kMaxBatch is in flight until its WRITE completed), room
    // among the ops in flight.
    Status st = WaitCredit(1, &ops, deadline);
    if (st.ok() && (index - 1 - held_ >= kMaxBatch ||
                    outstanding_ + ops.size() + ops_per > max_outstanding_ - 1)) {
      st = Flush(&ops);
      if (st.ok()) {
        st = Drain(std::max<std::uint64_t>(held_ + 1, index > kMaxBatch ? index - kMaxBatch : 0),
                   false, deadline);
      }
    }
    if (!st.ok()) return Lost(st);
    LogRecord rec{};
    rec.magic = kLogMagic;
    rec.worker = it.worker;
    rec.epoch = epoch_.load();
    rec.index = index;
    rec.bytes = static_cast<std::uint32_t>(it.bytes);
    const std::size_t k = (index - 1) % kMaxBatch;
    std::byte* hdr = staging_.get() + k * kLogRecordBytes;
    std::memcpy(hdr, &rec, sizeof(rec));
    const std::uint64_t at =
        backup_.ring.addr + (index - 1) % backup_.slots * std::uint64_t{backup_.record_bytes};
    const std::uint32_t imm = static_cast<std::uint32_t>(index);
    if (ops_per == 1) {
      gather_[2 * k] = {hdr, staging_mr_.get(), kLogRecordBytes};
      gather_[2 * k + 1] = {const_cast<std::byte*>(it.slot), it.mr,
                            static_cast<std::uint32_t>(it.bytes)};
      ops.push_back(Op::WriteWithImmGather({&gather_[2 * k], 2}, at, backup_.ring.rkey, imm));
    } else {
      ops.push_back(Op::Write(it.slot, it.mr, it.bytes, at + kLogRecordBytes, backup_.ring.rkey));
      ops.push_back(
          Op::WriteWithImm(hdr, staging_mr_.get(), kLogRecordBytes, at, backup_.ring.rkey, imm));
    }
    ops.back().context = index;
    writes_.fetch_add(1, std::memory_order_relaxed);
    ++next_index_;
  }
  if (Status st = Flush(&ops); !st.ok()) return Lost(st);
  return Status::OK();
}

Status LogSender::WaitHeld(std::uint64_t index) {
  if (fenced_.load()) return FailedPreconditionError("this primary is fenced");
  if (alone_ || held_ >= index) return Status::OK();
  if (killed_.load()) return Lost(UnavailableError("killed"));
  Status st = Drain(std::min(index, posted()), false, DeadlineAfter(op_timeout_));
  if (!st.ok()) return Lost(st);
  return Status::OK();
}

void LogSender::OnBackupDisconnected() {
  if (!alone_ && !fenced_.load()) (void)Lost(UnavailableError("the backup's connection dropped"));
}

Status LogSender::Lost(const Status& why) {
  if (killed_.load()) {
    fenced_.store(true);
    return UnavailableError("this primary was killed (test)");
  }
  if (candidate_) {
    // Not in the shard map yet: only the replacement is lost.
    DropCandidate(why);
    return Status::OK();
  }
  auto a = decider_->ReportBackupLost(shard_, epoch_.load(), self_);
  if (a.ok() && a->primary == self_ && a->epoch > epoch_.load() && a->backup.empty()) {
    RDMAPS_LOG(WARNING) << "ps server " << shard_ << ": lost its backup (" << why
                        << "); goes on alone at epoch " << a->epoch
                        << ": the shard now has one copy until a replacement backup catches up "
                           "(ServerOptions::rejoin_as_backup_of)";
    epoch_.store(a->epoch);
    alone_ = true;
    if (conn_) conn_->Close();
    return Status::OK();
  }
  fenced_.store(true);
  if (conn_) conn_->Close();
  const std::string now = a.ok() ? "primary " + a->primary + " at epoch " + std::to_string(a->epoch)
                                 : "unknown: " + a.status().ToString();
  RDMAPS_LOG(ERROR) << "ps server " << shard_ << " (" << self_ << ") is fenced: its log write to "
                    << "the backup failed (" << why << ") and the shard map says " << now
                    << "; it acknowledges nothing more";
  return FailedPreconditionError("ps server " + std::to_string(shard_) + " is fenced");
}

void LogSender::Kill() { killed_.store(true); }

bool LogSender::Owns(const transport::Notification& n) const {
  if (!conn_ || alone_) return false;
  const std::uint64_t id = conn_->peer().connection;
  return id == 0 || id == n.connection;
}

void LogSender::SetAlone(const std::string& self, std::uint64_t epoch) {
  self_ = self;
  epoch_.store(epoch);
  alone_ = true;
}

Status LogSender::AttachCandidate(std::unique_ptr<transport::Connection>& conn,
                                  const LogBootstrap& ring, const std::string& address) {
  if (!alone_ || candidate_ || fenced_.load() || killed_.load()) {
    return FailedPreconditionError("ps server " + std::to_string(shard_) +
                                   " is not serving alone; it takes no replacement backup");
  }
  RDMAPS_RETURN_IF_ERROR(CheckLogBootstrap(ring, shard_, push_slot_bytes_, address));
  RDMAPS_RETURN_IF_ERROR(AllocateStaging());
  if (conn_) conn_->Close();
  conn_ = std::move(conn);
  conn_->set_busy_poll(busy_poll_);
  backup_ = ring;
  acked_index_ = next_index_ - 1;
  // A fresh connection: nothing of it is in flight (records posted while
  // alone went nowhere, and the old backup's completions died with it).
  held_ = next_index_ - 1;
  outstanding_ = 0;
  read_pending_ = false;
  candidate_address_ = address;
  candidate_ = true;
  alone_ = false;
  return Status::OK();
}

Status LogSender::SendToCandidate(std::span<const Op> ops) {
  if (!candidate_) return FailedPreconditionError("no replacement backup is catching up");
  // Only right after AttachCandidate (the answer): no record is in flight on
  // the connection yet, so these are the only completions to wait for.
  if (outstanding_ != 0) return InternalError("SendToCandidate with log records in flight");
  return PostAndWait(*conn_, ops, DeadlineAfter(op_timeout_));
}

Status LogSender::CandidateSynced() {
  if (!candidate_) return FailedPreconditionError("no replacement backup is catching up");
  auto a = decider_->AddBackup(shard_, epoch_.load(), self_, candidate_address_);
  if (!a.ok() || a->primary != self_ || a->backup != candidate_address_ ||
      a->epoch != epoch_.load() + 1) {
    const Status why =
        a.ok() ? FailedPreconditionError("the shard map moved on: primary " + a->primary +
                                         " at epoch " + std::to_string(a->epoch))
               : a.status();
    DropCandidate(why);
    return why;
  }
  epoch_.store(a->epoch);
  candidate_ = false;
  RDMAPS_LOG(WARNING) << "ps server " << shard_ << " (" << self_ << "): re-protected at epoch "
                      << a->epoch << ": " << candidate_address_
                      << " is its backup again (copied and caught up after " << next_index_ - 1
                      << " log records)";
  return Status::OK();
}

void LogSender::DropCandidate(const Status& why) {
  RDMAPS_LOG(WARNING) << "ps server " << shard_ << ": the replacement backup " << candidate_address_
                      << " was lost before it caught up (" << why
                      << "); the shard still has one copy (start another replacement)";
  candidate_ = false;
  alone_ = true;
  if (conn_) conn_->Close();
}

// ---- backup ----------------------------------------------------------------------

Status LogReceiver::Register(std::size_t* registered) {
  const std::size_t ring_bytes = std::size_t{slots_} * record_bytes_;
  ring_ = AllocateRegionMemory(ring_bytes);
  control_ = AllocateRegionMemory(sizeof(LogControl));
  boot_msg_ = AllocateRegionMemory(sizeof(LogBootstrap));
  if (!ring_ || !control_ || !boot_msg_) {
    return ResourceExhaustedError("allocating " + std::to_string(ring_bytes) +
                                  " bytes for the backup's log ring failed: out of memory");
  }
  {
    MutexLock lock(mu_);
    RDMAPS_ASSIGN_OR_RETURN(ring_mr_,
                            endpoint_->Register(ring_.get(), ring_bytes, transport::kRemoteWrite));
    RDMAPS_ASSIGN_OR_RETURN(control_mr_, endpoint_->Register(control_.get(), sizeof(LogControl),
                                                             transport::kRemoteRead));
    RDMAPS_ASSIGN_OR_RETURN(boot_msg_mr_, endpoint_->Register(boot_msg_.get(), sizeof(LogBootstrap),
                                                              transport::kAccessNone));
    LogBootstrap b{};
    b.magic = kLogBootMagic;
    b.shard = shard_;
    b.ring = Wire(*ring_mr_);
    b.control = Wire(*control_mr_);
    b.slots = slots_;
    b.record_bytes = static_cast<std::uint32_t>(record_bytes_);
    std::memcpy(boot_msg_.get(), &b, sizeof(b));
  }
  *registered += ring_bytes + sizeof(LogControl) + sizeof(LogBootstrap);
  return Status::OK();
}

bool LogReceiver::MaybeAccept(std::unique_ptr<transport::Connection>& conn) {
  const transport::PeerInfo& peer = conn->peer();
  ReplHello hello{};
  if (peer.user_data.size() != sizeof(hello)) return false;
  std::memcpy(&hello, peer.user_data.data(), sizeof(hello));
  if (hello.magic != kReplHelloMagic) return false;
  MutexLock lock(mu_);
  if (hello.shard != shard_ || fenced_ || primary_ != nullptr ||
      peer.peer_id != kServerPeerBase + shard_) {
    RDMAPS_LOG(WARNING) << "backup of shard " << shard_ << ": refusing a primary from "
                        << peer.address << " (shard " << hello.shard
                        << (fenced_    ? "; this backup was promoted and fenced the old primary"
                            : primary_ ? "; a primary is bound already"
                                       : "")
                        << ")";
    conn->Close();
    conn.reset();
    return true;
  }
  epoch_.store(hello.epoch);
  bound_.store(peer.connection);
  const Op op = Op::WriteWithImm(boot_msg_.get(), boot_msg_mr_.get(), sizeof(LogBootstrap),
                                 hello.boot_addr, hello.boot_rkey, kLogBootImm);
  Status s = PostAndWait(*conn, {&op, 1}, DeadlineAfter(std::chrono::seconds(10)));
  if (!s.ok()) {
    RDMAPS_LOG(WARNING) << "backup of shard " << shard_ << ": log bootstrap failed: " << s;
    bound_.store(0);
    conn->Close();
    conn.reset();
    return true;
  }
  RDMAPS_LOG(VERBOSE) << "backup of shard " << shard_ << ": primary connected from " << peer.address
                      << " at epoch " << hello.epoch;
  primary_ = std::move(conn);
  return true;
}

bool LogReceiver::Owns(const transport::Notification& n) const {
  return n.peer_id == primary_peer_.load() && n.connection != 0 && n.connection == bound_.load();
}

void LogReceiver::AttachPrimary(std::unique_ptr<transport::Connection> conn) {
  MutexLock lock(mu_);
  primary_peer_.store(conn->peer().peer_id);
  bound_.store(conn->peer().connection);
  primary_ = std::move(conn);
}

void LogReceiver::StartAt(std::uint64_t epoch, std::uint64_t index) {
  epoch_.store(epoch);
  applied_index_ = index;
  const LogControl c{applied_index_, 0};
  std::memcpy(control_.get(), &c, sizeof(c));
}

Status LogReceiver::SendToPrimary(std::span<const Op> ops, Deadline deadline) {
  MutexLock lock(mu_);
  if (!primary_) return UnavailableError("no primary connection");
  return PostAndWait(*primary_, ops, deadline);
}

bool LogReceiver::Take(std::uint32_t imm, Logged* out) {
  if (serving_.load()) return false;  // fenced: nothing of the old primary is applied
  const std::uint64_t index = applied_index_ + 1;
  const std::byte* rec_at = ring_.get() + (index - 1) % slots_ * record_bytes_;
  LogRecord rec;
  std::memcpy(&rec, rec_at, sizeof(rec));
  if (imm != static_cast<std::uint32_t>(index) || rec.magic != kLogMagic || rec.index != index ||
      rec.epoch < epoch_.load() || rec.bytes < sizeof(SlotHeader) ||
      rec.bytes > record_bytes_ - kLogRecordBytes) {
    RDMAPS_LOG_EVERY_N(WARNING, 100)
        << "backup of shard " << shard_ << ": dropping log record (expected index " << index
        << ", record says " << rec.index << ", epoch " << rec.epoch << ")";
    return false;
  }
  // The bound primary moved to a newer epoch (it re-protected the shard
  // with this backup): its records carry it from then on.
  if (rec.epoch > epoch_.load()) epoch_.store(rec.epoch);
  out->worker = rec.worker;
  out->bytes = rec.bytes;
  std::memcpy(&out->header, rec_at + kLogRecordBytes, sizeof(SlotHeader));
  out->payload = rec_at + kLogRecordBytes + sizeof(SlotHeader);
  return true;
}

void LogReceiver::Release() {
  ++applied_index_;
  const LogControl c{applied_index_, 0};
  std::memcpy(control_.get(), &c, sizeof(c));
}

bool LogReceiver::WaitServing(Deadline deadline) {
  MutexLock lock(mu_);
  while (deciding_ && !serving_.load()) {
    if (decided_.wait_until(lock.native(), deadline) == std::cv_status::timeout) break;
  }
  return serving_.load();
}

bool LogReceiver::OnPrimaryLost() {
  if (serving_.load()) return false;
  {
    MutexLock lock(mu_);
    deciding_ = true;
  }
  struct Decided {
    LogReceiver* r;
    ~Decided() {
      {
        MutexLock lock(r->mu_);
        r->deciding_ = false;
      }
      r->decided_.notify_all();
    }
  } decided{this};
  // A replacement that became the backup with an epoch its primary had no
  // record to tell it of yet reports the epoch that names it.
  std::uint64_t epoch = epoch_.load();
  if (auto cur = decider_->Current(shard_); cur.ok() && cur->backup == self_) {
    epoch = std::max(epoch, cur->epoch);
  }
  auto a = decider_->ReportPrimaryLost(shard_, epoch, self_);
  if (!a.ok()) {
    RDMAPS_LOG(ERROR) << "backup of shard " << shard_
                      << ": lost its primary and cannot ask the shard map: " << a.status();
    return false;
  }
  if (a->primary != self_) {
    RDMAPS_LOG(WARNING) << "backup of shard " << shard_ << ": lost its primary; the shard map says "
                        << a->primary << " serves at epoch " << a->epoch
                        << " (this backup is out of the shard)";
    MutexLock lock(mu_);
    fenced_ = true;
    if (primary_) primary_->Close();
    return false;
  }
  {
    MutexLock lock(mu_);
    fenced_ = true;
    // Fence the old primary: no connection, and no ring to WRITE into.
    if (primary_) primary_->Close();
    ring_mr_.reset();
  }
  epoch_.store(a->epoch);
  serving_.store(true);
  RDMAPS_LOG(WARNING) << "backup of shard " << shard_ << " (" << self_
                      << ") promoted to primary at epoch " << a->epoch << " after "
                      << applied_index_ << " log records";
  return true;
}

}  // namespace rdmaps::internal

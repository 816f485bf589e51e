// Primary -> backup replication of one shard (docs/ps.md, "Replication and
// failover"). Server to server only: workers never see these formats.
//
// == Log ring ==
// The backup registers a log ring of `slots` records of kLogRecordBytes +
// push_slot_bytes each (remote-write) and a LogControl word pair
// (remote-read). The primary connects to the backup with a ReplHello as
// handshake user data; the backup answers with one WRITE_WITH_IMM of a
// LogBootstrap into the primary's bootstrap region (imm = kLogBootImm),
// saying where the ring and LogControl are.
// The primary's n-th forwarded slot (index n, from 1) goes into record
// (n - 1) % slots as ONE WRITE_WITH_IMM of LogRecord + the slot's used
// bytes (its SlotHeader and payload, gathered from the worker's ring slot
// itself), imm = low 32 bits of n, in the order the primary applies them.
// The backup applies the records strictly in index order with the same
// code as the primary (ServerImpl::ApplySlot), so its rows and optimizer
// state stay bitwise equal; after each it stores LogControl::applied_index,
// which the primary READs when it has no free record left (credits).
// The primary applies a slot (and so makes it visible and acknowledges it)
// only after the log WRITE completed: the backup holds every push any
// worker saw acknowledged.
//
// == Fencing ==
// A record carries the epoch the primary serves at; the backup drops a
// record of another epoch. When the backup is promoted it closes the
// primary's connection and deregisters its log ring (a later WRITE of the
// old primary fails at the transport), and the decider's entry names it:
// the old primary learns it was superseded when its next log WRITE fails
// and it asks the decider (ReportBackupLost), and from then on applies and
// acknowledges nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "rdmaps/failover.h"
#include "rdmaps/status.h"
#include "src/base/mutex.h"
#include "src/ps/memory.h"
#include "src/ps/wire.h"
#include "transport/transport.h"

namespace rdmaps::internal {

inline constexpr std::uint32_t kReplHelloMagic = 0x4c504552;  // "REPL"
inline constexpr std::uint32_t kLogBootMagic = 0x544f424c;    // "LBOT"
inline constexpr std::uint32_t kLogMagic = 0x474f4c52;        // "RLOG"
inline constexpr std::uint32_t kLogBootImm = 0xC0000000u;
// A backup's endpoint uses peer id kBackupPeerBase + server_index (its
// primary's is kServerPeerBase + server_index).
inline constexpr std::uint32_t kBackupPeerBase = 0x60000000u;

struct ReplHello {  // ConnectOptions::user_data of the primary, 24 bytes
  std::uint32_t magic;
  std::uint32_t epoch;      // the epoch the primary serves at (and its records carry)
  std::uint64_t boot_addr;  // sizeof(LogBootstrap) bytes, remote-write
  std::uint32_t boot_rkey;
  std::uint32_t shard;
};
static_assert(std::is_trivially_copyable_v<ReplHello> && sizeof(ReplHello) == 24);

struct LogBootstrap {  // 80 bytes
  std::uint32_t magic;
  std::uint32_t shard;
  WireRegion ring;
  WireRegion control;
  std::uint32_t slots;
  std::uint32_t record_bytes;  // kLogRecordBytes + push_slot_bytes
  std::uint8_t pad[16];
};
static_assert(std::is_trivially_copyable_v<LogBootstrap> && sizeof(LogBootstrap) == 80);

struct LogRecord {  // then `bytes` of the slot (SlotHeader + payload)
  std::uint32_t magic;
  std::uint32_t worker;
  std::uint64_t epoch;
  std::uint64_t index;  // 1, 2, ...
  std::uint32_t bytes;
  std::uint32_t pad;
  std::uint8_t reserved[32];
};
inline constexpr std::size_t kLogRecordBytes = 64;
static_assert(std::is_trivially_copyable_v<LogRecord> && sizeof(LogRecord) == kLogRecordBytes);

// A record whose SlotHeader::kind is this is not a worker's slot: the
// primary saw `worker`'s connection drop (an elastic member that died; the
// header's clock is its clock there) and the backup makes it leave too.
// Workers cannot send it (no SlotKind has this value; a primary refuses
// unknown kinds).
inline constexpr std::uint32_t kLogWorkerDied = 0x100;

struct LogControl {
  std::uint64_t applied_index;  // records applied by the backup
  std::uint64_t pad;
};
static_assert(sizeof(LogControl) == 16);

// Bytes of slot `h` a primary forwards (header and payload): rows of
// `dim` floats (0: not a data slot of a known table), at most slot_bytes.
std::size_t UsedSlotBytes(const SlotHeader& h, std::uint32_t dim, std::uint32_t slot_bytes);

// The primary's side. Apply thread only, after Connect (Init).
class LogSender {
 public:
  LogSender(transport::Endpoint* endpoint, std::uint32_t shard, std::uint32_t push_slot_bytes,
            std::chrono::milliseconds op_timeout, std::shared_ptr<FailoverDecider> decider)
      : endpoint_(endpoint),
        shard_(shard),
        push_slot_bytes_(push_slot_bytes),
        op_timeout_(op_timeout),
        decider_(std::move(decider)) {}

  // Connects to the backup at `backup_address` (retrying while it does not
  // listen yet) and takes its LogBootstrap. Before the apply thread runs:
  // it waits on the endpoint's notifications itself.
  Status Connect(const std::string& backup_address, transport::Deadline deadline);
  // Registers the shard in the decider as served by `self` (epoch 1).
  Status Register(const std::string& self, const std::string& backup_address);

  // Forwards worker w's slot [slot, slot + bytes) (inside `slot_mr`) and
  // waits until the backup holds it. OK: apply it. An error: this primary
  // was superseded (fenced) or cannot tell; apply and acknowledge nothing.
  // When the backup is lost the decider is asked; when it lets this
  // primary go on alone, the call (and every later one) is OK at once.
  Status Forward(std::uint32_t w, const std::byte* slot, std::size_t bytes,
                 const transport::MemoryRegion* slot_mr);
  // The same for several slots, in this order, posted together (one round
  // trip per batch that the credits and the connection's op limit allow).
  struct Item {
    std::uint32_t worker;
    const std::byte* slot;
    std::size_t bytes;
    const transport::MemoryRegion* mr;
  };
  Status ForwardBatch(std::span<const Item> items);
  // The backup's connection dropped (a notification): asks the decider
  // now, so that an idle primary learns that it was fenced.
  void OnBackupDisconnected();
  bool fenced() const { return fenced_.load(); }
  bool alone() const { return alone_; }
  std::uint64_t epoch() const { return epoch_.load(); }
  std::uint64_t forwarded() const { return next_index_ - 1; }
  // Records posted together at most.
  static constexpr std::size_t kMaxBatch = 64;
  // In-process kill (tests): never asks the decider again; every later
  // Forward fails. CloseConnection: once the apply thread is joined.
  void Kill();
  void CloseConnection() {
    if (conn_) conn_->Close();
  }

 private:
  // Until `need` more records fit the backup's ring.
  Status WaitCredit(std::uint64_t need, transport::Deadline deadline);
  Status Lost(const Status& why);

  transport::Endpoint* const endpoint_;
  const std::uint32_t shard_;
  const std::uint32_t push_slot_bytes_;
  const std::chrono::milliseconds op_timeout_;
  const std::shared_ptr<FailoverDecider> decider_;
  std::string self_;
  std::unique_ptr<transport::Connection> conn_;
  AlignedBuffer boot_;
  std::unique_ptr<transport::MemoryRegion> boot_mr_;
  AlignedBuffer staging_;  // kMaxBatch LogRecords, then LogControl as read
  std::unique_ptr<transport::MemoryRegion> staging_mr_;
  LogBootstrap backup_{};
  std::uint64_t next_index_ = 1;
  std::uint64_t acked_index_ = 0;  // LogControl::applied_index as last read
  bool alone_ = false;
  std::atomic<bool> fenced_{false};
  std::atomic<bool> killed_{false};
  std::atomic<std::uint64_t> epoch_{1};
};

// The backup's side.
class LogReceiver {
 public:
  // One record's slot: the worker, its header and payload (the rest of a
  // push slot: push_slot_bytes - sizeof(SlotHeader) bytes, of which the
  // primary forwarded those it used).
  struct Logged {
    std::uint32_t worker = 0;
    SlotHeader header{};
    const std::byte* payload = nullptr;
  };

  LogReceiver(transport::Endpoint* endpoint, std::uint32_t shard, std::uint32_t slots,
              std::uint32_t push_slot_bytes, std::shared_ptr<FailoverDecider> decider)
      : endpoint_(endpoint),
        shard_(shard),
        slots_(slots),
        record_bytes_(kLogRecordBytes + push_slot_bytes),
        decider_(std::move(decider)) {}

  // Allocates and registers the ring, LogControl and the bootstrap message.
  Status Register(std::size_t* registered);
  void set_self(const std::string& self) { self_ = self; }

  // Accept thread: takes `conn` when its handshake carries a ReplHello
  // (writes the LogBootstrap; true, conn moved). A second primary while
  // one is bound, or any after promotion, is refused (true, conn closed).
  bool MaybeAccept(std::unique_ptr<transport::Connection>& conn) RDMAPS_EXCLUDES(mu_);

  // Apply thread: whether `n` is of the primary's bound connection.
  bool Owns(const transport::Notification& n) const;
  // Apply thread: takes the next record (imm = its index) into *out; the
  // caller applies it, then calls Release() (the primary may then reuse
  // its place). False when it is not the expected one (counted by the
  // caller), or this backup serves already.
  bool Take(std::uint32_t imm, Logged* out);
  void Release();
  // Apply thread: the primary's connection dropped. Asks the decider;
  // true when this backup was promoted (it then fenced the old primary).
  bool OnPrimaryLost() RDMAPS_EXCLUDES(mu_);

  bool serving() const { return serving_.load(); }
  // Accept thread: whether this backup serves, waiting (until `deadline`)
  // while its promotion is being decided: the shard map names it a moment
  // before it serves, and a worker that read the map may come in between.
  bool WaitServing(transport::Deadline deadline) RDMAPS_EXCLUDES(mu_);
  // In-process kill (tests), once the apply thread is joined.
  void CloseConnection() RDMAPS_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (primary_) primary_->Close();
  }
  std::uint64_t epoch() const { return epoch_.load(); }
  std::uint64_t applied() const { return applied_index_; }

 private:
  transport::Endpoint* const endpoint_;
  const std::uint32_t shard_;
  const std::uint32_t slots_;
  const std::size_t record_bytes_;
  const std::shared_ptr<FailoverDecider> decider_;
  std::string self_;  // constant after Init
  AlignedBuffer ring_;
  std::unique_ptr<transport::MemoryRegion> ring_mr_ RDMAPS_GUARDED_BY(mu_);
  AlignedBuffer control_;
  std::unique_ptr<transport::MemoryRegion> control_mr_;
  AlignedBuffer boot_msg_;
  std::unique_ptr<transport::MemoryRegion> boot_msg_mr_;
  std::uint64_t applied_index_ = 0;      // apply thread only
  std::atomic<std::uint64_t> bound_{0};  // PeerInfo::connection of the primary
  std::atomic<std::uint64_t> epoch_{0};  // the primary's (from its hello), then ours
  std::atomic<bool> serving_{false};
  mutable Mutex mu_;
  std::unique_ptr<transport::Connection> primary_ RDMAPS_GUARDED_BY(mu_);
  bool fenced_ RDMAPS_GUARDED_BY(mu_) = false;
  bool deciding_ RDMAPS_GUARDED_BY(mu_) = false;  // OnPrimaryLost asks the decider
  std::condition_variable decided_;
};

}  // namespace rdmaps::internal

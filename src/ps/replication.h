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
// == Re-protection (a replacement backup) ==
// A replacement (ServerOptions::rejoin_as_backup_of) registers its log ring
// and a RejoinOffer region (its LogBootstrap and address; remote read and
// write), then connects to the primary with a RejoinHello as user data.
// The primary READs the offer, captures its shard into a registered
// snapshot (RejoinSnapshotHead, RejoinWorker per worker slot, then per
// table its rows and optimizer state) between two apply batches at log
// index i, from then on forwards every slot to the replacement's ring
// (index i + 1, ...) exactly as to a backup (the acknowledgement waits for
// it: a "candidate"), and WRITE_WITH_IMMs a RejoinAnswer (epoch, i, the
// snapshot region, its mailbox) into the offer region. The replacement
// READs the snapshot on a thread of its own while its apply thread stashes
// the records (releasing their ring places), loads the snapshot, applies
// the stash in index order, and once the stash is empty WRITE_WITH_IMMs
// its applied index into the primary's mailbox (kRejoinSyncedImm). The
// primary then asks the decider (AddBackup: epoch + 1, the replacement as
// backup); only from then on does a lost replacement count as a lost
// backup. A candidate lost before that is dropped: the primary goes on
// alone, as before.
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
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

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

inline constexpr std::uint32_t kRejoinHelloMagic = 0x4e494a52;   // "RJIN"
inline constexpr std::uint32_t kRejoinOfferMagic = 0x52464f52;   // "ROFR"
inline constexpr std::uint32_t kRejoinAnswerMagic = 0x534e4152;  // "RANS"
inline constexpr std::uint32_t kRejoinSnapMagic = 0x504e5352;    // "RSNP"
inline constexpr std::uint32_t kRejoinSyncedImm = 0xC0000001u;
// A replacement stashes at most this many bytes of log records while it
// copies the snapshot; more, and it gives up (the primary goes on alone).
inline constexpr std::size_t kMaxRejoinStashBytes = std::size_t{1} << 30;

struct RejoinHello {  // ConnectOptions::user_data of a replacement, 24 bytes
  std::uint32_t magic;
  std::uint32_t shard;
  std::uint64_t offer_addr;  // kRejoinRegionBytes: RejoinOffer, then RejoinAnswer
  std::uint32_t offer_rkey;
  std::uint32_t pad;
};
static_assert(std::is_trivially_copyable_v<RejoinHello> && sizeof(RejoinHello) == 24);

struct RejoinOffer {  // 192 bytes, READ by the primary
  std::uint32_t magic;
  std::uint32_t shard;
  LogBootstrap log;  // the replacement's log ring
  std::uint32_t address_len;
  std::uint32_t pad;
  char address[96];  // the replacement's Server::address(), the shard map's name of it
};
static_assert(std::is_trivially_copyable_v<RejoinOffer> && sizeof(RejoinOffer) == 192);

enum class RejoinRefusal : std::uint32_t {
  kNone = 0,
  kHasBackup = 1,   // the shard has a backup (or a replacement is catching up)
  kNotServing = 2,  // fenced, or not a primary
  kElastic = 3,     // (no longer sent: elastic jobs are re-protected, membership included)
  kBadOffer = 4,    // the offer does not fit this shard
  kNoMemory = 5,    // the snapshot could not be allocated or registered
};

struct RejoinAnswer {  // 72 bytes, written by the primary after the offer
  std::uint32_t magic;
  std::uint32_t refusal;  // RejoinRefusal
  std::uint64_t epoch;    // the primary's; its records carry it
  std::uint64_t index;    // the snapshot holds log records 1..index; the next is index + 1
  WireRegion snapshot;    // remote-read
  WireRegion mailbox;     // 8 bytes, remote-write: kRejoinSyncedImm
};
// (The mailbox's length and rkey are all the replacement uses of it.)
static_assert(std::is_trivially_copyable_v<RejoinAnswer> && sizeof(RejoinAnswer) == 72);
inline constexpr std::size_t kRejoinRegionBytes = sizeof(RejoinOffer) + 128;

struct RejoinSnapshotHead {  // 64 bytes, then RejoinWorker per slot, then the tables
  std::uint32_t magic;
  std::uint32_t shard;
  std::uint64_t index;
  std::uint64_t epoch;
  std::uint32_t worker_slots;
  std::uint32_t tables;
  std::uint64_t bytes;  // the whole snapshot
  // The primary's membership (elastic jobs; src/ps/membership.h).
  std::uint32_t membership_epoch;
  std::uint32_t elastic;  // 0 or 1: must match the replacement's max_workers mode
  std::uint64_t floor_clock;
  std::uint8_t pad[8];
};
static_assert(std::is_trivially_copyable_v<RejoinSnapshotHead> && sizeof(RejoinSnapshotHead) == 64);

struct RejoinWorker {  // 48 bytes
  std::uint64_t next_seq;
  std::uint64_t clock;
  std::uint32_t done;  // 0 or 1
  std::uint32_t died;  // 0 or 1: disconnected without a goodbye
  // The slot's membership (Membership::SlotImage): 0 member, 1 vacant, 2
  // left (always 0 outside elastic mode); the membership epoch it joined
  // at; its Barrier() count; joined by kJoin, left by dying (0 or 1).
  std::uint32_t member_state;
  std::uint32_t member_epoch;
  std::uint64_t barriers;
  std::uint32_t joined;
  std::uint32_t left_died;
};
static_assert(std::is_trivially_copyable_v<RejoinWorker> && sizeof(RejoinWorker) == 48);
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

// Records of a backup's log ring: two per push slot, so that the backup's
// apply may lag the primary's by more than a worker's push ring before the
// primary waits for credits (with push_slots records, a run of 4 MiB
// pushes, 69 slots each, stalled on them several times per push).
inline std::uint32_t LogSlots(std::uint32_t push_slots) {
  return push_slots <= UINT32_MAX / 2 ? 2 * push_slots : push_slots;
}

// Bytes of slot `h` a primary forwards (header and payload): rows of
// `dim` floats (0: not a data slot of a known table), at most slot_bytes.
std::size_t UsedSlotBytes(const SlotHeader& h, std::uint32_t dim, std::uint32_t slot_bytes);

// Posts `ops` on `conn` and waits for all their completions; the first
// failed one's status.
Status PostAndWait(transport::Connection& conn, std::span<const transport::Op> ops,
                   transport::Deadline deadline);

// FailedPrecondition unless a backup's LogBootstrap `b` fits a primary of
// `shard` with `push_slot_bytes` (its words are the backup's: checked
// before they address anything).
Status CheckLogBootstrap(const LogBootstrap& b, std::uint32_t shard, std::uint32_t push_slot_bytes,
                         const std::string& backup_address);

// The primary's side. Apply thread only, after Connect (Init).
class LogSender {
 public:
  // busy_poll: how long a wait for log WRITE completions spins
  // (ServerOptions::log_busy_poll).
  LogSender(transport::Endpoint* endpoint, std::uint32_t shard, std::uint32_t push_slot_bytes,
            std::chrono::milliseconds op_timeout, std::chrono::microseconds busy_poll,
            std::shared_ptr<FailoverDecider> decider)
      : endpoint_(endpoint),
        shard_(shard),
        push_slot_bytes_(push_slot_bytes),
        op_timeout_(op_timeout),
        busy_poll_(busy_poll),
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
  // ForwardBatch in two halves, so that the caller applies each slot as
  // soon as the backup holds it while the later ones are still on the way:
  // Post posts the records (waiting only for credits, staging and the op
  // limit) and returns; the k-th item posted since Connect is record
  // posted() - items.size() + k + 1. WaitHeld(index) returns once every
  // record up to `index` is in the backup's ring (WRITEs complete in
  // posting order). Errors as Forward's; alone, both are OK at once.
  Status Post(std::span<const Item> items);
  Status WaitHeld(std::uint64_t index);
  std::uint64_t posted() const { return next_index_ - 1; }
  // The backup's connection dropped (a notification): asks the decider
  // now, so that an idle primary learns that it was fenced.
  void OnBackupDisconnected();
  // Whether notification `n` (of the backup's peer id) is of the current
  // backup's or candidate's connection (not of one closed before).
  bool Owns(const transport::Notification& n) const;

  // Re-protection. A server that may come to serve alone without having
  // connected (a backup, which may be promoted): who it is and its epoch.
  void SetAlone(const std::string& self, std::uint64_t epoch);
  // A replacement `address` connected on `conn` with its log ring `ring`:
  // from the next Forward on, every slot goes to it (from index
  // forwarded() + 1) and waits for it, but a failure only drops it
  // (alone again, logged), until CandidateSynced. Only when alone; `conn`
  // is taken only when it returns OK.
  Status AttachCandidate(std::unique_ptr<transport::Connection>& conn, const LogBootstrap& ring,
                         const std::string& address);
  bool candidate() const { return candidate_; }
  // Posts `ops` on the candidate's connection and waits for them.
  Status SendToCandidate(std::span<const transport::Op> ops);
  // The candidate says it applied everything up to its log: asks the
  // decider to make it the backup (epoch + 1). An error: it was dropped.
  Status CandidateSynced();
  void DropCandidate(const Status& why);
  bool fenced() const { return fenced_.load(); }
  bool alone() const { return alone_; }
  std::uint64_t epoch() const { return epoch_.load(); }
  std::uint64_t forwarded() const { return next_index_ - 1; }
  // Log WRITEs and credit READs posted since Start (any thread).
  std::uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }
  std::uint64_t credit_reads() const { return credit_reads_.load(std::memory_order_relaxed); }
  // Records posted together at most.
  static constexpr std::size_t kMaxBatch = 64;
  // In-process kill (tests): never asks the decider again; every later
  // Forward fails. CloseConnection: once the apply thread is joined.
  void Kill();
  void CloseConnection() {
    if (conn_) conn_->Close();
  }

 private:
  // Until `need` more records fit the backup's ring (posts `ops` first).
  Status WaitCredit(std::uint64_t need, std::vector<transport::Op>* ops,
                    transport::Deadline deadline);
  // Posts `ops` (then empty), counted in outstanding_.
  Status Flush(std::vector<transport::Op>* ops);
  // Takes completions until held_ >= held and, with `read`, the LogControl
  // READ completed.
  Status Drain(std::uint64_t held, bool read, transport::Deadline deadline);
  static constexpr std::uint64_t kReadContext = ~std::uint64_t{0};
  Status Lost(const Status& why);
  Status AllocateStaging();

  transport::Endpoint* const endpoint_;
  const std::uint32_t shard_;
  const std::uint32_t push_slot_bytes_;
  const std::chrono::milliseconds op_timeout_;
  const std::chrono::microseconds busy_poll_;
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
  std::uint64_t held_ = 0;         // records whose WRITE completed
  std::size_t outstanding_ = 0;    // ops posted, not completed
  std::size_t max_outstanding_ = 0;
  bool read_pending_ = false;
  std::vector<transport::Op> ops_;            // Post's
  transport::Segment gather_[2 * kMaxBatch];  // per staging header, until its WRITE completed
  bool alone_ = false;
  bool candidate_ = false;  // a replacement catching up (not in the shard map)
  std::string candidate_address_;
  std::atomic<bool> fenced_{false};
  std::atomic<bool> killed_{false};
  std::atomic<std::uint64_t> epoch_{1};
  std::atomic<std::uint64_t> writes_{0};
  std::atomic<std::uint64_t> credit_reads_{0};
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
    std::uint32_t bytes = 0;  // header and payload, as the primary forwarded them
  };

  LogReceiver(transport::Endpoint* endpoint, std::uint32_t shard, std::uint32_t slots,
              std::uint32_t push_slot_bytes, std::shared_ptr<FailoverDecider> decider)
      : endpoint_(endpoint),
        shard_(shard),
        slots_(slots),
        record_bytes_(kLogRecordBytes + push_slot_bytes),
        decider_(std::move(decider)),
        primary_peer_(kServerPeerBase + shard) {}

  // Allocates and registers the ring, LogControl and the bootstrap message.
  Status Register(std::size_t* registered);
  void set_self(const std::string& self) { self_ = self; }

  // Accept thread: takes `conn` when its handshake carries a ReplHello
  // (writes the LogBootstrap; true, conn moved). A second primary while
  // one is bound, or any after promotion, is refused (true, conn closed).
  bool MaybeAccept(std::unique_ptr<transport::Connection>& conn) RDMAPS_EXCLUDES(mu_);

  // A replacement (re-protection): `conn` is its connection to the
  // primary, which will write into its ring. Before the apply thread runs.
  void AttachPrimary(std::unique_ptr<transport::Connection> conn) RDMAPS_EXCLUDES(mu_);
  // Apply thread: the primary's answer came: its records carry `epoch`,
  // the first is index + 1.
  void StartAt(std::uint64_t epoch, std::uint64_t index);
  // Posts `ops` on the primary's connection and waits (the replacement's
  // snapshot READs, on its copy thread, then its synced message).
  Status SendToPrimary(std::span<const transport::Op> ops, transport::Deadline deadline)
      RDMAPS_EXCLUDES(mu_);
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
  // What the primary is told of the ring (constant after Register).
  LogBootstrap bootstrap() const {
    LogBootstrap b;
    std::memcpy(&b, boot_msg_.get(), sizeof(b));
    return b;
  }

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
  // The primary's peer id: its server id, or a promoted backup's.
  std::atomic<std::uint32_t> primary_peer_{0};
  std::atomic<std::uint64_t> epoch_{0};  // the primary's (from its hello), then ours
  std::atomic<bool> serving_{false};
  mutable Mutex mu_;
  std::unique_ptr<transport::Connection> primary_ RDMAPS_GUARDED_BY(mu_);
  bool fenced_ RDMAPS_GUARDED_BY(mu_) = false;
  bool deciding_ RDMAPS_GUARDED_BY(mu_) = false;  // OnPrimaryLost asks the decider
  std::condition_variable decided_;
};

}  // namespace rdmaps::internal

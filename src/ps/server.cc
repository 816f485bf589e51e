// The parameter server node. Threads:
// - the accept thread takes worker connections and sends each its bootstrap
//   message (the one server-initiated op; see src/ps/wire.h);
// - the apply thread waits for push notifications, applies push slots in
//   per-worker seq order with the tables' optimizers, and republishes the
//   control block after each batch.
// Workers' pulls are served by the transport without any thread of ours.
#include "rdmaps/server.h"

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <span>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "src/base/log.h"
#include "src/base/mutex.h"
#include "src/ps/checkpoint.h"
#include "src/ps/common.h"
#include "src/ps/directory.h"
#include "src/ps/initializer.h"
#include "src/ps/membership.h"
#include "src/ps/memory.h"
#include "src/ps/optimizer.h"
#include "src/ps/push_slot.h"
#include "src/ps/replication.h"
#include "src/ps/test_hooks.h"
#include "src/ps/wire.h"
#include "transport/transport.h"

namespace rdmaps {
namespace {

using internal::AlignedBuffer;
using internal::BlockHeader;
using internal::ControlHead;
using internal::ControlWorker;
using internal::SlotHeader;
using internal::SlotKind;
using transport::Deadline;
using transport::DeadlineAfter;

// A range push of at least this many floats spreads its blocks over cores
// (TBB); smaller ones are applied on the apply thread alone.
constexpr std::size_t kParallelFloats = 1 << 16;
// The apply thread republishes the control block at least every this many
// slots of a batch (and at its end).
constexpr std::size_t kPublishEverySlots = 8;

// TEST_HoldCatchup: replacements in this process do not load their copy.
std::atomic<bool> g_hold_catchup{false};

internal::WireRegion Wire(const transport::MemoryRegion& mr) {
  return {reinterpret_cast<std::uint64_t>(mr.data()), mr.size(), mr.rkey(), 0};
}

// A shard in registered memory, laid out as `geometry` says (dense rows then
// headers, or each header before its block of rows; src/ps/wire.h).
struct TableState {
  TableOptions options;
  internal::ShardRange shard;
  internal::ShardGeometry geometry;
  AlignedBuffer memory;
  std::unique_ptr<transport::MemoryRegion> mr;
  std::optional<internal::Optimizer> optimizer;
  std::vector<float> state;  // shard.count * optimizer->state_floats()

  std::size_t row_bytes() const { return internal::RowBytes(options.dim); }
  float* data(std::uint64_t local) const {
    return reinterpret_cast<float*>(memory.get() + geometry.row(local));
  }
  BlockHeader* header(std::uint64_t block) const {
    return reinterpret_cast<BlockHeader*>(memory.get() + geometry.header(block));
  }
  // Re-seals a block after rows of it changed (data first, then header).
  void Seal(std::uint64_t block) const {
    BlockHeader* h = header(block);
    internal::SealRow(h, h->version + 1, data(geometry.first_row(block)),
                      geometry.block_rows(block) * row_bytes());
  }
};

struct WorkerState {  // apply thread only, except where noted
  std::uint64_t next_seq = 1;
  std::uint64_t clock = 0;
  bool done = false;
  bool died = false;  // disconnected without a goodbye
  // The connection (PeerInfo::connection) whose slots are being applied: a
  // new one is a new Client, whose sequence starts at 1 again.
  std::uint64_t conn = 0;
  // False after a rewind in place until this worker's new session says it
  // knows (its kRewind): the slots of its older session are dropped.
  bool session_ok = true;
  // The session's only slot so far is its kRewind: a recovery attempt
  // that may still give up (ClientOptions::rewind_from).
  bool rewind_only = false;
};

class ServerImpl final : public Server {
 public:
  explicit ServerImpl(const ServerOptions& options)
      : options_(options), slots_(internal::WorkerSlots(options)), workers_(slots_) {}

  ~ServerImpl() override { Stop(); }

  Status Init();

  const std::string& address() const override { return address_; }
  Status Run() override { return RunUntil(Deadline::max()); }
  Status RunUntil(Deadline deadline) override;
  void Stop() override;
  ServerStats stats() const override {
    ServerStats s;
    {
      MutexLock lock(mu_);
      s = stats_;
    }
    if (log_sender_) {
      s.log_writes = log_sender_->writes();
      s.log_credit_reads = log_sender_->credit_reads();
    }
    return s;
  }
  Status ReadLocal(std::uint32_t table, RowRange range, std::vector<float>* out) const override;
  void RequestCheckpoint() override { ++trigger_requests_; }
  Result<std::uint64_t> CheckpointNow(Deadline deadline) override;

  transport::Endpoint* TEST_endpoint() const { return endpoint_.get(); }
  Status TEST_SetRow(std::uint32_t table, std::uint64_t row, float value);
  void TEST_PauseApply(bool paused) { test_paused_.store(paused); }
  void TEST_Kill();
  void TEST_Hang() {
    killed_.store(true);
    if (log_sender_) log_sender_->Kill();
    test_paused_.store(true);
  }
  void TEST_PrimaryLeaseLost() {
    if (log_receiver_ && !killed_.load()) log_receiver_->CloseConnection();
  }
  Status TEST_ShardState(std::uint32_t table, std::vector<float>* rows, std::vector<float>* state);
  std::string TEST_MembershipImage();

 private:
  Status RegisterAll();
  void AcceptLoop();
  void ApplyLoop();
  // Applies one slot of worker w; false (and counts) when malformed. Apply
  // thread only.
  bool ApplySlot(std::uint32_t w, const SlotHeader& h, const std::byte* payload)
      RDMAPS_REQUIRES(apply_mu_);
  // Takes worker w's slot of notification `imm`: applies it, or queues it
  // behind the checkpoint cut (src/ps/checkpoint.h). Apply thread only.
  void TakeSlot(std::uint32_t w, std::uint32_t imm) RDMAPS_REQUIRES(apply_mu_);
  void HandleSlot(std::uint32_t w, std::uint32_t imm) RDMAPS_REQUIRES(apply_mu_);
  // Replication (src/ps/replication.h). A backup: a notification of its
  // primary's connection (a log record, or the primary lost). Apply thread.
  void HandleLog(const transport::Notification& n) RDMAPS_REQUIRES(apply_mu_);
  // A primary of a replicated shard, before the batch is applied: posts at
  // once the forwards of the slots whose apply order is known (data slots
  // in notification order, no cut holding any), and notes for each
  // notification it covered whether it is of the worker's bound connection
  // (prebound_) and its log record (held_index_), so that the loop applies
  // exactly those, each once the backup holds it. Returns how many
  // notifications it covered.
  std::size_t PreForward(std::span<const transport::Notification> batch) RDMAPS_REQUIRES(apply_mu_);
  std::size_t UsedBytes(const SlotHeader& h) const;
  // What a backup does with log record `rec` of worker w, in log order:
  // what the primary's HandleSlot did with that slot. Apply thread.
  void ApplyLogRecord(std::uint32_t w, const SlotHeader& h, const std::byte* payload)
      RDMAPS_REQUIRES(apply_mu_);
  // A notification of the backup's peer id on a primary: its (or a
  // replacement's) connection dropped, or a replacement is in sync.
  void OnBackupNotification(const transport::Notification& n) RDMAPS_REQUIRES(apply_mu_);

  // ---- Re-protection (docs/ps.md, "Re-protection") ----
  // Bytes of a RejoinSnapshot of this server's shards.
  std::size_t SnapshotBytes() const;
  // Primary, accept thread: a replacement's RejoinHello on `conn`: READs
  // its offer and hands it to the apply thread (true: conn taken).
  bool MaybeAcceptRejoin(std::unique_ptr<transport::Connection>& conn) RDMAPS_EXCLUDES(mu_);
  // Primary, apply thread, between batches: captures the snapshot for an
  // offer handed over and makes the replacement the candidate.
  void ServeRejoin() RDMAPS_REQUIRES(apply_mu_);
  // Replacement, Init: registers the offer and connects to the primary.
  Status StartRejoin();
  // Replacement, apply thread: the primary's notifications until in sync
  // (its answer, records to stash, its loss). True when handled.
  bool CatchupLog(const transport::Notification& n) RDMAPS_REQUIRES(apply_mu_);
  // Replacement, apply thread, every loop: loads the copied snapshot,
  // applies the stash, says it is in sync.
  void CatchupStep() RDMAPS_REQUIRES(apply_mu_);
  Status LoadSnapshot(const std::byte* snap) RDMAPS_REQUIRES(apply_mu_);
  void FailCatchup(const Status& why) RDMAPS_REQUIRES(apply_mu_);
  // Whether the apply loop should not wait for notifications (a stash
  // to apply, a copy about to finish).
  bool CatchupBusy() const;
  // A primary of a replicated shard: worker w left by dying (its
  // connection dropped); the backup is told in log order (a
  // kLogWorkerDied record), so that a promoted backup does not wait for
  // it. Apply thread only.
  void ForwardDeath(std::uint32_t w) RDMAPS_REQUIRES(apply_mu_);
  // False while this server must acknowledge nothing: a backup not
  // promoted, a fenced or killed primary.
  bool Serving() const;
  // Worker w's slots now come on `connection`: a new Client's sequence
  // restarts at 1 and the held slots of the old one go; a failover
  // reconnect's goes on. `imm` is the first slot's. Apply thread only.
  void NewSession(std::uint32_t w, std::uint64_t connection, std::uint32_t imm)
      RDMAPS_REQUIRES(apply_mu_);
  // A kRewind of worker w: reloads checkpoint `clock` in place unless this
  // recovery `id` was done already (docs/ps.md, "Recovery"). Apply thread.
  void Rewind(std::uint32_t w, std::uint64_t clock, std::uint64_t id) RDMAPS_REQUIRES(apply_mu_);
  // Loads checkpoint `path` into the shards; its clock and lineage.
  Status LoadCheckpoint(const std::string& path, std::uint64_t* clock, std::string* lineage)
      RDMAPS_REQUIRES(apply_mu_);
  // Captures the shards once the cut is complete (or abandons it after
  // checkpoint_timeout), then lets the held slots through. Apply thread only.
  void AdvanceCut() RDMAPS_REQUIRES(apply_mu_);
  // Serves RequestCheckpoint() and the checkpoint_interval timer: a cut
  // (CheckpointCut::Trigger), published for the workers to relay. Apply
  // thread only.
  void ServeTriggers() RDMAPS_REQUIRES(apply_mu_);
  // Wakes CheckpointNow() after a checkpoint word changed.
  void NotifyCheckpoint() RDMAPS_EXCLUDES(mu_);
  std::vector<internal::ShardView> Views();
  // Loads options_.restore into the shards (Init, before serving).
  Status Restore();
  // Under apply_mu_, which the apply thread holds while TBB tasks of
  // ApplySlot call it (the analysis does not follow it into them).
  void ApplyRow(TableState& t, std::uint64_t local, const float* grad);
  // Rewrites the control block from workers_. Apply thread only (and Init,
  // before it starts).
  void PublishControl() RDMAPS_EXCLUDES(mu_);
  // Elastic, a promoted backup: once failover_reconnect_window has passed
  // since the promotion, each member that has not connected (it died with
  // the old primary) leaves as dead. Apply thread, under apply_mu_.
  void DepartAbsentMembers() RDMAPS_REQUIRES(apply_mu_) RDMAPS_EXCLUDES(mu_);
  // Every worker has come and gone (exit_when_workers_done), or Stop().
  bool Finished() const RDMAPS_REQUIRES(mu_);
  std::string WorkerList(const std::vector<std::uint32_t>& ids) const;

  // Constant after Init().
  const ServerOptions options_;
  const std::uint32_t slots_;  // worker slots: max_workers in elastic mode, else num_workers
  std::unique_ptr<transport::Endpoint> endpoint_;
  std::string address_;
  std::vector<TableState> tables_;
  std::unordered_map<std::uint32_t, std::size_t> table_index_;
  AlignedBuffer directory_;
  std::unique_ptr<transport::MemoryRegion> directory_mr_;
  AlignedBuffer control_;
  std::unique_ptr<transport::MemoryRegion> control_mr_;
  AlignedBuffer atomics_;
  std::unique_ptr<transport::MemoryRegion> atomics_mr_;
  std::vector<AlignedBuffer> rings_;
  std::vector<std::unique_ptr<transport::MemoryRegion>> ring_mrs_;
  AlignedBuffer boot_msg_;
  std::unique_ptr<transport::MemoryRegion> boot_msg_mr_;
  std::unique_ptr<tbb::global_control> tbb_limit_;
  // Replication: the primary of a replicated shard forwards every slot
  // (apply thread, after Init); a backup takes the log.
  std::unique_ptr<internal::LogSender> log_sender_;
  std::unique_ptr<internal::LogReceiver> log_receiver_;
  // A backup's watch of its primary's lease (FailoverDecider::WatchPrimary):
  // a primary that hangs with its connections open loses its lease, and the
  // watch drops its log connection, which promotes this backup as a lost
  // connection does (HandleLog). Ended first in Stop.
  std::unique_ptr<PrimaryWatch> primary_watch_;
  std::atomic<bool> killed_{false};  // TEST_Kill
  // Apply thread only: per worker the newest seq forwarded to the backup,
  // and PreForward's scratch.
  std::vector<std::uint64_t> forwarded_seq_;
  std::vector<std::uint64_t> forward_next_;
  std::vector<internal::LogSender::Item> forward_items_;
  std::vector<bool> prebound_;
  std::vector<std::uint64_t> held_index_;  // per covered notification: its log record (0: none)
  // Re-protection on a primary: an offer the accept thread took (a
  // replacement's connection, its offer, the snapshot memory), and the one
  // whose candidate is catching up (its snapshot stays until then).
  struct RejoinIn {
    std::unique_ptr<transport::Connection> conn;
    internal::RejoinHello hello{};
    internal::RejoinOffer offer{};
    AlignedBuffer snap;
    std::unique_ptr<transport::MemoryRegion> snap_mr;
    AlignedBuffer box;  // the offer as READ, the answer to send, the mailbox
    std::unique_ptr<transport::MemoryRegion> box_mr;
  };
  std::unique_ptr<RejoinIn> rejoin_offer_ RDMAPS_GUARDED_BY(mu_);
  std::unique_ptr<RejoinIn> rejoin_serving_;  // apply thread
  // On a replacement (rejoin_as_backup_of): its catch-up. Apply thread,
  // except `copier` (which writes copy_status, then copied) and Stop.
  struct Catchup {
    enum class Phase { kAwaitAnswer, kCopying, kApplying, kSynced, kFailed };
    Phase phase = Phase::kAwaitAnswer;
    AlignedBuffer region;  // RejoinOffer, then the RejoinAnswer
    std::unique_ptr<transport::MemoryRegion> region_mr;
    internal::RejoinAnswer answer{};
    AlignedBuffer snap;  // the copy, READ from the primary
    std::unique_ptr<transport::MemoryRegion> snap_mr;
    std::size_t snap_bytes = 0;
    std::thread copier;
    std::atomic<bool> copied{false};
    std::atomic<bool> stop{false};
    Status copy_status;  // the copier's, before copied
    struct Stashed {
      std::uint32_t worker;
      SlotHeader header;
      std::vector<std::byte> payload;
    };
    std::deque<Stashed> stash;
    std::size_t stash_bytes = 0;
    std::chrono::steady_clock::time_point start;
  };
  std::unique_ptr<Catchup> catchup_;  // set in Init
  AlignedBuffer death_slot_;          // ForwardDeath's record body (a SlotHeader)
  std::unique_ptr<transport::MemoryRegion> death_slot_mr_;

  // Apply thread only. apply_mu_ guards the shards' contents (behind
  // tables_[].memory, which the analysis does not see) against ReadLocal
  // and TEST_SetRow: ApplySlot requires it.
  std::vector<WorkerState> workers_;
  // Elastic membership (src/ps/membership.h); set in Init, then under apply_mu_.
  std::optional<internal::Membership> membership_;
  std::uint64_t control_version_ = 0;
  std::vector<ControlWorker> control_scratch_;  // PublishControl's
  std::vector<std::uint64_t> dirty_blocks_;     // ApplySlot's
  mutable Mutex apply_mu_;
  std::optional<internal::CheckpointCut> cut_;          // apply thread only (after Init)
  std::unique_ptr<internal::CheckpointWriter> writer_;  // when checkpoint_dir is set
  // Set by the writer thread, published in the control block.
  std::atomic<std::uint64_t> durable_plus1_{0};
  std::atomic<std::uint64_t> failed_plus1_{0};
  std::uint64_t published_ckpt_ = 0;                // apply thread: durable + failed last published
  std::atomic<std::uint64_t> trigger_requests_{0};  // RequestCheckpoint()s so far
  std::uint64_t triggers_seen_ = 0;                 // apply thread
  std::uint64_t own_cut_plus1_ = 0;                 // apply thread: ControlCheckpoint::cut_plus1
  std::chrono::steady_clock::time_point next_timed_{};  // apply thread: checkpoint_interval
  std::uint64_t restored_plus1_ = 0;     // apply thread after Init (a rewind changes it)
  std::uint64_t incarnation_ = 0;        // constant after Init
  std::string lineage_;                  // apply thread after Init (CheckpointLineage)
  std::uint64_t rewind_id_ = 0;          // apply thread: ControlCheckpoint::rewind_id
  std::atomic<std::uint64_t> epoch_{0};  // rewinds in place so far (ShardSnapshot::epoch)

  // Accept thread only.
  std::vector<std::unique_ptr<transport::Connection>> connections_;

  mutable Mutex mu_;
  std::condition_variable cv_;  // RunUntil waits on it: membership changed, or Stop()
  ServerStats stats_ RDMAPS_GUARDED_BY(mu_);
  std::vector<bool> seen_ RDMAPS_GUARDED_BY(mu_);  // worker connected at least once
  // Elastic, a promoted backup: when the members that have not connected
  // by then leave (DepartAbsentMembers). Apply thread only.
  std::optional<std::chrono::steady_clock::time_point> reconnect_by_;
  std::vector<bool> gone_ RDMAPS_GUARDED_BY(mu_);  // worker disconnected
  // When each worker disconnected without a goodbye (rejoin_timeout).
  std::vector<std::chrono::steady_clock::time_point> gone_at_ RDMAPS_GUARDED_BY(mu_);
  Status rewind_error_ RDMAPS_GUARDED_BY(mu_);  // a rewind that failed: Run returns it
  // Per worker, the PeerInfo::connection of its bootstrapped connection (0:
  // none yet). Written by the accept thread before the bootstrap write, read
  // by the apply thread per notification: a notification of any other
  // connection (one refused for a bad hello, one that claimed the id of
  // another worker) is never taken for that worker's.
  std::unique_ptr<std::atomic<std::uint64_t>[]> bound_;
  // Per worker, the hello of its bound connection (elastic mode: a live
  // slot is rebound only to the same Client, reconnecting after a failover).
  std::vector<internal::HelloMsg> bound_hello_ RDMAPS_GUARDED_BY(mu_);
  bool stopped_ RDMAPS_GUARDED_BY(mu_) = false;
  // The triggers ServeTriggers has served, and the clock of the cut that
  // serves them (CheckpointNow waits for it).
  std::uint64_t triggers_served_ RDMAPS_GUARDED_BY(mu_) = 0;
  std::uint64_t trigger_clock_ RDMAPS_GUARDED_BY(mu_) = 0;
  // A replacement's Init waits for the primary's answer (or a failure).
  bool rejoin_answered_ RDMAPS_GUARDED_BY(mu_) = false;
  Status rejoin_status_ RDMAPS_GUARDED_BY(mu_);

  std::atomic<bool> stop_{false};
  std::atomic<bool> test_paused_{false};  // TEST_PauseApply
  std::atomic<int> running_{0};           // background threads still in their loops
  // Serialises Stop(): a signal thread and the owner may both call it, and
  // joining one std::thread from two threads at once is undefined.
  Mutex stop_mu_;
  // Started by Init, joined by Stop() under stop_mu_.
  std::thread accept_thread_;
  std::thread apply_thread_;
};

Status ValidateServerOptions(const ServerOptions& o) {
  if (o.num_servers == 0) return InvalidArgumentError("ServerOptions.num_servers must be >= 1");
  if (o.server_index >= o.num_servers) {
    return InvalidArgumentError("ServerOptions.server_index " + std::to_string(o.server_index) +
                                " must be < num_servers " + std::to_string(o.num_servers));
  }
  if (o.num_workers == 0) return InvalidArgumentError("ServerOptions.num_workers must be >= 1");
  if (o.num_workers >= internal::kServerPeerBase) {
    return InvalidArgumentError("ServerOptions.num_workers is too large");
  }
  RDMAPS_RETURN_IF_ERROR(
      internal::ValidateMaxWorkers(o.num_workers, o.max_workers, "ServerOptions"));
  if (o.push_slots == 0) return InvalidArgumentError("ServerOptions.push_slots must be >= 1");
  if (o.push_slot_bytes % internal::kCacheLine != 0) {
    return InvalidArgumentError("ServerOptions.push_slot_bytes " +
                                std::to_string(o.push_slot_bytes) +
                                " must be a multiple of 64 (slots are cache-line aligned)");
  }
  RDMAPS_RETURN_IF_ERROR(internal::ValidateTables(o.tables));
  if (o.replicas != 1 && o.replicas != 2) {
    return InvalidArgumentError("ServerOptions.replicas " + std::to_string(o.replicas) +
                                " must be 1 or 2 (more copies are not built yet)");
  }
  if (o.log_busy_poll.count() < 0) {
    return InvalidArgumentError("ServerOptions.log_busy_poll " +
                                std::to_string(o.log_busy_poll.count()) +
                                " us is negative; use 0 to sleep at once");
  }
  if (o.replicas == 2 && o.failover == nullptr) {
    return InvalidArgumentError(
        "ServerOptions.replicas is 2 but ServerOptions.failover is not set: a replicated shard "
        "needs the shard map that decides failovers (rdmaps/failover.h)");
  }
  if (o.replica_role == ReplicaRole::kBackup && o.replicas != 2) {
    return InvalidArgumentError("ServerOptions.replica_role is kBackup but replicas is " +
                                std::to_string(o.replicas) + "; a backup needs replicas = 2");
  }
  if (o.replica_role == ReplicaRole::kPrimary && o.replicas == 2 && o.backup_address.empty()) {
    return InvalidArgumentError(
        "ServerOptions.replicas is 2 but backup_address is empty: start the backup first and "
        "give its Server::address()");
  }
  if (!o.rejoin_as_backup_of.empty() && o.replica_role != ReplicaRole::kBackup) {
    return InvalidArgumentError(
        "ServerOptions.rejoin_as_backup_of is set but replica_role is not kBackup: a "
        "replacement backup is started with replica_role = kBackup and replicas = 2");
  }
  if (o.tables.size() > (1u << 20) ||
      internal::DirectoryBytes(static_cast<std::uint32_t>(o.tables.size()),
                               internal::WorkerSlots(o)) > internal::kMaxDirectoryBytes) {
    return InvalidArgumentError("ServerOptions: " + std::to_string(o.tables.size()) +
                                " tables and " + std::to_string(o.num_workers) +
                                " workers make a directory larger than workers accept (" +
                                std::to_string(internal::kMaxDirectoryBytes) + " bytes)");
  }
  for (const TableOptions& t : o.tables) {
    if (internal::SlotRowCapacity(o.push_slot_bytes, t.dim, true) == 0 ||
        o.push_slot_bytes < sizeof(SlotHeader)) {
      return InvalidArgumentError("ServerOptions.push_slot_bytes " +
                                  std::to_string(o.push_slot_bytes) +
                                  " cannot hold one row of table '" + t.name + "' (dim " +
                                  std::to_string(t.dim) + "); raise it to at least " +
                                  std::to_string(sizeof(SlotHeader) + 8 + std::size_t{t.dim} * 4));
    }
  }
  return Status::OK();
}

Status ServerImpl::Init() {
  RDMAPS_RETURN_IF_ERROR(ValidateServerOptions(options_));
  if (options_.apply_threads > 0) {
    tbb_limit_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                       options_.apply_threads);
  }
  const bool backup = options_.replica_role == ReplicaRole::kBackup;
  RDMAPS_ASSIGN_OR_RETURN(
      endpoint_,
      transport::Endpoint::Create(internal::ToEndpointOptions(
          options_.transport,
          (backup ? internal::kBackupPeerBase : internal::kServerPeerBase) + options_.server_index,
          options_.listen_address)));
  {
    MutexLock lock(mu_);  // no other thread yet; for the analysis
    seen_.assign(slots_, false);
    gone_.assign(slots_, false);
    gone_at_.assign(slots_, {});
    bound_ = std::make_unique<std::atomic<std::uint64_t>[]>(slots_);
    bound_hello_.assign(slots_, internal::HelloMsg{});
    stats_.worker_clocks.assign(slots_, 0);
  }
  RDMAPS_RETURN_IF_ERROR(RegisterAll());
  if (backup) {
    log_receiver_ = std::make_unique<internal::LogReceiver>(
        endpoint_.get(), options_.server_index, internal::LogSlots(options_.push_slots),
        options_.push_slot_bytes, options_.failover);
    std::size_t registered = 0;
    RDMAPS_RETURN_IF_ERROR(log_receiver_->Register(&registered));
    MutexLock lock(mu_);
    stats_.registered_bytes += registered;
  }
  if (options_.replicas == 2) {
    // A backup has one too, unconnected: once promoted it may take a
    // replacement backup (re-protection).
    forwarded_seq_.assign(slots_, 0);
    log_sender_ = std::make_unique<internal::LogSender>(
        endpoint_.get(), options_.server_index, options_.push_slot_bytes,
        options_.transport.op_timeout, options_.log_busy_poll, options_.failover);
    if (!backup) {
      RDMAPS_RETURN_IF_ERROR(log_sender_->Connect(options_.backup_address,
                                                  DeadlineAfter(options_.transport.op_timeout)));
    }
    // ForwardDeath's record body (a backup needs it once promoted).
    death_slot_ = internal::AllocateRegionMemory(sizeof(SlotHeader));
    if (!death_slot_) return ResourceExhaustedError("allocating the log's death record failed");
    RDMAPS_ASSIGN_OR_RETURN(
        death_slot_mr_,
        endpoint_->Register(death_slot_.get(), sizeof(SlotHeader), transport::kAccessNone));
  }
  incarnation_ =
      (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}() ^
      static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  cut_.emplace(slots_, options_.checkpoint_every);
  if (!options_.restore.empty()) RDMAPS_RETURN_IF_ERROR(Restore());
  membership_.emplace(slots_, options_.num_workers, options_.max_workers != 0,
                      options_.server_index, restored_plus1_ == 0 ? 0 : restored_plus1_ - 1);
  if (lineage_.empty())
    lineage_ = internal::CheckpointLineage(options_.transport.job_token, "", {});
  if (!options_.checkpoint_dir.empty()) {
    writer_ = std::make_unique<internal::CheckpointWriter>(
        options_.checkpoint_dir, options_.checkpoint_keep,
        [this](const internal::ShardSnapshot& snap, const Status& st) {
          if (snap.epoch != epoch_.load()) return;  // of the run before a rewind
          const std::uint64_t clock = snap.clock;
          std::atomic<std::uint64_t>& word = st.ok() ? durable_plus1_ : failed_plus1_;
          std::uint64_t cur = word.load();
          while (cur < clock + 1 && !word.compare_exchange_weak(cur, clock + 1)) {
          }
          // The apply thread publishes it within its 200 ms idle wake-up.
          NotifyCheckpoint();
        });
  }
  {
    MutexLock apply_lock(apply_mu_);  // no other thread yet; for the analysis
    PublishControl();
  }
  RDMAPS_ASSIGN_OR_RETURN(address_, endpoint_->Listen(options_.listen_address));
  if (log_receiver_) {
    log_receiver_->set_self(address_);
    log_sender_->SetAlone(address_, 0);  // (serving nothing until promoted)
    if (!options_.rejoin_as_backup_of.empty()) RDMAPS_RETURN_IF_ERROR(StartRejoin());
    RDMAPS_ASSIGN_OR_RETURN(primary_watch_,
                            options_.failover->WatchPrimary(options_.server_index, [this] {
                              if (!killed_.load()) log_receiver_->CloseConnection();
                            }));
  } else if (log_sender_) {
    RDMAPS_RETURN_IF_ERROR(log_sender_->Register(address_, options_.backup_address));
  }
  running_.store(2);
  accept_thread_ = std::thread([this] {
    AcceptLoop();
    --running_;
  });
  apply_thread_ = std::thread([this] {
    ApplyLoop();
    --running_;
  });
  RDMAPS_LOG(INFO) << "ps server " << options_.server_index << "/" << options_.num_servers
                   << " listening on " << address_ << " (" << endpoint_->kind() << "), "
                   << options_.tables.size() << " tables, " << options_.num_workers << " workers, "
                   << stats().registered_bytes << " bytes registered";
  if (catchup_) {
    // A replacement: started once the primary took it (the copy and the
    // catch-up go on in the background; the shard map names it once done).
    const Deadline deadline = DeadlineAfter(options_.transport.op_timeout);
    MutexLock lock(mu_);
    while (!rejoin_answered_) {
      if (cv_.wait_until(lock.native(), deadline) == std::cv_status::timeout && !rejoin_answered_) {
        return TimedOutError("ps server " + std::to_string(options_.server_index) +
                             ": the primary at " + options_.rejoin_as_backup_of +
                             " did not answer the replacement backup within op_timeout");
      }
    }
    if (!rejoin_status_.ok()) return rejoin_status_;
  }
  return Status::OK();
}

Status ServerImpl::RegisterAll() {
  std::size_t registered = 0;
  auto alloc_register = [&](std::size_t bytes, std::uint32_t access, const std::string& what,
                            AlignedBuffer* buf,
                            std::unique_ptr<transport::MemoryRegion>* mr) -> Status {
    *buf = internal::AllocateRegionMemory(bytes);
    if (*buf == nullptr) {
      return ResourceExhaustedError("allocating " + std::to_string(bytes) + " bytes for " + what +
                                    " failed: out of memory; use fewer/smaller tables or more "
                                    "servers");
    }
    auto r = endpoint_->Register(buf->get(), bytes, access);
    if (!r.ok()) return r.status().WithContext("registering " + what);
    *mr = std::move(r).value();
    registered += bytes;
    return Status::OK();
  };

  const std::uint32_t S = options_.num_servers, W = slots_;
  tables_.resize(options_.tables.size());
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    TableState& t = tables_[i];
    t.options = options_.tables[i];
    t.shard = internal::PartitionOf(t.options.rows, S, options_.server_index);
    const std::uint32_t layout = internal::ResolveRowLayout(
        static_cast<std::uint32_t>(t.options.layout), t.options.rows, t.options.dim, S);
    t.geometry =
        internal::ShardGeometryOf(layout, t.options.rows, t.options.dim, S, options_.server_index);
    t.optimizer.emplace(t.options.optimizer, t.options.dim);
    table_index_[t.options.id] = i;
    RDMAPS_RETURN_IF_ERROR(alloc_register(t.geometry.bytes, transport::kRemoteRead,
                                          "shard of table '" + t.options.name + "'", &t.memory,
                                          &t.mr));
    const std::size_t sf = t.optimizer->state_floats();
    t.state.assign(t.shard.count * sf, 0.0f);
    for (std::uint64_t r = 0; r < t.shard.count; ++r) {
      internal::InitRow(t.options.init, t.options.id, t.shard.begin + r, t.data(r), t.options.dim);
      if (sf > 0) t.optimizer->InitState(t.state.data() + r * sf);
    }
    for (std::uint64_t b = 0; b < t.geometry.blocks(); ++b) t.Seal(b);
  }
  RDMAPS_RETURN_IF_ERROR(alloc_register(internal::ControlBlockBytes(W), transport::kRemoteRead,
                                        "control block", &control_, &control_mr_));
  RDMAPS_RETURN_IF_ERROR(alloc_register(internal::kAtomicsBytes,
                                        transport::kRemoteRead | transport::kRemoteAtomic,
                                        "barrier counter", &atomics_, &atomics_mr_));
  rings_.resize(W);
  ring_mrs_.resize(W);
  const std::size_t ring_bytes = std::size_t{options_.push_slots} * options_.push_slot_bytes;
  for (std::uint32_t w = 0; w < W; ++w) {
    RDMAPS_RETURN_IF_ERROR(alloc_register(ring_bytes, transport::kRemoteWrite,
                                          "push ring of worker " + std::to_string(w), &rings_[w],
                                          &ring_mrs_[w]));
  }
  // Directory.
  internal::Directory dir;
  internal::DirectoryHeader& h = dir.header;
  h.magic = internal::kDirectoryMagic;
  h.layout_version = internal::kLayoutVersion;
  h.server_index = options_.server_index;
  h.num_servers = S;
  h.num_workers = W;
  h.ring_slots = options_.push_slots;
  h.slot_bytes = options_.push_slot_bytes;
  h.control = Wire(*control_mr_);
  h.atomics = Wire(*atomics_mr_);
  for (const TableState& t : tables_) {
    dir.tables.push_back(internal::DirectoryEntry(t.options, t.shard, t.geometry, Wire(*t.mr)));
  }
  for (std::uint32_t w = 0; w < W; ++w) dir.rings.push_back(Wire(*ring_mrs_[w]));
  RDMAPS_RETURN_IF_ERROR(alloc_register(internal::EncodedBytes(dir), transport::kRemoteRead,
                                        "directory", &directory_, &directory_mr_));
  internal::EncodeDirectory(dir, directory_.get());
  // Bootstrap message, sent from registered memory.
  RDMAPS_RETURN_IF_ERROR(alloc_register(sizeof(internal::BootstrapMsg), transport::kAccessNone,
                                        "bootstrap message", &boot_msg_, &boot_msg_mr_));
  internal::BootstrapMsg b{};
  b.magic = internal::kBootstrapMagic;
  b.server_index = options_.server_index;
  b.directory = Wire(*directory_mr_);
  std::memcpy(boot_msg_.get(), &b, sizeof(b));
  MutexLock lock(mu_);
  stats_.registered_bytes += registered;
  return Status::OK();
}

void ServerImpl::AcceptLoop() {
  while (!stop_.load()) {
    if (log_sender_ && log_sender_->fenced() && !connections_.empty()) {
      // Superseded: the workers go to the new primary.
      for (auto& c : connections_) c->Close();
      connections_.clear();
    }
    auto r = endpoint_->Accept(DeadlineAfter(std::chrono::milliseconds(200)));
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kTimedOut && !stop_.load()) {
        RDMAPS_LOG(WARNING) << "ps server " << options_.server_index
                            << ": accept failed: " << r.status();
      }
      continue;
    }
    std::unique_ptr<transport::Connection> conn = std::move(r).value();
    if (log_receiver_ && log_receiver_->MaybeAccept(conn)) continue;
    if (MaybeAcceptRejoin(conn)) continue;
    if (!Serving() && !(log_receiver_ && !killed_.load() &&
                        log_receiver_->WaitServing(DeadlineAfter(std::chrono::seconds(10))))) {
      RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << ": refusing "
                          << conn->peer().address << ": this "
                          << (log_receiver_ ? "backup has not been promoted"
                                            : "primary is fenced (a backup took over)");
      continue;
    }
    const transport::PeerInfo& peer = conn->peer();
    internal::HelloMsg hello{};
    if (peer.user_data.size() != sizeof(hello)) {
      RDMAPS_LOG(WARNING) << "ps server: rejecting " << peer.address
                          << ": handshake carries no rdmaps hello (not an rdmaps worker?)";
      continue;
    }
    std::memcpy(&hello, peer.user_data.data(), sizeof(hello));
    const std::uint64_t need =
        (std::uint64_t{options_.server_index} + 1) * internal::kBootstrapSlotBytes;
    if (hello.magic != internal::kHelloMagic || hello.worker_id >= slots_ ||
        hello.boot_length < need || peer.peer_id != hello.worker_id) {
      RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << ": rejecting " << peer.address
                          << ": bad hello (worker id " << hello.worker_id << ", job has " << slots_
                          << " worker slots; check --num_workers and --max_workers on "
                          << "both sides)";
      continue;
    }
    // Bound, and counted as connected, before the bootstrap write: the
    // worker's first push, or its disconnect (a worker that finds its tables
    // do not match leaves at once), may follow the write at once, and must
    // find it a member. Both change under mu_, which the apply loop holds
    // when it checks a disconnect's connection, so a disconnect is either
    // before this (of the old connection) or after it (of this one).
    const std::uint32_t w = hello.worker_id;
    std::uint64_t previous = 0;
    internal::HelloMsg previous_hello{};
    bool was_seen = false, was_gone = false, was_died = false;
    std::vector<std::uint32_t> was_dead;
    {
      MutexLock apply_lock(apply_mu_);  // (before mu_, as in the apply loop)
      if (membership_->elastic()) {
        // Elastic: a slot is taken by one live worker at a time, and a
        // worker that left is replaced by a fresh one (its ring from seq 1,
        // published before the bootstrap lets it read the control block).
        bool live = false, seen = false, same = false;
        {
          MutexLock lock(mu_);
          seen = seen_[w];
          live = seen && !gone_[w];
          // The same Client reconnecting after a failover elsewhere
          // (ClientOptions::failover reconnects every server, and closes
          // the old connection only after the new one is bootstrapped): its
          // hello names the same bootstrap region as the bound one's.
          same = live && bound_hello_[w].boot_addr == hello.boot_addr &&
                 bound_hello_[w].boot_rkey == hello.boot_rkey &&
                 bound_hello_[w].boot_length == hello.boot_length;
        }
        if (live && !same) {
          RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << ": rejecting "
                              << peer.address << ": worker slot " << w
                              << " is held by a live worker; give the new one a free id";
          continue;
        }
        // (A slot this server learned of only through its primary's log or
        // a re-protection's snapshot was never seen here, but has the old
        // worker's words all the same.)
        const bool used = seen || workers_[w].next_seq != 1 || workers_[w].done;
        if (membership_->free(w) && used) {
          // Slots of the old worker a cut still held were never applied,
          // so never acknowledged: they go with it.
          workers_[w] = WorkerState{};
          cut_->Forget(w);
          // The new worker's slots from seq 1 go to the backup too.
          if (log_sender_) forwarded_seq_[w] = 0;
          PublishControl();
        }
      }
      // A worker whose earlier connection dropped is back (e.g. a recovery
      // attempt that gave up, then one that works): its control words must
      // stop saying it died now, not at its first slot, or a peer waiting
      // on it meanwhile gives up on it.
      was_died = workers_[w].died;
      if (was_died) {
        workers_[w].died = false;
        PublishControl();
      }
      MutexLock lock(mu_);
      previous = bound_[w].exchange(peer.connection);
      previous_hello = bound_hello_[w];
      bound_hello_[w] = hello;
      was_seen = seen_[w];
      was_gone = gone_[w];
      was_dead = stats_.dead_workers;
      if (was_seen && !membership_->elastic()) {
        RDMAPS_LOG(WARNING) << "ps server: worker " << w << " connected again";
      }
      // A worker whose earlier connection ended (e.g. an attempt to
      // reconnect after a restart that gave up) is back: not dead, not gone.
      gone_[w] = false;
      std::erase(stats_.dead_workers, w);
      seen_[w] = true;
    }
    const transport::Op op = transport::Op::WriteWithImm(
        boot_msg_.get(), boot_msg_mr_.get(), sizeof(internal::BootstrapMsg),
        hello.boot_addr + std::uint64_t{options_.server_index} * internal::kBootstrapSlotBytes,
        hello.boot_rkey, internal::kBootstrapImm | options_.server_index);
    Status s = conn->Post({&op, 1});
    if (s.ok()) {
      transport::Completion c;
      auto waited = conn->Wait({&c, 1}, DeadlineAfter(std::chrono::seconds(10)));
      if (!waited.ok()) {
        s = waited.status();
      } else if (*waited == 0) {
        s = TimedOutError("no completion for the bootstrap write within 10 s");
      } else {
        s = c.status;
      }
    }
    if (!s.ok()) {
      // Never bootstrapped: as if this connection had not come. Whatever
      // the apply loop did for it in between is undone with it.
      {
        MutexLock apply_lock(apply_mu_);
        {
          MutexLock lock(mu_);
          bound_[w].store(previous);
          bound_hello_[w] = previous_hello;
          seen_[w] = was_seen;
          gone_[w] = was_gone;
          stats_.dead_workers = std::move(was_dead);
        }
        if (was_died) {  // (no slot can have come: it was never bootstrapped)
          workers_[w].died = true;
          PublishControl();
        }
      }
      RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << ": bootstrap of worker " << w
                          << " failed: " << s;
      continue;
    }
    {
      MutexLock lock(mu_);
      ++stats_.workers_connected;
    }
    RDMAPS_LOG(VERBOSE) << "ps server " << options_.server_index << ": worker " << hello.worker_id
                        << " connected from " << peer.address;
    connections_.push_back(std::move(conn));
    cv_.notify_all();
  }
}

void ServerImpl::ApplyRow(TableState& t, std::uint64_t local, const float* grad) {
  const std::size_t sf = t.optimizer->state_floats();
  t.optimizer->Apply(t.data(local), sf ? t.state.data() + local * sf : nullptr, grad);
}

bool ServerImpl::ApplySlot(std::uint32_t w, const SlotHeader& h, const std::byte* payload) {
  WorkerState& ws = workers_[w];
  const auto kind = static_cast<SlotKind>(h.kind);
  if (kind == SlotKind::kClock) {
    if (membership_->joined(w) && h.clock <= ws.clock) return true;  // started above it here
    if (h.clock != ws.clock + 1) return false;
    ws.clock = h.clock;
    cut_->OnClock(w, ws.clock);
    MutexLock lock(mu_);
    ++stats_.clocks_applied;
    return true;
  }
  if (kind == SlotKind::kBye) {
    membership_->Leave(w, false, ws.clock);
    ws.done = true;
    return true;
  }
  if (kind == SlotKind::kJoin) {
    std::uint64_t members_min = 0;
    bool any = false;
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      if (i == w || workers_[i].done || !membership_->member(static_cast<std::uint32_t>(i))) {
        continue;
      }
      members_min = any ? std::min(members_min, workers_[i].clock) : workers_[i].clock;
      any = true;
    }
    const std::optional<std::uint64_t> start = membership_->Join(w, h.clock, members_min);
    if (!start) return false;
    ws.clock = *start;
    cut_->OnJoin(w, ws.clock);
    return true;
  }
  if (kind == SlotKind::kBarrier) {
    // Elastic workers, and fixed ones with ClientOptions::failover.
    membership_->Barrier(w, h.clock);
    MutexLock lock(mu_);
    ++stats_.barrier_arrivals;
    return true;
  }
  if (kind == SlotKind::kCheckpoint) {
    if (h.clock != ws.clock) return false;
    std::vector<std::uint64_t> clocks(workers_.size());
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      clocks[i] = workers_[i].done || !membership_->member(static_cast<std::uint32_t>(i))
                      ? internal::kClockDone
                      : workers_[i].clock;
    }
    if (options_.checkpoint_dir.empty() || !cut_->OnRequest(w, h.clock, clocks)) {
      RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << ": worker " << w
                          << " asked for a checkpoint at clock " << h.clock
                          << (options_.checkpoint_dir.empty()
                                  ? ", but this server has no --checkpoint_dir"
                                  : ", which another worker has passed already (every worker "
                                    "must call Checkpoint() at the same clock)");
      std::uint64_t cur = failed_plus1_.load();
      while (cur < h.clock + 1 && !failed_plus1_.compare_exchange_weak(cur, h.clock + 1)) {
      }
    }
    return true;
  }
  if (kind == SlotKind::kRewind) {
    Rewind(w, h.clock, h.first_row);
    return true;
  }
  if (kind == SlotKind::kCut) {
    // Relayed by the worker from a server that chose it (ServeTriggers)
    // before the worker passed it: no worker can be past it here.
    if (options_.checkpoint_dir.empty()) return true;  // nothing to write: no hold
    std::vector<std::uint64_t> clocks(workers_.size());
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      clocks[i] = workers_[i].done ? internal::kClockDone : workers_[i].clock;
    }
    if (!cut_->Add(h.clock, clocks)) {
      RDMAPS_LOG(ERROR) << "ps server " << options_.server_index << ": worker " << w
                        << " relayed a cut at clock " << h.clock
                        << " that a worker has passed here already; not taken";
      std::uint64_t cur = failed_plus1_.load();
      while (cur < h.clock + 1 && !failed_plus1_.compare_exchange_weak(cur, h.clock + 1)) {
      }
    }
    return true;
  }
  if (kind != SlotKind::kRange && kind != SlotKind::kRows) return false;
  auto it = table_index_.find(h.table);
  if (it == table_index_.end()) return false;
  TableState& t = tables_[it->second];
  const std::uint32_t dim = t.options.dim;
  // Every number of the slot is the worker's: checked (without wrapping)
  // before any of it is used.
  const internal::SlotTable target{t.shard, dim, options_.push_slot_bytes};
  if (internal::CheckDataSlot(h, {payload, options_.push_slot_bytes - sizeof(SlotHeader)},
                              target) != nullptr) {
    return false;
  }
  if (kind == SlotKind::kRange) {
    const auto* g = reinterpret_cast<const float*>(payload);
    const std::uint64_t first = h.first_row - t.shard.begin;
    const std::uint64_t end = first + h.num_rows;
    const internal::ShardGeometry& geo = t.geometry;
    // Block by block: its rows, then its header, so a block is unreadable
    // (torn) only while its own rows change.
    auto apply_blocks = [&](std::uint64_t b0, std::uint64_t b1) {
      for (std::uint64_t b = b0; b < b1; ++b) {
        const std::uint64_t lo = std::max(first, geo.first_row(b));
        const std::uint64_t hi = std::min(end, geo.end_row(b));
        for (std::uint64_t r = lo; r < hi; ++r) ApplyRow(t, r, g + (r - first) * dim);
        t.Seal(b);
      }
    };
    const std::uint64_t b0 = geo.block_of(first), b1 = geo.block_of(end - 1) + 1;
    if (std::size_t{h.num_rows} * dim >= kParallelFloats && b1 - b0 > 1) {
      tbb::parallel_for(
          tbb::blocked_range<std::uint64_t>(b0, b1),
          [&](const tbb::blocked_range<std::uint64_t>& r) { apply_blocks(r.begin(), r.end()); });
    } else {
      apply_blocks(b0, b1);
    }
  } else {
    std::vector<std::uint64_t> ids(h.num_rows);
    std::memcpy(ids.data(), payload, ids.size() * 8);  // (CheckDataSlot checked them)
    const auto* g = reinterpret_cast<const float*>(payload + ids.size() * 8);
    // Sequential: ids may repeat, and each occurrence is its own step. Then
    // each block touched is sealed once.
    std::vector<std::uint64_t>& blocks = dirty_blocks_;
    blocks.clear();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::uint64_t local = ids[i] - t.shard.begin;
      ApplyRow(t, local, g + i * dim);
      blocks.push_back(t.geometry.block_of(local));
    }
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    for (std::uint64_t b : blocks) t.Seal(b);
  }
  MutexLock lock(mu_);
  ++stats_.pushes_applied;
  stats_.rows_applied += h.num_rows;
  return true;
}

void ServerImpl::PublishControl() {
  const std::uint32_t W = slots_;
  ControlHead head{};
  head.num_workers = W;
  control_scratch_.resize(W);
  for (std::uint32_t w = 0; w < W; ++w) {
    ControlWorker& cw = control_scratch_[w];
    cw.applied_seq = workers_[w].next_seq - 1;
    membership_->Fill(
        w, workers_[w].done ? internal::kClockDone : workers_[w].clock,
        static_cast<std::uint32_t>(workers_[w].done   ? internal::WorkerLiveness::kClosed
                                   : workers_[w].died ? internal::WorkerLiveness::kDied
                                                      : internal::WorkerLiveness::kActive),
        &cw);
  }
  head.min_clock = membership_->MinClock(control_scratch_);
  head.floor_clock = membership_->floor();
  head.membership_epoch = membership_->epoch();
  head.members = membership_->members();
  head.flags = membership_->elastic() ? internal::kControlElastic : 0;
  {
    // Stats first: once a worker can read the new block, stats() shows at
    // least as much.
    MutexLock lock(mu_);
    stats_.min_clock = head.min_clock;
    stats_.membership_epoch = head.membership_epoch;
    stats_.members = head.members;
    for (std::uint32_t w = 0; w < W; ++w) stats_.worker_clocks[w] = control_scratch_[w].clock;
  }
  std::byte* payload = control_.get() + sizeof(BlockHeader);
  std::memcpy(payload, &head, sizeof(head));
  std::memcpy(payload + sizeof(ControlHead), control_scratch_.data(), W * sizeof(ControlWorker));
  internal::ControlCheckpoint ck{};
  ck.durable_plus1 = durable_plus1_.load();
  ck.failed_plus1 = failed_plus1_.load();
  ck.restored_plus1 = restored_plus1_;
  ck.incarnation = incarnation_;
  ck.cut_plus1 = own_cut_plus1_;
  ck.rewind_id = rewind_id_;
  published_ckpt_ = ck.durable_plus1 + ck.failed_plus1;
  std::memcpy(payload + internal::ControlCheckpointOffset(W), &ck, sizeof(ck));
  internal::ControlReplica rep{};
  // (A backup's sender serves nothing until it is promoted; a candidate
  // is not a copy yet.)
  const bool backup_waiting = log_receiver_ && !log_receiver_->serving();
  rep.epoch = backup_waiting ? log_receiver_->epoch() : log_sender_ ? log_sender_->epoch() : 0;
  rep.replicas =
      backup_waiting || (log_sender_ && !log_sender_->alone() && !log_sender_->candidate()) ? 2 : 1;
  rep.serving = Serving() ? 1 : 0;
  std::memcpy(payload + internal::ControlReplicaOffset(W), &rep, sizeof(rep));
  internal::SealBlock(control_.get(), ++control_version_, internal::ControlPayloadBytes(W));
}

void ServerImpl::ApplyLoop() {
  std::vector<transport::Notification> batch(256);
  while (!stop_.load()) {
    auto r = endpoint_->WaitNotifications(
        batch, DeadlineAfter(std::chrono::milliseconds(CatchupBusy() ? 0 : 200)));
    if (!r.ok()) {
      if (!stop_.load()) RDMAPS_LOG(WARNING) << "ps server: WaitNotifications: " << r.status();
      continue;
    }
    if (*r == 0) {
      // Idle: an abandoned cut or a checkpoint made durable still gets out.
      MutexLock apply_lock(apply_mu_);
      ServeTriggers();
      AdvanceCut();
      if (log_sender_) ServeRejoin();
      if (catchup_) CatchupStep();
      if (reconnect_by_) DepartAbsentMembers();
      if (durable_plus1_.load() + failed_plus1_.load() != published_ckpt_) PublishControl();
      continue;
    }
    while (test_paused_.load() && !stop_.load()) {  // TEST_PauseApply: hold the batch
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    bool membership_changed = false;
    std::size_t since_publish = 0;  // slots applied since the last PublishControl
    {
      MutexLock apply_lock(apply_mu_);
      const std::size_t covered = log_sender_ ? PreForward({batch.data(), *r}) : 0;
      for (std::size_t i = 0; i < *r; ++i) {
        const transport::Notification& n = batch[i];
        const std::uint32_t w = n.peer_id;
        if (log_receiver_ && log_receiver_->Owns(n)) {
          HandleLog(n);
          continue;
        }
        if (log_sender_ && n.peer_id == internal::kBackupPeerBase + options_.server_index) {
          OnBackupNotification(n);
          continue;
        }
        if (w >= slots_) {
          RDMAPS_LOG_EVERY_N(WARNING, 100)
              << "ps server: notification from unknown peer " << n.peer_id;
          MutexLock lock(mu_);
          ++stats_.protocol_errors;
          continue;
        }
        // (Within what PreForward covered, as it decided: the slots the
        // backup got are the slots applied here, in the same order.)
        // (A disconnect is not one of them: PreForward skips it, and it is
        // checked against the binding now, like any outside the cover.)
        const bool covered_slot =
            i < covered && n.kind == transport::Notification::Kind::kImmediate;
        if (covered_slot ? !prebound_[i] : n.connection != bound_[w].load()) {
          // Not the connection this worker bootstrapped on: a refused or
          // stale one that claimed its id. Never the worker's push or death.
          RDMAPS_LOG_EVERY_T(WARNING, 1.0)
              << "ps server " << options_.server_index << ": ignoring a "
              << (n.kind == transport::Notification::Kind::kDisconnected ? "disconnect"
                                                                         : "ring write")
              << " of a connection that claimed worker " << w
              << " but is not the one it bootstrapped on";
          MutexLock lock(mu_);
          ++stats_.unbound_notifications;
          continue;
        }
        if (n.kind == transport::Notification::Kind::kDisconnected) {
          bool left = false;  // an elastic member left by dying
          {
            MutexLock lock(mu_);
            // Checked again under mu_: the accept loop rebinds under it.
            if (n.connection != bound_[w].load()) {
              ++stats_.unbound_notifications;
              continue;
            }
            if (!gone_[w]) {
              gone_[w] = true;
              left = !workers_[w].done && membership_->elastic() && membership_->member(w);
              if (!workers_[w].done) membership_->Leave(w, true, workers_[w].clock);
              // (In the same stats() snapshot as dead_workers below.)
              stats_.members = membership_->members();
              stats_.membership_epoch = membership_->epoch();
              if (workers_[w].done) {
                ++stats_.workers_done;
              } else {
                // After a rewind in place an old session's end is expected:
                // its worker comes back (and others must not give up on it).
                // Where workers are expected back (rejoin_timeout), so is the
                // end of a connection that carried nothing but a kRewind, or
                // nothing: a recovery attempt that gave up (the next follows).
                const bool worked = n.connection == workers_[w].conn && !workers_[w].rewind_only;
                if (workers_[w].session_ok && (worked || options_.rejoin_timeout.count() == 0)) {
                  workers_[w].died = true;  // published below
                }
                stats_.dead_workers.push_back(w);
                gone_at_[w] = std::chrono::steady_clock::now();
                RDMAPS_LOG(WARNING)
                    << "ps server " << options_.server_index << ": worker " << w
                    << " disconnected without Close() (crashed or killed?) at clock "
                    << workers_[w].clock;
              }
              membership_changed = true;
            }
          }
          if (left && log_sender_) ForwardDeath(w);
          continue;
        }
        if (n.connection != workers_[w].conn) NewSession(w, n.connection, n.imm);
        // A slot PreForward posted is applied only once the backup holds
        // it. (Failed: fenced, HandleSlot applies nothing; or alone.)
        if (i < covered && held_index_[i] != 0) (void)log_sender_->WaitHeld(held_index_[i]);
        TakeSlot(w, n.imm);
        // A long batch republishes as it goes, so a pipelining worker gets
        // its credits (and a Flush its answer) before the batch ends.
        if (++since_publish == kPublishEverySlots) {
          PublishControl();
          since_publish = 0;
        }
      }
      ServeTriggers();
      AdvanceCut();
      // (Between batches: every slot forwarded has been applied.)
      if (log_sender_) ServeRejoin();
      if (catchup_) CatchupStep();
      if (reconnect_by_) DepartAbsentMembers();
      PublishControl();
    }
    {
      MutexLock lock(mu_);
      ++stats_.apply_batches;
    }
    if (membership_changed) cv_.notify_all();
  }
}

void ServerImpl::DepartAbsentMembers() {
  const auto now = std::chrono::steady_clock::now();
  if (!reconnect_by_ || now < *reconnect_by_) return;
  reconnect_by_.reset();
  std::vector<std::uint32_t> departed;
  {
    MutexLock lock(mu_);
    for (std::uint32_t w = 0; w < slots_; ++w) {
      // (A backup takes no worker before its promotion: seen_ means it
      // connected here since.)
      if (!membership_->member(w) || workers_[w].done || seen_[w]) continue;
      membership_->Leave(w, true, workers_[w].clock);  // logs the new epoch
      workers_[w].died = true;
      seen_[w] = true;
      gone_[w] = true;
      gone_at_[w] = now;
      stats_.dead_workers.push_back(w);
      departed.push_back(w);
      // (With dead_workers, in one stats() snapshot: PublishControl below
      // writes the same.)
      stats_.members = membership_->members();
      stats_.membership_epoch = membership_->epoch();
      RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << " (promoted at epoch "
                          << log_receiver_->epoch() << "): worker " << w
                          << " did not reconnect within "
                          << options_.failover_reconnect_window.count()
                          << " ms of the promotion (it died with the old primary?): it left "
                             "the job as dead at clock "
                          << workers_[w].clock << ", membership epoch " << membership_->epoch();
    }
  }
  if (departed.empty()) return;
  if (log_sender_) {
    for (std::uint32_t w : departed) ForwardDeath(w);  // a new backup learns it too
  }
  PublishControl();
  cv_.notify_all();
}

void ServerImpl::TakeSlot(std::uint32_t w, std::uint32_t imm) {
  // A slot on the worker's bound connection: it is back (it reconnected
  // after an earlier connection died), whatever that disconnect said.
  workers_[w].died = false;
  workers_[w].rewind_only = false;  // (Rewind sets it again for a kRewind)
  std::deque<std::uint32_t>& held = cut_->held()[w];
  if (cut_->Holding(w) || !held.empty()) {
    held.push_back(imm);  // at most push_slots: the worker has no more credits
    return;
  }
  HandleSlot(w, imm);
}

void ServerImpl::HandleSlot(std::uint32_t w, std::uint32_t imm) {
  WorkerState& ws = workers_[w];
  const std::uint64_t seq = ws.next_seq;
  const std::size_t slot = (seq - 1) % options_.push_slots;
  const std::byte* base = rings_[w].get() + slot * options_.push_slot_bytes;
  SlotHeader h;
  std::memcpy(&h, base, sizeof(h));
  const bool ok = imm == internal::ImmOfSeq(seq) && h.seq == seq;
  if (!ws.session_ok && ok && h.kind != static_cast<std::uint32_t>(SlotKind::kRewind)) {
    // A slot of w's session from before a rewind in place: consumed (its
    // credit comes back), never applied.
    RDMAPS_LOG_EVERY_N(WARNING, 100)
        << "ps server " << options_.server_index << ": dropping a push of worker " << w
        << " made before the rewind to clock " << ws.clock;
    ++ws.next_seq;
    return;
  }
  if (log_sender_ && log_sender_->fenced()) return;  // superseded: acknowledges nothing
  if (ok && log_sender_ && forwarded_seq_[w] < seq) {
    // Replicated: the backup holds the slot before any of it is applied
    // (and so before a worker can see it or its acknowledgement).
    if (!log_sender_->Forward(w, base, UsedBytes(h), ring_mrs_[w].get()).ok()) return;  // fenced
    forwarded_seq_[w] = seq;
    MutexLock lock(mu_);
    ++stats_.log_records;
  }
  if (!ok || !ApplySlot(w, h, base + sizeof(SlotHeader))) {
    // Forwarded and refused by both: a slot of this seq sent again is
    // forwarded again.
    if (log_sender_ && forwarded_seq_[w] >= seq) forwarded_seq_[w] = seq - 1;
    RDMAPS_LOG_EVERY_N(WARNING, 100)
        << "ps server " << options_.server_index
        << ": dropping malformed or out-of-sequence push from worker " << w << " (expected seq "
        << seq << ", slot says " << h.seq << ", imm " << imm << ")";
    MutexLock lock(mu_);
    ++stats_.protocol_errors;
    return;
  }
  ++ws.next_seq;
}

std::size_t ServerImpl::UsedBytes(const SlotHeader& h) const {
  auto it = table_index_.find(h.table);
  const std::uint32_t dim = it == table_index_.end() ? 0 : tables_[it->second].options.dim;
  return internal::UsedSlotBytes(h, dim, options_.push_slot_bytes);
}

std::size_t ServerImpl::PreForward(std::span<const transport::Notification> batch) {
  // Only where the apply order is known ahead: no cut holds a slot, and
  // up to the first slot that may change it (with checkpoint_dir, the
  // first that is not data: a Clock may arm a cut, a Checkpoint request
  // does), each later one forwarded by HandleSlot itself.
  if (log_sender_->alone() || log_sender_->fenced() || cut_->armed()) return 0;
  for (const auto& held : cut_->held()) {
    if (!held.empty()) return 0;
  }
  const std::uint32_t W = slots_;
  std::vector<internal::LogSender::Item>& items = forward_items_;
  items.clear();
  forward_next_.resize(W);
  for (std::uint32_t w = 0; w < W; ++w) forward_next_[w] = workers_[w].next_seq;
  prebound_.assign(batch.size(), false);
  held_index_.assign(batch.size(), 0);
  std::size_t covered = 0;
  for (; covered < batch.size(); ++covered) {
    const transport::Notification& n = batch[covered];
    if (n.kind != transport::Notification::Kind::kImmediate) continue;  // changes no order
    const std::uint32_t w = n.peer_id;
    if (w >= W) continue;
    prebound_[covered] = n.connection == bound_[w].load();
    if (!prebound_[covered]) continue;
    const std::uint64_t seq = forward_next_[w];
    const std::byte* base =
        rings_[w].get() + (seq - 1) % options_.push_slots * options_.push_slot_bytes;
    SlotHeader h;
    std::memcpy(&h, base, sizeof(h));
    const auto kind = static_cast<SlotKind>(h.kind);
    // Without checkpoint_dir (and every) no cut holds a slot (a Clock arms none,
    // a Checkpoint request or relayed cut is refused or ignored), so a
    // Clock, Bye, Barrier or Checkpoint slot changes no order either.
    const bool orderly =
        kind == SlotKind::kRange || kind == SlotKind::kRows ||
        (options_.checkpoint_dir.empty() && options_.checkpoint_every == 0 &&
         (kind == SlotKind::kClock || kind == SlotKind::kBye || kind == SlotKind::kBarrier ||
          kind == SlotKind::kCheckpoint || kind == SlotKind::kCut));
    if (n.imm != internal::ImmOfSeq(seq) || h.seq != seq || !orderly) break;
    items.push_back({w, base, UsedBytes(h), ring_mrs_[w].get()});
    held_index_[covered] = log_sender_->posted() + items.size();
    forward_next_[w] = seq + 1;
  }
  // Posted, not waited for: the loop applies each slot once the backup
  // holds it, while the later ones are still on their way.
  if (items.empty() || !log_sender_->Post(items).ok()) return 0;
  for (std::uint32_t w = 0; w < W; ++w) {
    if (forward_next_[w] > workers_[w].next_seq) forwarded_seq_[w] = forward_next_[w] - 1;
  }
  MutexLock lock(mu_);
  stats_.log_records += items.size();
  return covered;
}

// ---- Re-protection ----------------------------------------------------------------

std::size_t ServerImpl::SnapshotBytes() const {
  // The shards are in memory already: these sums cannot wrap.
  std::size_t bytes =
      sizeof(internal::RejoinSnapshotHead) + std::size_t{slots_} * sizeof(internal::RejoinWorker);
  for (const TableState& t : tables_) {
    bytes += t.shard.count * t.options.dim * sizeof(float) + t.state.size() * sizeof(float);
  }
  return bytes;
}

bool ServerImpl::MaybeAcceptRejoin(std::unique_ptr<transport::Connection>& conn) {
  const transport::PeerInfo& peer = conn->peer();
  internal::RejoinHello hello{};
  if (peer.user_data.size() != sizeof(hello)) return false;
  std::memcpy(&hello, peer.user_data.data(), sizeof(hello));
  if (hello.magic != internal::kRejoinHelloMagic) return false;
  const std::string me = "ps server " + std::to_string(options_.server_index);
  auto refuse = [&](const std::string& why) {
    RDMAPS_LOG(WARNING) << me << ": refusing the replacement backup from " << peer.address << ": "
                        << why;
    conn->Close();
    conn.reset();
    return true;
  };
  if (!log_sender_ || !Serving()) return refuse("this server is not the shard's serving primary");
  if (hello.shard != options_.server_index ||
      peer.peer_id != internal::kBackupPeerBase + hello.shard) {
    return refuse("it is a replacement for shard " + std::to_string(hello.shard));
  }
  auto in = std::make_unique<RejoinIn>();
  constexpr std::size_t kBoxBytes = sizeof(internal::RejoinOffer) + 128;
  in->box = internal::AllocateRegionMemory(kBoxBytes);
  const std::size_t snap_bytes = SnapshotBytes();
  in->snap = internal::AllocateRegionMemory(snap_bytes);
  if (!in->box || !in->snap) return refuse("out of memory for its snapshot");
  auto box_mr = endpoint_->Register(in->box.get(), kBoxBytes, transport::kRemoteWrite);
  auto snap_mr = endpoint_->Register(in->snap.get(), snap_bytes, transport::kRemoteRead);
  if (!box_mr.ok() || !snap_mr.ok()) {
    return refuse("registering its snapshot failed: " +
                  (box_mr.ok() ? snap_mr.status() : box_mr.status()).ToString());
  }
  in->box_mr = std::move(box_mr).value();
  in->snap_mr = std::move(snap_mr).value();
  // Its offer (its log ring and its address), READ one-sidedly.
  const transport::Op read =
      transport::Op::Read(in->box.get(), in->box_mr.get(), sizeof(internal::RejoinOffer),
                          hello.offer_addr, hello.offer_rkey);
  if (Status st = internal::PostAndWait(*conn, {&read, 1}, DeadlineAfter(std::chrono::seconds(10)));
      !st.ok()) {
    return refuse("reading its offer failed: " + st.ToString());
  }
  std::memcpy(&in->offer, in->box.get(), sizeof(in->offer));
  if (in->offer.magic != internal::kRejoinOfferMagic || in->offer.shard != options_.server_index ||
      in->offer.address_len == 0 || in->offer.address_len > sizeof(in->offer.address)) {
    return refuse("its offer is malformed");
  }
  in->hello = hello;
  in->conn = std::move(conn);
  MutexLock lock(mu_);
  if (rejoin_offer_) {
    in->conn->Close();
    RDMAPS_LOG(WARNING) << me << ": refusing a replacement backup: another one's offer is pending";
    return true;
  }
  rejoin_offer_ = std::move(in);
  return true;
}

void ServerImpl::ServeRejoin() {
  if (rejoin_serving_ && !log_sender_->candidate()) rejoin_serving_.reset();  // dropped
  std::unique_ptr<RejoinIn> in;
  {
    MutexLock lock(mu_);
    in = std::move(rejoin_offer_);
  }
  if (!in) return;
  using internal::RejoinRefusal;
  const std::string address(in->offer.address, in->offer.address_len);
  RejoinRefusal refusal = RejoinRefusal::kNone;
  if (!Serving()) {
    refusal = RejoinRefusal::kNotServing;
  } else if (!log_sender_->alone() || rejoin_serving_) {
    refusal = RejoinRefusal::kHasBackup;
  }
  const std::uint64_t index = log_sender_->forwarded();
  const auto start = std::chrono::steady_clock::now();
  if (refusal == RejoinRefusal::kNone) {
    // The snapshot: the state after log records 1..index, exactly (between
    // batches every slot forwarded has been applied and none other).
    std::byte* p = in->snap.get();
    internal::RejoinSnapshotHead head{};
    head.magic = internal::kRejoinSnapMagic;
    head.shard = options_.server_index;
    head.index = index;
    head.epoch = log_sender_->epoch();
    head.worker_slots = slots_;
    head.tables = static_cast<std::uint32_t>(tables_.size());
    head.bytes = SnapshotBytes();
    head.membership_epoch = membership_->epoch();
    head.elastic = membership_->elastic() ? 1 : 0;
    head.floor_clock = membership_->floor();
    std::memcpy(p, &head, sizeof(head));
    p += sizeof(head);
    for (std::uint32_t w = 0; w < slots_; ++w) {
      const internal::Membership::SlotImage m = membership_->Image(w);
      const internal::RejoinWorker rw{workers_[w].next_seq,
                                      workers_[w].clock,
                                      workers_[w].done ? 1u : 0u,
                                      workers_[w].died ? 1u : 0u,
                                      m.state,
                                      m.epoch,
                                      m.barriers,
                                      m.joined ? 1u : 0u,
                                      m.died ? 1u : 0u};
      std::memcpy(p, &rw, sizeof(rw));
      p += sizeof(rw);
    }
    for (const TableState& t : tables_) {
      const std::size_t rb = std::size_t{t.options.dim} * sizeof(float);
      if (!t.geometry.inline_headers()) {
        std::memcpy(p, t.data(0), t.shard.count * rb);
      } else {
        for (std::uint64_t r = 0; r < t.shard.count; ++r) std::memcpy(p + r * rb, t.data(r), rb);
      }
      p += t.shard.count * rb;
      if (!t.state.empty()) std::memcpy(p, t.state.data(), t.state.size() * sizeof(float));
      p += t.state.size() * sizeof(float);
    }
    if (!log_sender_->AttachCandidate(in->conn, in->offer.log, address).ok()) {
      refusal = RejoinRefusal::kBadOffer;
    } else {
      // Every later slot goes to the replacement, even one of a seq the
      // old backup had.
      for (std::uint32_t w = 0; w < slots_; ++w) forwarded_seq_[w] = workers_[w].next_seq - 1;
    }
  }
  internal::RejoinAnswer answer{};
  answer.magic = internal::kRejoinAnswerMagic;
  answer.refusal = static_cast<std::uint32_t>(refusal);
  answer.epoch = log_sender_->epoch();
  answer.index = index;
  answer.snapshot = Wire(*in->snap_mr);
  std::byte* msg = in->box.get() + sizeof(internal::RejoinOffer);
  std::byte* mailbox = msg + 96;
  answer.mailbox = {reinterpret_cast<std::uint64_t>(mailbox), 8, in->box_mr->rkey(), 0};
  std::memcpy(msg, &answer, sizeof(answer));
  const transport::Op op = transport::Op::WriteWithImm(
      msg, in->box_mr.get(), sizeof(answer), in->hello.offer_addr + sizeof(internal::RejoinOffer),
      in->hello.offer_rkey, internal::kLogBootImm);
  if (refusal != RejoinRefusal::kNone) {
    RDMAPS_LOG(WARNING) << "ps server " << options_.server_index
                        << ": refusing the replacement backup " << address << " (reason "
                        << answer.refusal << ")";
    (void)internal::PostAndWait(*in->conn, {&op, 1}, DeadlineAfter(options_.transport.op_timeout));
    in->conn->Close();
    return;
  }
  if (Status st = log_sender_->SendToCandidate({&op, 1}); !st.ok()) {
    log_sender_->DropCandidate(st.WithContext("sending its answer"));
    return;
  }
  RDMAPS_LOG(INFO)
      << "ps server " << options_.server_index << ": replacement backup " << address
      << " is copying a snapshot of " << SnapshotBytes() << " bytes at log index " << index
      << " (captured in "
      << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
      << " ms); the shard has one copy until it is in sync";
  rejoin_serving_ = std::move(in);
}

Status ServerImpl::StartRejoin() {
  const std::string me = "ps server " + std::to_string(options_.server_index);
  auto c = std::make_unique<Catchup>();
  c->region = internal::AllocateRegionMemory(internal::kRejoinRegionBytes);
  if (!c->region) return ResourceExhaustedError(me + ": allocating the rejoin offer failed");
  RDMAPS_ASSIGN_OR_RETURN(c->region_mr,
                          endpoint_->Register(c->region.get(), internal::kRejoinRegionBytes,
                                              transport::kRemoteRead | transport::kRemoteWrite));
  internal::RejoinOffer offer{};
  offer.magic = internal::kRejoinOfferMagic;
  offer.shard = options_.server_index;
  offer.log = log_receiver_->bootstrap();
  if (address_.size() > sizeof(offer.address)) {
    return InvalidArgumentError(me + ": its address " + address_ + " is longer than " +
                                std::to_string(sizeof(offer.address)) + " bytes");
  }
  offer.address_len = static_cast<std::uint32_t>(address_.size());
  std::memcpy(offer.address, address_.data(), address_.size());
  std::memcpy(c->region.get(), &offer, sizeof(offer));
  const internal::RejoinHello hello{internal::kRejoinHelloMagic, options_.server_index,
                                    reinterpret_cast<std::uint64_t>(c->region.get()),
                                    c->region_mr->rkey(), 0};
  transport::ConnectOptions copts;
  copts.user_data.resize(sizeof(hello));
  std::memcpy(copts.user_data.data(), &hello, sizeof(hello));
  const Deadline deadline = DeadlineAfter(options_.transport.op_timeout);
  std::unique_ptr<transport::Connection> conn;
  while (true) {
    auto r = endpoint_->Connect(options_.rejoin_as_backup_of, copts, deadline);
    if (r.ok()) {
      conn = std::move(r).value();
      break;
    }
    if (r.status().code() != StatusCode::kUnavailable ||
        std::chrono::steady_clock::now() >= deadline) {
      return r.status().WithContext(me + ": a replacement backup connecting to the primary at " +
                                    options_.rejoin_as_backup_of +
                                    " (is that the shard's primary?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c->start = std::chrono::steady_clock::now();
  log_receiver_->AttachPrimary(std::move(conn));
  catchup_ = std::move(c);
  return Status::OK();
}

bool ServerImpl::CatchupBusy() const {
  // (Apply thread; the copier's flag is atomic.)
  if (!catchup_) return false;
  const auto phase = catchup_->phase;
  return phase == Catchup::Phase::kApplying ||
         (phase == Catchup::Phase::kCopying && catchup_->copied.load() && !g_hold_catchup.load());
}

void ServerImpl::FailCatchup(const Status& why) {
  Catchup& c = *catchup_;
  if (c.phase == Catchup::Phase::kFailed) return;
  c.phase = Catchup::Phase::kFailed;
  c.stop.store(true);
  if (c.copier.joinable()) c.copier.join();
  c.stash.clear();
  RDMAPS_LOG(ERROR) << "ps server " << options_.server_index << ": re-protection from "
                    << options_.rejoin_as_backup_of << " failed: " << why
                    << "; this replacement is no copy of the shard (start another one)";
  log_receiver_->CloseConnection();
  {
    MutexLock lock(mu_);
    rejoin_answered_ = true;
    if (rejoin_status_.ok()) rejoin_status_ = why;
  }
  cv_.notify_all();
}

bool ServerImpl::CatchupLog(const transport::Notification& n) {
  Catchup& c = *catchup_;
  using Phase = Catchup::Phase;
  if (c.phase == Phase::kSynced) return false;
  if (c.phase == Phase::kFailed) return true;
  if (n.kind == transport::Notification::Kind::kDisconnected) {
    FailCatchup(
        UnavailableError("the primary's connection dropped before this replacement was in "
                         "sync (or the primary refused it)"));
    return true;
  }
  if (c.phase == Phase::kAwaitAnswer) {
    // The primary's first message on this connection is its answer.
    std::memcpy(&c.answer, c.region.get() + sizeof(internal::RejoinOffer), sizeof(c.answer));
    const internal::RejoinAnswer& a = c.answer;
    c.snap_bytes = SnapshotBytes();
    if (n.imm != internal::kLogBootImm || a.magic != internal::kRejoinAnswerMagic) {
      // (What came instead says where it went wrong: a log record's imm
      // is its index; a zero magic, an answer not yet visible.)
      char seen[80];
      std::snprintf(seen, sizeof(seen), " (imm 0x%08x of %u bytes, magic 0x%08x)", n.imm, n.length,
                    a.magic);
      FailCatchup(DataLossError(std::string("the primary's answer is malformed") + seen));
      return true;
    }
    if (a.refusal != 0) {
      const char* why = a.refusal == 1   ? "the shard has a backup (or another replacement)"
                        : a.refusal == 2 ? "it does not serve the shard"
                        : a.refusal == 3 ? "elastic jobs are not re-protected (an older primary)"
                                         : "the offer does not fit it";
      FailCatchup(FailedPreconditionError("the primary at " + options_.rejoin_as_backup_of +
                                          " refused this replacement: " + why));
      return true;
    }
    if (a.snapshot.length != c.snap_bytes || a.mailbox.length < 8) {
      FailCatchup(FailedPreconditionError(
          "the primary's snapshot is " + std::to_string(a.snapshot.length) +
          " bytes; this "
          "server's shards need " +
          std::to_string(c.snap_bytes) +
          " (the same tables, server_index, num_servers and worker slots on both?)"));
      return true;
    }
    c.snap = internal::AllocateRegionMemory(c.snap_bytes);
    auto mr = c.snap ? endpoint_->Register(c.snap.get(), c.snap_bytes, transport::kAccessNone)
                     : Result<std::unique_ptr<transport::MemoryRegion>>(
                           ResourceExhaustedError("out of memory for the snapshot copy"));
    if (!mr.ok()) {
      FailCatchup(mr.status());
      return true;
    }
    c.snap_mr = std::move(mr).value();
    log_receiver_->StartAt(a.epoch, a.index);
    c.phase = Phase::kCopying;
    // The copy: READs of the frozen snapshot, 8 MiB per round trip, on a
    // thread of its own (the apply thread keeps taking the log meanwhile).
    c.copier = std::thread([this, cp = &c] {
      constexpr std::size_t kChunk = std::size_t{1} << 20;
      Status st;
      std::vector<transport::Op> ops;
      for (std::size_t at = 0; at < cp->snap_bytes && st.ok();) {
        if (cp->stop.load()) {
          st = CancelledError("stopped");
          break;
        }
        ops.clear();
        for (int k = 0; k < 8 && at < cp->snap_bytes; ++k) {
          const std::size_t len = std::min(kChunk, cp->snap_bytes - at);
          ops.push_back(transport::Op::Read(cp->snap.get() + at, cp->snap_mr.get(), len,
                                            cp->answer.snapshot.addr + at,
                                            cp->answer.snapshot.rkey));
          at += len;
        }
        st = log_receiver_->SendToPrimary(ops, DeadlineAfter(options_.transport.op_timeout));
      }
      cp->copy_status = st;
      cp->copied.store(true);
    });
    {
      MutexLock lock(mu_);
      rejoin_answered_ = true;
    }
    cv_.notify_all();
    return true;
  }
  // Copying or applying the stash: the record waits in the stash (its
  // ring place goes back to the primary at once).
  internal::LogReceiver::Logged rec;
  if (!log_receiver_->Take(n.imm, &rec)) {
    MutexLock lock(mu_);
    ++stats_.protocol_errors;
    return true;
  }
  // As many payload bytes as the header says it uses (zeros past what the
  // primary sent), so that applying it reads nothing outside.
  const std::size_t want = UsedBytes(rec.header) - sizeof(SlotHeader);
  Catchup::Stashed s{rec.worker, rec.header, std::vector<std::byte>(want)};
  if (want > 0) {
    std::memcpy(s.payload.data(), rec.payload,
                std::min<std::size_t>(want, rec.bytes - sizeof(SlotHeader)));
  }
  log_receiver_->Release();
  c.stash_bytes += want + sizeof(s);
  c.stash.push_back(std::move(s));
  if (c.stash_bytes > internal::kMaxRejoinStashBytes) {
    FailCatchup(ResourceExhaustedError("more than " +
                                       std::to_string(internal::kMaxRejoinStashBytes) +
                                       " bytes of log arrived during the copy"));
  }
  return true;
}

void ServerImpl::CatchupStep() {
  Catchup& c = *catchup_;
  using Phase = Catchup::Phase;
  if (c.phase == Phase::kCopying) {
    if (!c.copied.load() || g_hold_catchup.load()) return;
    c.copier.join();
    if (!c.copy_status.ok()) {
      FailCatchup(c.copy_status.WithContext("copying the snapshot"));
      return;
    }
    if (Status st = LoadSnapshot(c.snap.get()); !st.ok()) {
      FailCatchup(st);
      return;
    }
    c.snap_mr.reset();
    c.snap.reset();
    c.phase = Phase::kApplying;
    MutexLock lock(mu_);
    stats_.catchup_bytes = c.snap_bytes;
  }
  if (c.phase != Phase::kApplying) return;
  // A bounded part of the stash per turn: the ring keeps draining.
  for (int k = 0; k < 256 && !c.stash.empty(); ++k) {
    Catchup::Stashed& s = c.stash.front();
    ApplyLogRecord(s.worker, s.header, s.payload.data());
    c.stash_bytes -= s.payload.size() + sizeof(s);
    c.stash.pop_front();
  }
  if (!c.stash.empty()) return;
  // In sync: every record the primary sent is applied; from now on each
  // is applied as it comes. The primary may count this server now.
  c.phase = Phase::kSynced;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
  {
    MutexLock lock(mu_);  // (before the primary can name this server)
    stats_.catchup_seconds = secs;
  }
  std::byte* word = c.region.get() + sizeof(internal::RejoinOffer) + 96;
  const std::uint64_t applied = log_receiver_->applied();
  std::memcpy(word, &applied, sizeof(applied));
  const transport::Op op =
      transport::Op::WriteWithImm(word, c.region_mr.get(), sizeof(applied), c.answer.mailbox.addr,
                                  c.answer.mailbox.rkey, internal::kRejoinSyncedImm);
  if (Status st =
          log_receiver_->SendToPrimary({&op, 1}, DeadlineAfter(options_.transport.op_timeout));
      !st.ok()) {
    c.phase = Phase::kApplying;  // (FailCatchup's precondition)
    FailCatchup(st.WithContext("telling the primary it is in sync"));
    return;
  }
  RDMAPS_LOG(INFO) << "ps server " << options_.server_index
                   << ": replacement backup in sync at log "
                   << "index " << applied << " after " << secs << " s (" << c.snap_bytes
                   << " bytes copied)";
}

Status ServerImpl::LoadSnapshot(const std::byte* snap) {
  // The primary's words: checked before they address anything.
  internal::RejoinSnapshotHead head;
  std::memcpy(&head, snap, sizeof(head));
  const internal::RejoinAnswer& a = catchup_->answer;
  if (head.magic != internal::kRejoinSnapMagic || head.shard != options_.server_index ||
      head.index != a.index || head.epoch != a.epoch || head.worker_slots != slots_ ||
      head.tables != tables_.size() || head.bytes != catchup_->snap_bytes ||
      head.elastic != (membership_->elastic() ? 1u : 0u)) {
    return DataLossError(
        "the primary's snapshot does not describe this shard (magic, shard, log "
        "index, worker slots, tables, size or elastic mode (max_workers) differ)");
  }
  const std::byte* p = snap + sizeof(head);
  std::vector<internal::RejoinWorker> ws(slots_);
  std::memcpy(ws.data(), p, ws.size() * sizeof(internal::RejoinWorker));
  p += ws.size() * sizeof(internal::RejoinWorker);
  std::vector<internal::Membership::SlotImage> members(slots_);
  for (std::uint32_t w = 0; w < slots_; ++w) {
    const internal::RejoinWorker& rw = ws[w];
    if (rw.next_seq == 0 || rw.done > 1 || rw.died > 1 || rw.joined > 1 || rw.left_died > 1) {
      return DataLossError("the snapshot's worker words are bad");
    }
    members[w] = {rw.member_state, rw.member_epoch, rw.barriers, rw.joined != 0, rw.left_died != 0};
  }
  if (!membership_->Load(members, head.membership_epoch, head.floor_clock)) {
    return DataLossError("the snapshot's membership is bad (a slot state out of range)");
  }
  for (std::uint32_t w = 0; w < slots_; ++w) {
    workers_[w].next_seq = ws[w].next_seq;
    workers_[w].clock = ws[w].clock;
    workers_[w].done = ws[w].done != 0;
    workers_[w].died = ws[w].died != 0;
  }
  {
    MutexLock lock(mu_);
    for (std::uint32_t w = 0; w < slots_; ++w) {
      if (workers_[w].died && std::find(stats_.dead_workers.begin(), stats_.dead_workers.end(),
                                        w) == stats_.dead_workers.end()) {
        stats_.dead_workers.push_back(w);
      }
    }
  }
  for (TableState& t : tables_) {
    const std::size_t rb = std::size_t{t.options.dim} * sizeof(float);
    if (!t.geometry.inline_headers()) {
      std::memcpy(t.data(0), p, t.shard.count * rb);
    } else {
      for (std::uint64_t r = 0; r < t.shard.count; ++r) std::memcpy(t.data(r), p + r * rb, rb);
    }
    p += t.shard.count * rb;
    if (!t.state.empty()) std::memcpy(t.state.data(), p, t.state.size() * sizeof(float));
    p += t.state.size() * sizeof(float);
    for (std::uint64_t b = 0; b < t.geometry.blocks(); ++b) t.Seal(b);
  }
  PublishControl();
  return Status::OK();
}

void ServerImpl::ForwardDeath(std::uint32_t w) {
  if (killed_.load() || log_sender_->fenced()) return;
  SlotHeader h{};
  h.kind = internal::kLogWorkerDied;
  h.clock = workers_[w].clock;
  std::memcpy(death_slot_.get(), &h, sizeof(h));
  if (!log_sender_->Forward(w, death_slot_.get(), sizeof(h), death_slot_mr_.get()).ok()) return;
  MutexLock lock(mu_);
  ++stats_.log_records;
}

bool ServerImpl::Serving() const {
  if (killed_.load()) return false;
  if (log_receiver_ && !log_receiver_->serving()) return false;
  return !(log_sender_ && log_sender_->fenced());
}

void ServerImpl::HandleLog(const transport::Notification& n) {
  if (catchup_ && CatchupLog(n)) return;  // a replacement not in sync yet
  if (n.kind == transport::Notification::Kind::kDisconnected) {
    if (log_receiver_->OnPrimaryLost()) {
      // Promoted: every member gets failover_reconnect_window to come here.
      if (membership_->elastic()) {
        reconnect_by_ = std::chrono::steady_clock::now() + options_.failover_reconnect_window;
      }
      log_sender_->SetAlone(address_, log_receiver_->epoch());  // (may take a replacement)
      PublishControl();
    }
    return;
  }
  internal::LogReceiver::Logged rec;
  if (!log_receiver_->Take(n.imm, &rec)) {
    MutexLock lock(mu_);
    ++stats_.protocol_errors;
    return;
  }
  ApplyLogRecord(rec.worker, rec.header, rec.payload);
  log_receiver_->Release();
}

void ServerImpl::ApplyLogRecord(std::uint32_t w, const SlotHeader& h, const std::byte* payload) {
  // What the primary's HandleSlot did with this slot, in its order.
  if (w < slots_ && h.kind == internal::kLogWorkerDied) {
    // The primary saw w's connection drop (ForwardDeath): w left, as there.
    if (!workers_[w].done && membership_->member(w)) {
      membership_->Leave(w, true, workers_[w].clock);
      workers_[w].died = true;
    }
    MutexLock lock(mu_);
    ++stats_.log_records;
    if (std::find(stats_.dead_workers.begin(), stats_.dead_workers.end(), w) ==
        stats_.dead_workers.end()) {
      stats_.dead_workers.push_back(w);
    }
    return;
  }
  if (w < slots_ && h.seq == 1 && workers_[w].next_seq != 1) {
    // A new session of w on the primary (NewSession's rule: its first slot
    // is seq 1), or in elastic mode a fresh worker in a slot that was left
    // (the accept loop's reset there).
    if (membership_->free(w)) {
      workers_[w] = WorkerState{};
      cut_->Forget(w);
    } else {
      workers_[w].next_seq = 1;
      cut_->held()[w].clear();
    }
  }
  bool ok = w < slots_ && h.seq == workers_[w].next_seq;
  if (ok && h.kind == static_cast<std::uint32_t>(SlotKind::kCheckpoint)) {
    // The primary's cut writes the checkpoint; a backup takes none (yet).
    ++workers_[w].next_seq;
  } else if (ok && ApplySlot(w, h, payload)) {
    ++workers_[w].next_seq;
  } else {
    MutexLock lock(mu_);
    ++stats_.protocol_errors;
  }
  {
    MutexLock lock(mu_);
    ++stats_.log_records;
  }
  // Pass a cut where the primary passed it: right after the record that
  // completed it, before the next one (a later kClock of a worker the
  // primary held until its capture). Once per batch would let such a record
  // move a worker past the cut first, and the cut would then wait out
  // checkpoint_timeout here - and hold the workers once this backup is
  // promoted (the fault matrix's checkpoint cell).
  if (cut_->armed()) AdvanceCut();
}

void ServerImpl::OnBackupNotification(const transport::Notification& n) {
  if (!log_sender_->Owns(n)) return;  // of a backup's connection closed before
  if (n.kind == transport::Notification::Kind::kDisconnected) {
    if (!killed_.load()) log_sender_->OnBackupDisconnected();
    return;
  }
  if (log_sender_->candidate() && n.imm == internal::kRejoinSyncedImm) {
    if (log_sender_->CandidateSynced().ok()) {
      MutexLock lock(mu_);
      ++stats_.reprotections;
    }
    rejoin_serving_.reset();  // the snapshot has been copied
  }
}

void ServerImpl::NewSession(std::uint32_t w, std::uint64_t connection, std::uint32_t imm) {
  WorkerState& ws = workers_[w];
  // A new Client starts its ring at seq 1; a Client that reconnected after
  // a failover (ClientOptions::failover) goes on with its sequence and
  // resends from the server's applied_seq + 1, which is never 1 here unless
  // nothing was applied. So a new session is one whose first slot is seq 1.
  SlotHeader first;
  std::memcpy(&first, rings_[w].get(), sizeof(first));
  if (ws.conn != 0 && imm == internal::ImmOfSeq(1) && first.seq == 1) {
    ws.next_seq = 1;
    cut_->held()[w].clear();
    if (log_sender_) forwarded_seq_[w] = 0;
  }
  ws.conn = connection;
}

void ServerImpl::Rewind(std::uint32_t w, std::uint64_t clock, std::uint64_t id) {
  workers_[w].session_ok = true;
  workers_[w].rewind_only = true;
  if (id == rewind_id_) return;  // this recovery's rewind is done: w knows
  const std::string path = options_.checkpoint_dir + "/" + internal::CheckpointName(clock);
  std::uint64_t loaded = 0;
  std::string lineage;
  Status st = options_.checkpoint_dir.empty()
                  ? FailedPreconditionError("this server has no --checkpoint_dir")
                  : LoadCheckpoint(path, &loaded, &lineage);
  if (!st.ok()) {
    // Half-loaded shards must never be served: this server ends (Run
    // returns the error), and its launcher restarts it from the checkpoint.
    RDMAPS_LOG(ERROR) << "ps server " << options_.server_index << ": cannot rewind to " << path
                      << " for worker " << w << ": " << st;
    {
      MutexLock lock(mu_);
      rewind_error_ = st.WithContext("rewinding in place to " + path);
      stopped_ = true;
    }
    cv_.notify_all();
    return;
  }
  for (std::uint32_t v = 0; v < workers_.size(); ++v) {
    workers_[v].clock = loaded;
    workers_[v].session_ok = v == w;
    workers_[v].died = false;  // every worker is expected back at `loaded`
    cut_->held()[v].clear();
  }
  cut_->SetCaptured(loaded);
  own_cut_plus1_ = 0;
  restored_plus1_ = loaded + 1;
  rewind_id_ = id;
  ++epoch_;
  durable_plus1_.store(loaded + 1);
  failed_plus1_.store(0);
  lineage_ = internal::CheckpointLineage(options_.transport.job_token, lineage, loaded);
  RDMAPS_LOG(INFO) << "ps server " << options_.server_index << " rewound in place to " << path
                   << " (clock " << loaded << ", asked by worker " << w << ")";
}

std::vector<internal::ShardView> ServerImpl::Views() {
  std::vector<internal::ShardView> views;
  for (TableState& t : tables_) {
    views.push_back({&t.options, t.shard, t.geometry, t.memory.get(), t.state.data(),
                     t.optimizer->state_floats()});
  }
  return views;
}

void ServerImpl::AdvanceCut() {
  while (cut_->armed()) {
    std::vector<bool> done(workers_.size());
    for (std::uint32_t w = 0; w < workers_.size(); ++w) {
      done[w] = workers_[w].done || !membership_->member(w);
    }
    const std::uint64_t clock = *cut_->armed();
    bool captured = false;
    if (cut_->Complete(done) && log_receiver_ && !log_receiver_->serving()) {
      // A backup writes no checkpoint: its primary writes this part, under
      // the same name in the same folder (two writers of one part corrupt
      // it). The cut is passed as the primary passes it.
      captured = true;
    } else if (cut_->Complete(done)) {
      // The last snapshot's memory, so that the copy runs at memcpy speed.
      auto snap = writer_ ? writer_->TakeSpare() : std::make_unique<internal::ShardSnapshot>();
      snap->clock = clock;
      snap->lineage = lineage_;
      snap->server_index = options_.server_index;
      snap->num_servers = options_.num_servers;
      snap->num_workers = options_.num_workers;
      snap->epoch = epoch_.load();
      const auto start = std::chrono::steady_clock::now();
      const std::vector<internal::ShardView> views = Views();
      snap->tables.resize(views.size());
      for (std::size_t i = 0; i < views.size(); ++i) {
        internal::CaptureTable(views[i], &snap->tables[i]);
      }
      RDMAPS_LOG(VERBOSE) << "ps server " << options_.server_index << ": checkpoint at clock "
                          << clock << " captured in "
                          << std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - start)
                                 .count()
                          << " ms";
      if (writer_) writer_->Submit(std::move(snap));
      captured = true;
    } else if (cut_->Overtaken(done)) {
      // (A worker's clock went past the cut unheld: see Overtaken.) It can
      // never be taken here; waiting for the timeout would hold every
      // worker that reaches it.
      RDMAPS_LOG(WARNING) << "ps server " << options_.server_index << ": checkpoint at clock "
                          << clock << " passed: a worker is past it already";
      if (!log_receiver_ || log_receiver_->serving()) {
        std::uint64_t cur = failed_plus1_.load();
        while (cur < clock + 1 && !failed_plus1_.compare_exchange_weak(cur, clock + 1)) {
        }
        NotifyCheckpoint();
      }
    } else if (std::chrono::steady_clock::now() - cut_->armed_at() >= options_.checkpoint_timeout) {
      RDMAPS_LOG(ERROR) << "ps server " << options_.server_index << ": checkpoint at clock "
                        << clock << " abandoned: not every worker reached it within "
                        << options_.checkpoint_timeout.count() << " ms (a worker died?)";
      std::uint64_t cur = failed_plus1_.load();
      while (cur < clock + 1 && !failed_plus1_.compare_exchange_weak(cur, clock + 1)) {
      }
      NotifyCheckpoint();
    } else {
      return;
    }
    cut_->Release(captured);
    // The held slots, in order, until a worker reaches the next cut.
    for (std::uint32_t w = 0; w < workers_.size(); ++w) {
      std::deque<std::uint32_t>& held = cut_->held()[w];
      while (!held.empty() && !cut_->Holding(w)) {
        const std::uint32_t imm = held.front();
        held.pop_front();
        HandleSlot(w, imm);
      }
    }
  }
}

void ServerImpl::NotifyCheckpoint() {
  { MutexLock lock(mu_); }  // a waiter between its check and its wait sees the change
  cv_.notify_all();
}

void ServerImpl::ServeTriggers() {
  // A backup serves no trigger before it is promoted (its primary does).
  if (log_receiver_ && !log_receiver_->serving()) return;
  const auto now = std::chrono::steady_clock::now();
  bool timed = false;
  if (options_.checkpoint_interval.count() > 0 && options_.server_index == 0 &&
      !options_.checkpoint_dir.empty()) {
    if (next_timed_ == std::chrono::steady_clock::time_point{}) {
      next_timed_ = now + options_.checkpoint_interval;
    } else if (now >= next_timed_) {
      next_timed_ = now + options_.checkpoint_interval;
      MutexLock lock(mu_);
      // Nothing to save before a worker came.
      timed = std::find(seen_.begin(), seen_.end(), true) != seen_.end();
    }
  }
  const std::uint64_t asked = trigger_requests_.load();
  if (!timed && asked == triggers_seen_) return;
  triggers_seen_ = asked;
  if (options_.checkpoint_dir.empty()) {
    RDMAPS_LOG(WARNING) << "ps server " << options_.server_index
                        << ": a checkpoint was asked for, but this server has no "
                           "--checkpoint_dir; ignored";
    return;
  }
  std::vector<bool> done(workers_.size());
  for (std::size_t w = 0; w < workers_.size(); ++w) done[w] = workers_[w].done;
  bool created = false;
  const std::uint64_t clock = cut_->Trigger(options_.push_slots, done, &created);
  if (created) {
    own_cut_plus1_ = clock + 1;
    PublishControl();
  }
  RDMAPS_LOG(INFO) << "ps server " << options_.server_index << ": checkpoint "
                   << (timed ? "timer" : "requested") << ": the job's cut at clock " << clock
                   << (created ? " (new; the workers relay it)" : " (pending already)");
  {
    MutexLock lock(mu_);
    triggers_served_ = asked;
    trigger_clock_ = clock;
  }
  cv_.notify_all();
}

Result<std::uint64_t> ServerImpl::CheckpointNow(Deadline deadline) {
  const std::string me = "ps server " + std::to_string(options_.server_index);
  if (options_.checkpoint_dir.empty()) {
    return FailedPreconditionError(me + " has no checkpoint_dir: give it --checkpoint_dir");
  }
  {
    MutexLock lock(mu_);
    if (std::find(seen_.begin(), seen_.end(), true) == seen_.end()) {
      return FailedPreconditionError(me +
                                     ": no worker has connected since it started, so its state "
                                     "is its initial (or restored) one: nothing to checkpoint");
    }
  }
  const std::uint64_t ticket = ++trigger_requests_;
  MutexLock lock(mu_);
  while (true) {
    if (stopped_) return CancelledError(me + " stopped before its checkpoint was durable");
    const bool served = triggers_served_ >= ticket;
    const std::uint64_t clock = trigger_clock_;
    if (served && durable_plus1_.load() >= clock + 1) return clock;
    if (served && failed_plus1_.load() >= clock + 1) {
      return UnavailableError(me + ": the checkpoint at clock " + std::to_string(clock) +
                              " failed or was abandoned (see its log: a disk error, or a worker "
                              "that died before reaching it)");
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      if (!served) return TimedOutError(me + ": the checkpoint request was not served in time");
      std::vector<std::uint32_t> behind;
      for (std::uint32_t w = 0; w < options_.num_workers; ++w) {
        if (stats_.worker_clocks[w] < clock) behind.push_back(w);
      }
      return TimedOutError(me + ": the checkpoint at clock " + std::to_string(clock) +
                           " is not durable by the deadline; workers not there yet: [" +
                           WorkerList(behind) + "]");
    }
    // Slices: the writer thread's notification needs no lock order with us.
    cv_.wait_until(lock.native(), std::min(deadline, now + std::chrono::milliseconds(200)));
  }
}

Status ServerImpl::Restore() {
  std::string path = options_.restore;
  if (path == "latest" || path == "auto") {
    if (options_.checkpoint_dir.empty()) {
      return InvalidArgumentError("ServerOptions.restore is \"" + path +
                                  "\" but checkpoint_dir is empty: give the folder to look in "
                                  "(--checkpoint_dir) or the checkpoint's path");
    }
    auto found = internal::FindLatestCheckpoint(options_.checkpoint_dir);
    if (!found.ok() && path == "auto" && found.status().code() == StatusCode::kNotFound) {
      RDMAPS_LOG(INFO) << "ps server " << options_.server_index << ": no complete checkpoint in "
                       << options_.checkpoint_dir << " yet; starting from the initialisers";
      return Status::OK();
    }
    if (!found.ok()) return found.status();
    path = *found;
  }
  MutexLock apply_lock(apply_mu_);  // no other thread yet; for the analysis
  std::uint64_t clock = 0;
  std::string lineage;
  RDMAPS_RETURN_IF_ERROR(LoadCheckpoint(path, &clock, &lineage));
  for (WorkerState& ws : workers_) ws.clock = clock;
  cut_->SetCaptured(clock);
  restored_plus1_ = clock + 1;
  lineage_ = internal::CheckpointLineage(options_.transport.job_token, lineage, clock);
  RDMAPS_LOG(INFO) << "ps server " << options_.server_index << " restored " << path << " (clock "
                   << clock << ")";
  return Status::OK();
}

Status ServerImpl::LoadCheckpoint(const std::string& path, std::uint64_t* clock,
                                  std::string* lineage) {
  auto parts = internal::OpenCheckpoint(path);
  if (!parts.ok())
    return parts.status().WithContext("restoring ps server " +
                                      std::to_string(options_.server_index));
  RDMAPS_RETURN_IF_ERROR(internal::CheckCheckpointTables(*parts, options_.tables, path));
  for (TableState& t : tables_) {
    const internal::ShardView v{&t.options,     t.shard,        t.geometry,
                                t.memory.get(), t.state.data(), t.optimizer->state_floats()};
    RDMAPS_RETURN_IF_ERROR(internal::RestoreTable(*parts, v));
    for (std::uint64_t b = 0; b < t.geometry.blocks(); ++b) t.Seal(b);
  }
  *clock = parts->front().clock;
  *lineage = parts->front().lineage;
  return Status::OK();
}

std::string ServerImpl::WorkerList(const std::vector<std::uint32_t>& ids) const {
  std::string s;
  for (std::uint32_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s;
}

bool ServerImpl::Finished() const {
  if (stopped_) return true;
  if (!options_.exit_when_workers_done) return false;
  const auto now = std::chrono::steady_clock::now();
  for (std::uint32_t w = 0; w < slots_; ++w) {
    // Elastic: the slots no worker has joined are not waited for.
    if (w >= options_.num_workers && !seen_[w]) continue;
    if (!seen_[w] || !gone_[w]) return false;
    // A worker that died may reconnect (after a server's restart) until then.
    if (std::find(stats_.dead_workers.begin(), stats_.dead_workers.end(), w) !=
            stats_.dead_workers.end() &&
        now - gone_at_[w] < options_.rejoin_timeout) {
      return false;
    }
  }
  return true;
}

Status ServerImpl::RunUntil(Deadline deadline) {
  MutexLock lock(mu_);
  bool finished = Finished();
  // A replacement whose catch-up failed is no copy of the shard and never
  // will be: Run returns (FailCatchup notifies cv_) so its launcher can
  // start another.
  while (!finished && rejoin_status_.ok()) {
    // In slices while a rejoin_timeout may run out with no notification.
    const Deadline until =
        options_.rejoin_timeout.count() > 0
            ? std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200))
            : deadline;
    cv_.wait_until(lock.native(), until);
    finished = Finished();
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  if (!rewind_error_.ok()) return rewind_error_;
  if (!rejoin_status_.ok()) {
    return FailedPreconditionError("ps server " + std::to_string(options_.server_index) +
                                   ": re-protection failed (" + rejoin_status_.ToString() +
                                   "); this replacement is no copy of the shard: start another");
  }
  if (!finished) {
    std::vector<std::uint32_t> missing, running;
    for (std::uint32_t w = 0; w < slots_; ++w) {
      if (!seen_[w]) {
        if (w < options_.num_workers) missing.push_back(w);
      } else if (!gone_[w]) {
        running.push_back(w);
      }
    }
    return TimedOutError("ps server " + std::to_string(options_.server_index) +
                         ": deadline passed; workers never connected: [" + WorkerList(missing) +
                         "], still running: [" + WorkerList(running) + "]");
  }
  // Elastic: a worker that died left the job, which went on without it.
  if (!stats_.dead_workers.empty() && options_.max_workers == 0) {
    return UnavailableError("ps server " + std::to_string(options_.server_index) +
                            ": workers disconnected without closing (crashed?): [" +
                            WorkerList(stats_.dead_workers) + "]");
  }
  return Status::OK();
}

void ServerImpl::Stop() {
  MutexLock stop_lock(stop_mu_);
  primary_watch_.reset();  // waits for a callback that runs
  {
    MutexLock lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
  stop_.store(true);
  // Interrupt() wakes one blocked waiter at a time: repeat until both
  // background threads have left their loops.
  while (endpoint_ && running_.load() > 0) {
    endpoint_->Interrupt();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  if (apply_thread_.joinable()) apply_thread_.join();
  if (catchup_) {
    catchup_->stop.store(true);
    if (catchup_->copier.joinable()) catchup_->copier.join();
  }
  writer_.reset();  // finishes the parts already captured
}

Status ServerImpl::ReadLocal(std::uint32_t table, RowRange range, std::vector<float>* out) const {
  auto it = table_index_.find(table);
  if (it == table_index_.end()) {
    return InvalidArgumentError("ReadLocal: unknown table id " + std::to_string(table));
  }
  const TableState& t = tables_[it->second];
  if (range.begin < t.shard.begin || range.begin + range.count > t.shard.end()) {
    return InvalidArgumentError(
        "ReadLocal: rows [" + std::to_string(range.begin) + ", " +
        std::to_string(range.begin + range.count) + ") are not all on this server, which holds [" +
        std::to_string(t.shard.begin) + ", " + std::to_string(t.shard.end()) + ")");
  }
  const std::uint32_t dim = t.options.dim;
  out->resize(range.count * dim);
  MutexLock lock(apply_mu_);
  for (std::uint64_t i = 0; i < range.count; ++i) {
    std::memcpy(out->data() + i * dim, t.data(range.begin - t.shard.begin + i),
                std::size_t{dim} * sizeof(float));
  }
  return Status::OK();
}

void ServerImpl::TEST_Kill() {
  // From now on nothing is forwarded, applied or acknowledged, whatever
  // point of a batch the apply thread is at; then every connection closes,
  // as when the process dies.
  killed_.store(true);
  if (log_sender_) log_sender_->Kill();
  Stop();
  for (auto& c : connections_) c->Close();  // (the accept thread is joined)
  connections_.clear();
  if (log_sender_) log_sender_->CloseConnection();
  if (log_receiver_) log_receiver_->CloseConnection();
}

Status ServerImpl::TEST_ShardState(std::uint32_t table, std::vector<float>* rows,
                                   std::vector<float>* state) {
  auto it = table_index_.find(table);
  if (it == table_index_.end()) return InvalidArgumentError("unknown table");
  const TableState& t = tables_[it->second];
  MutexLock lock(apply_mu_);
  rows->resize(t.shard.count * t.options.dim);
  for (std::uint64_t r = 0; r < t.shard.count; ++r) {
    std::memcpy(rows->data() + r * t.options.dim, t.data(r), t.row_bytes());
  }
  *state = t.state;
  return Status::OK();
}

std::string ServerImpl::TEST_MembershipImage() {
  MutexLock lock(apply_mu_);
  std::string out = "epoch " + std::to_string(membership_->epoch()) + ", " +
                    std::to_string(membership_->members()) + " members;";
  for (std::uint32_t w = 0; w < slots_; ++w) {
    const internal::Membership::SlotImage m = membership_->Image(w);
    out += " w" + std::to_string(w) + "{state " + std::to_string(m.state) + " epoch " +
           std::to_string(m.epoch) + " barriers " + std::to_string(m.barriers) +
           (m.joined ? " joined" : "") + (m.died ? " died" : "") + " seq " +
           std::to_string(workers_[w].next_seq) + " clock " + std::to_string(workers_[w].clock) +
           (workers_[w].done ? " done" : "") + "}";
  }
  return out;
}

Status ServerImpl::TEST_SetRow(std::uint32_t table, std::uint64_t row, float value) {
  auto it = table_index_.find(table);
  if (it == table_index_.end()) return InvalidArgumentError("unknown table");
  TableState& t = tables_[it->second];
  if (row < t.shard.begin || row >= t.shard.end()) return InvalidArgumentError("row not here");
  MutexLock lock(apply_mu_);
  const std::uint64_t local = row - t.shard.begin;
  float* d = t.data(local);
  for (std::uint32_t i = 0; i < t.options.dim; ++i) d[i] = value;
  t.Seal(t.geometry.block_of(local));
  return Status::OK();
}

}  // namespace

namespace internal {
transport::Endpoint* TEST_ServerEndpoint(Server& server) {
  return static_cast<ServerImpl&>(server).TEST_endpoint();
}
Status TEST_SetRow(Server& server, std::uint32_t table, std::uint64_t row, float value) {
  return static_cast<ServerImpl&>(server).TEST_SetRow(table, row, value);
}
void TEST_PauseApply(Server& server, bool paused) {
  static_cast<ServerImpl&>(server).TEST_PauseApply(paused);
}
void TEST_Kill(Server& server) { static_cast<ServerImpl&>(server).TEST_Kill(); }
void TEST_Hang(Server& server) { static_cast<ServerImpl&>(server).TEST_Hang(); }
void TEST_PrimaryLeaseLost(Server& backup) {
  static_cast<ServerImpl&>(backup).TEST_PrimaryLeaseLost();
}
void TEST_HoldCatchup(bool held) { g_hold_catchup.store(held); }
Status TEST_ShardState(Server& server, std::uint32_t table, std::vector<float>* rows,
                       std::vector<float>* state) {
  return static_cast<ServerImpl&>(server).TEST_ShardState(table, rows, state);
}
std::string TEST_MembershipImage(Server& server) {
  return static_cast<ServerImpl&>(server).TEST_MembershipImage();
}
}  // namespace internal

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  // Option checks come first, before any vector is sized by them.
  RDMAPS_RETURN_IF_ERROR(ValidateServerOptions(options));
  try {
    auto server = std::make_unique<ServerImpl>(options);
    RDMAPS_RETURN_IF_ERROR(server->Init());
    return std::unique_ptr<Server>(std::move(server));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError(
        "rdmaps server: out of memory while setting up its tables (optimizer state and shard "
        "memory); use fewer/smaller tables or more servers");
  } catch (const std::system_error& e) {
    return InternalError(std::string("rdmaps server: cannot start its threads: ") + e.what());
  }
}

}  // namespace rdmaps

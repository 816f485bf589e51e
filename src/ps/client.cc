// The worker side: Client::Connect (connect to every server, read and check
// their directories), the entry points (argument checks, then the pull
// reader or the push writer), the SSP checks of pulls, Clock, Barrier and
// Close, caller buffer registration, and the executor of the asynchronous
// calls. Every call holds mu_ for its whole network use: one Connection per
// server, ops posted per server (servers are served in parallel) and
// drained before the call returns. Protocol: src/ps/wire.h.
//
//   src/ps/directory.h     the servers' directories, decoded and checked
//   src/ps/server_links.h  the connections, the op plumbing on them, the
//                          control block reads and clock waits
//   src/ps/pull_reader.h   pulls: plan, post, verify and re-read
//   src/ps/push_writer.h   pushes: slots and credits
#include "rdmaps/client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>

#include "rdmaps/failover.h"
#include "src/base/log.h"
#include "src/base/mutex.h"
#include "src/ps/common.h"
#include "src/ps/directory.h"
#include "src/ps/join.h"
#include "src/ps/memory.h"
#include "src/ps/pull_reader.h"
#include "src/ps/push_pull.h"
#include "src/ps/push_writer.h"
#include "src/ps/scatter_plan.h"
#include "src/ps/server_links.h"
#include "src/ps/test_hooks.h"
#include "src/ps/wire.h"
#include "transport/transport.h"

namespace rdmaps {

struct Handle::State {
  explicit State(Callback cb) : callback(std::move(cb)) {}

  Mutex mu;
  std::condition_variable cv;
  bool done RDMAPS_GUARDED_BY(mu) = false;
  Status status RDMAPS_GUARDED_BY(mu);
  Callback callback RDMAPS_GUARDED_BY(mu);
};

Status Handle::Wait(std::chrono::steady_clock::time_point deadline) const {
  if (!state_) return FailedPreconditionError("Handle::Wait on an empty Handle");
  State& s = *state_;
  MutexLock lock(s.mu);
  while (!s.done) {
    if (s.cv.wait_until(lock.native(), deadline) == std::cv_status::timeout && !s.done) {
      return TimedOutError(
          "the asynchronous call has not finished by the deadline (it keeps "
          "running; Wait again with a later deadline)");
    }
  }
  return s.status;
}

bool Handle::done() const {
  if (!state_) return false;
  State& s = *state_;
  MutexLock lock(s.mu);
  return s.done;
}

namespace {

using internal::BlockHeader;
using internal::ClientStatsRecorder;
using internal::RemoteTable;
using internal::Run;
using internal::ServerLink;
using internal::ServerName;
using internal::SlotKind;
using transport::Deadline;
using transport::Op;
using SteadyClock = std::chrono::steady_clock;

// How often a wait that Interrupt() can cut short looks for one.
constexpr auto kInterruptPoll = std::chrono::milliseconds(20);

// Caller memory registered with RegisterBuffer().
struct UserBuffer {
  const float* data = nullptr;
  std::size_t floats = 0;
  std::unique_ptr<transport::MemoryRegion> mr;
};

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(const ClientOptions& options)
      : options_(options),
        links_(options.worker_id, &stats_),
        pull_(&links_, &stats_),
        push_(&links_, &stats_) {
    links_.set_failover(options_.failover.get());  // (mu_ not needed: no other thread yet)
  }
  ~ClientImpl() override {
    StopExecutor();  // runs what is queued first
    (void)Close();
  }

  Status Init();

  std::uint32_t worker_id() const override { return options_.worker_id; }
  std::uint32_t num_workers() const override { return options_.num_workers; }
  std::uint32_t num_servers() const override {
    return static_cast<std::uint32_t>(options_.servers.size());
  }
  std::vector<TableInfo> tables() const override {
    std::vector<TableInfo> out;
    for (const auto& [id, t] : tables_) out.push_back(t.info);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.id < b.id; });
    return out;
  }
  Result<TableInfo> FindTable(std::string_view name) const override {
    for (const auto& [id, t] : tables_) {
      if (t.info.name == name) return t.info;
    }
    return NotFoundError("no table named '" + std::string(name) + "' on the servers");
  }

  Status Pull(std::uint32_t table, RowRange range, std::span<float> out) override;
  Status Pull(std::uint32_t table, std::span<const std::uint64_t> rows,
              std::span<float> out) override;
  Status Push(std::uint32_t table, RowRange range, std::span<const float> grads) override;
  Status Push(std::uint32_t table, std::span<const std::uint64_t> rows,
              std::span<const float> grads) override;
  Status PushPull(std::uint32_t table, RowRange range, std::span<const float> grads,
                  std::span<float> out) override;
  Status RegisterBuffer(std::span<float> buffer) override;
  Status UnregisterBuffer(std::span<float> buffer) override;
  Result<std::uint64_t> Clock() override;
  Status Flush() override;
  Result<CheckpointInfo> Checkpoint() override;
  std::vector<std::uint64_t> server_incarnations() const override { return incarnations_; }
  Status Barrier() override;
  Status Close() override;
  void Interrupt() override { interrupts_.fetch_add(1, std::memory_order_acq_rel); }

  Handle PullAsync(std::uint32_t table, RowRange range, std::span<float> out) override {
    return Submit([=, this] { return Pull(table, range, out); }, nullptr);
  }
  Handle PullAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                   std::span<float> out) override {
    return Submit([=, this] { return Pull(table, rows, out); }, nullptr);
  }
  Handle PushAsync(std::uint32_t table, RowRange range, std::span<const float> grads) override {
    return Submit([=, this] { return Push(table, range, grads); }, nullptr);
  }
  Handle PushAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                   std::span<const float> grads) override {
    return Submit([=, this] { return Push(table, rows, grads); }, nullptr);
  }
  void PullAsync(std::uint32_t table, RowRange range, std::span<float> out,
                 Callback done) override {
    Submit([=, this] { return Pull(table, range, out); }, std::move(done));
  }
  void PushAsync(std::uint32_t table, RowRange range, std::span<const float> grads,
                 Callback done) override {
    Submit([=, this] { return Push(table, range, grads); }, std::move(done));
  }
  void PullAsync(std::uint32_t table, std::span<const std::uint64_t> rows, std::span<float> out,
                 Callback done) override {
    Submit([=, this] { return Pull(table, rows, out); }, std::move(done));
  }
  void PushAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                 std::span<const float> grads, Callback done) override {
    Submit([=, this] { return Push(table, rows, grads); }, std::move(done));
  }
  Handle PushPullAsync(std::uint32_t table, RowRange range, std::span<const float> grads,
                       std::span<float> out) override {
    return Submit([=, this] { return PushPull(table, range, grads, out); }, nullptr);
  }
  void PushPullAsync(std::uint32_t table, RowRange range, std::span<const float> grads,
                     std::span<float> out, Callback done) override {
    Submit([=, this] { return PushPull(table, range, grads, out); }, std::move(done));
  }
  Handle FlushAsync() override {
    return Submit([this] { return Flush(); }, nullptr);
  }

  ClientStats stats() const override { return stats_.Get(); }
  std::uint64_t clock() const override { return stats_.Get().clock; }

  transport::Endpoint* TEST_endpoint() const { return endpoint_.get(); }
  std::uint64_t TEST_follower_torn() const { return follower_torn_.load(); }
  void TEST_Abandon() {
    MutexLock lock(mu_);
    closed_ = true;
    for (ServerLink& s : links_.servers()) {
      if (s.conn) s.conn->Close();
    }
  }
  void TEST_BeforeRelayingCuts(std::function<void()> hook) {
    MutexLock lock(mu_);
    test_before_cuts_ = std::move(hook);
  }

 private:
  // --- setup
  Status ConnectAll(Deadline deadline) RDMAPS_REQUIRES(mu_);
  // This worker's clock as the servers have it: 0, or the clock of the
  // checkpoint they restored. FailedPrecondition when they disagree.
  Status ReadStartClock(Deadline deadline) RDMAPS_REQUIRES(mu_);
  // ClientOptions::rewind_from: asks the servers not restarted since to
  // rewind in place to the checkpoint the restarted ones restored, and
  // waits until they did (control blocks read already).
  Status RewindSurvivors(Deadline deadline) RDMAPS_REQUIRES(mu_);
  Status ReadDirectories(Deadline deadline) RDMAPS_REQUIRES(mu_);
  // Reads s's directory (again, after a failover: the shard's addresses
  // changed) and, the first time, allocates s's buffers.
  Status ReadDirectory(ServerLink& s, Deadline deadline) RDMAPS_REQUIRES(mu_);

  // --- failover (ClientOptions::failover; docs/ps.md, "Replication and
  // failover")
  // Runs f, the network part of a call. When it failed on a broken link
  // and a shard has a new epoch: Recover, then run f again, its slots up
  // to those sent before rebuilt without being sent (replay_until), so
  // every push is sent under one seq and applied once.
  template <typename F>
  Status Failsafe(Deadline deadline, F&& f) RDMAPS_REQUIRES(mu_);
  // Waits for the new epoch of every shard whose link failed, reconnects
  // every link (the failed call may have left any out of step), checks each
  // server serves at its epoch and resends what it has not applied.
  // FailedPrecondition (keeping the links broken) when no shard moved.
  Status Recover(Deadline deadline) RDMAPS_REQUIRES(mu_);
  // Allocates and registers s's staging (to hold at least `min_staging`
  // bytes), push and control buffers.
  Status AllocateBuffers(ServerLink& s, std::size_t min_staging) RDMAPS_REQUIRES(mu_);

  // --- argument checks (before anything is sent)
  Result<const RemoteTable*> CheckTable(std::uint32_t table) const;
  Status Usable() const RDMAPS_REQUIRES(mu_);
  // What every Pull and Push checks before it sends anything: the client is
  // usable, the table exists, the rows (a range or ids) lie in it and the
  // buffer holds exactly their floats. `call` ("Pull") and `buffer`
  // ("output", "gradient") name them in the messages.
  Result<const RemoteTable*> CheckCall(std::string_view call, std::string_view buffer,
                                       std::uint32_t table, RowRange range,
                                       std::size_t floats) const RDMAPS_REQUIRES(mu_);
  // With `summary`, also the ids' span and runs (the same pass: a scattered
  // pull plans from it).
  Result<const RemoteTable*> CheckCall(std::string_view call, std::string_view buffer,
                                       std::uint32_t table, std::span<const std::uint64_t> rows,
                                       std::size_t floats,
                                       internal::IdSummary* summary = nullptr) const
      RDMAPS_REQUIRES(mu_);
  static Status CheckBuffer(std::string_view call, std::string_view buffer, const RemoteTable& t,
                            std::uint64_t rows, std::size_t floats);

  // --- pulls and clocks
  // Waits until `involved` are readable at this clock, then READs `runs`
  // (of `rows` rows) into `out`.
  Status PullRuns(const RemoteTable& t, const std::vector<Run>& runs,
                  const std::vector<std::uint32_t>& involved, std::uint64_t rows,
                  std::span<float> out) RDMAPS_REQUIRES(mu_);
  Status WaitReadable(const RemoteTable& t, const std::vector<std::uint32_t>& servers,
                      Deadline deadline) RDMAPS_REQUIRES(mu_);
  // Flush() under mu_, bounded by `deadline`.
  Status FlushLocked(Deadline deadline) RDMAPS_REQUIRES(mu_);
  // links_.WaitForClocks in slices of kInterruptPoll: Cancelled when an
  // Interrupt() came after the call began (call_epoch_). The slices count
  // as one wait in ClientStats::pull_waits.
  Status WaitForClocks(std::uint64_t required, const std::vector<std::uint32_t>& servers,
                       const std::function<std::string()>& why, Deadline deadline)
      RDMAPS_REQUIRES(mu_);

  // --- cancellation
  // The number of Interrupt()s so far; a public call that can wait reads it
  // first (Epoch()) and records it in call_epoch_ once it holds mu_.
  std::uint64_t Epoch() const { return interrupts_.load(std::memory_order_acquire); }
  bool Interrupted() const RDMAPS_REQUIRES(mu_) { return Epoch() != call_epoch_; }
  Status InterruptedError(const std::string& what) const {
    return CancelledError(what +
                          " was interrupted (Client::Interrupt) while waiting; the client "
                          "stays usable");
  }
  // After a Clock(): sends kCut(c) to every server for each cut c a server
  // published (ControlCheckpoint::cut_plus1) that this worker has not passed
  // and not relayed yet (docs/ps.md, "Checkpoints": triggers).
  Status RelayCuts(Deadline deadline) RDMAPS_REQUIRES(mu_);

  // A scattered pull by spans (scatter_plan.h): the spans into scratch_,
  // then the gather into `out`.
  Status PullSpans(const RemoteTable& t, const internal::SpanPlan& plan,
                   std::span<const std::uint64_t> rows, std::span<float> out) RDMAPS_REQUIRES(mu_);

  // The registered caller buffer holding [p, p + bytes), or null.
  const transport::MemoryRegion* FindRegistered(const void* p, std::size_t bytes) const
      RDMAPS_REQUIRES(mu_);
  Deadline CallDeadline() const { return transport::CoarseNowCeil() + options_.wait_timeout; }

  // --- async
  Handle Submit(std::function<Status()> fn, Callback done) RDMAPS_EXCLUDES(exec_mu_);
  void ExecutorLoop() RDMAPS_EXCLUDES(exec_mu_);
  void StopExecutor() RDMAPS_EXCLUDES(exec_mu_);

  // Constant after Init().
  const ClientOptions options_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  internal::AlignedBuffer boot_;
  std::unique_ptr<transport::MemoryRegion> boot_mr_;
  internal::RemoteTables tables_;
  // Per server, its incarnation id as read at Connect (constant after it).
  std::vector<std::uint64_t> incarnations_;
  // The smallest staleness bound of the tables (Clock() waits by it).
  std::uint32_t clock_bound_ = kAsp;
  internal::WireRegion atomics_{};             // server 0's barrier counter
  transport::ConnectOptions connect_options_;  // the hello; constant after Init

  ClientStatsRecorder stats_;  // has its own mutex

  // Serialises all network use.
  Mutex mu_;
  internal::ServerLinks links_ RDMAPS_GUARDED_BY(mu_);
  internal::PullReader pull_ RDMAPS_GUARDED_BY(mu_);
  internal::PushWriter push_ RDMAPS_GUARDED_BY(mu_);
  std::vector<UserBuffer> user_buffers_ RDMAPS_GUARDED_BY(mu_);
  // Registered scratch of span pulls (grown on demand, kept for reuse).
  internal::AlignedBuffer scratch_ RDMAPS_GUARDED_BY(mu_);
  std::unique_ptr<transport::MemoryRegion> scratch_mr_ RDMAPS_GUARDED_BY(mu_);
  std::size_t scratch_floats_ RDMAPS_GUARDED_BY(mu_) = 0;
  internal::PullCosts costs_{};                  // constant after Init()
  std::atomic<std::uint64_t> follower_torn_{0};  // TEST_FollowerTornBlocks
  std::uint64_t clock_ RDMAPS_GUARDED_BY(mu_) = 0;
  // A push since the last Clock() (Checkpoint() must come before any).
  bool pushed_this_clock_ RDMAPS_GUARDED_BY(mu_) = false;
  // Cuts relayed (RelayCuts) at or after clock_.
  std::vector<std::uint64_t> relayed_cuts_ RDMAPS_GUARDED_BY(mu_);
  std::function<void()> test_before_cuts_ RDMAPS_GUARDED_BY(mu_);  // TEST_BeforeRelayingCuts
  bool closed_ RDMAPS_GUARDED_BY(mu_) = false;
  internal::ElasticState elastic_ RDMAPS_GUARDED_BY(mu_);
  std::atomic<std::uint64_t> interrupts_{0};
  std::uint64_t call_epoch_ RDMAPS_GUARDED_BY(mu_) = 0;
  // The barrier counter value an interrupted Barrier() waited for after
  // this worker arrived (0: none): the next Barrier() waits for it again.
  std::uint64_t barrier_target_ RDMAPS_GUARDED_BY(mu_) = 0;
  // Init() succeeded. A client whose Connect failed part-way (a server not
  // up, a refused handshake, tables that do not match) has links without
  // connections or buffers: it closes what it opened and says no goodbye,
  // so a server it reached counts it as gone without closing, not done.
  bool connected_ RDMAPS_GUARDED_BY(mu_) = false;

  // Async executor.
  Mutex exec_mu_;
  std::condition_variable exec_cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<Handle::State>>> queue_
      RDMAPS_GUARDED_BY(exec_mu_);
  bool exec_stop_ RDMAPS_GUARDED_BY(exec_mu_) = false;
  // Started under exec_mu_ by the first Submit; joined by the destructor,
  // when no other call can run.
  std::thread executor_;
};

Status ClientImpl::Init() {
  RDMAPS_RETURN_IF_ERROR(
      internal::ValidateMaxWorkers(options_.num_workers, options_.max_workers, "ClientOptions"));
  if (options_.num_workers == 0 || options_.worker_id >= internal::WorkerSlots(options_)) {
    return InvalidArgumentError(
        "ClientOptions.worker_id " + std::to_string(options_.worker_id) + " must be < " +
        (options_.max_workers ? "max_workers " + std::to_string(options_.max_workers)
                              : "num_workers " + std::to_string(options_.num_workers)));
  }
  if (options_.num_workers >= internal::kServerPeerBase) {
    return InvalidArgumentError("ClientOptions.num_workers is too large");
  }
  if (options_.servers.empty()) {
    return InvalidArgumentError("ClientOptions.servers is empty; give every server's address");
  }
  if (!options_.tables.empty()) RDMAPS_RETURN_IF_ERROR(internal::ValidateTables(options_.tables));
  RDMAPS_ASSIGN_OR_RETURN(endpoint_,
                          transport::Endpoint::Create(internal::ToEndpointOptions(
                              options_.transport, options_.worker_id, options_.servers.front())));
  costs_ = internal::CostsOf(endpoint_->kind());
  const Deadline deadline = SteadyClock::now() + options_.connect_timeout;
  MutexLock lock(mu_);  // no other thread has the client yet; for the analysis
  RDMAPS_RETURN_IF_ERROR(ConnectAll(deadline));
  // With failover, a primary lost between its connect and these first
  // READs is followed as one lost later is (Recover reads the directory of
  // each server it reconnects to).
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    Status st = ReadDirectories(deadline);
    return st.ok() ? ReadStartClock(deadline) : st;
  }));
  // Elastic: joins a running job when this worker's slot is free.
  RDMAPS_RETURN_IF_ERROR(internal::JoinIfFree(links_, push_, &clock_, &elastic_, deadline));
  if (elastic_.joined) {
    const std::uint64_t now = clock_;
    stats_.Update([now](ClientStats& st) { st.clock = now; });
  }
  connected_ = true;
  return Status::OK();
}

Status ClientImpl::ConnectAll(Deadline deadline) {
  const std::size_t S = options_.servers.size();
  const std::size_t boot_bytes = S * internal::kBootstrapSlotBytes;
  boot_ = internal::AllocateRegionMemory(boot_bytes);
  if (!boot_) return ResourceExhaustedError("allocating the bootstrap region failed");
  RDMAPS_ASSIGN_OR_RETURN(boot_mr_,
                          endpoint_->Register(boot_.get(), boot_bytes, transport::kRemoteWrite));
  internal::HelloMsg hello{internal::kHelloMagic, options_.worker_id,
                           reinterpret_cast<std::uint64_t>(boot_.get()), boot_mr_->rkey(),
                           static_cast<std::uint32_t>(boot_bytes)};
  connect_options_.user_data.resize(sizeof(hello));
  std::memcpy(connect_options_.user_data.data(), &hello, sizeof(hello));
  // With failover ServerLinks follows the map while it connects: its
  // primaries win over the addresses at start.
  return links_.Connect(*endpoint_, options_.servers, connect_options_, deadline);
}

Status ClientImpl::ReadDirectories(Deadline deadline) {
  const std::uint32_t S = links_.size();
  for (ServerLink& s : links_.servers()) RDMAPS_RETURN_IF_ERROR(ReadDirectory(s, deadline));
  for (auto& [id, t] : tables_) {
    if (options_.staleness_override) {
      t.info.staleness = std::min(t.info.staleness, *options_.staleness_override);
    }
    clock_bound_ = std::min(clock_bound_, t.info.staleness);
  }
  return internal::CheckWantedTables(tables_, options_.tables, S);
}

Status ClientImpl::ReadDirectory(ServerLink& s, Deadline deadline) {
  const std::uint32_t S = links_.size();
  {
    internal::BootstrapMsg b;
    std::memcpy(&b, boot_.get() + s.index * internal::kBootstrapSlotBytes, sizeof(b));
    if (b.magic != internal::kBootstrapMagic || b.server_index != s.index) {
      return FailedPreconditionError(
          ServerName(s) + " sent a bootstrap message for server index " +
          std::to_string(b.server_index) +
          ": the worker's server list order must match each server's --server_index");
    }
    // The length is the server's word: bounded before it sizes anything.
    if (b.directory.length < sizeof(internal::DirectoryHeader) ||
        b.directory.length > internal::kMaxDirectoryBytes) {
      return DataLossError(ServerName(s) + " announces a directory of " +
                           std::to_string(b.directory.length) + " bytes (limit " +
                           std::to_string(internal::kMaxDirectoryBytes) +
                           "); it is not an rdmaps server of this build");
    }
    auto dir_buf = internal::AllocateRegionMemory(b.directory.length);
    if (!dir_buf) return ResourceExhaustedError("allocating the directory copy failed");
    RDMAPS_ASSIGN_OR_RETURN(auto dir_mr, endpoint_->Register(dir_buf.get(), b.directory.length,
                                                             transport::kAccessNone));
    const Op op = Op::Read(dir_buf.get(), dir_mr.get(), b.directory.length, b.directory.addr,
                           b.directory.rkey);
    RDMAPS_RETURN_IF_ERROR(links_.Exec(s, {&op, 1}, deadline));
    const std::string who = ServerName(s);
    RDMAPS_ASSIGN_OR_RETURN(
        internal::Directory dir,
        internal::ParseDirectory({dir_buf.get(), b.directory.length},
                                 {s.index, S, internal::WorkerSlots(options_)}, who));
    RDMAPS_RETURN_IF_ERROR(internal::AddServerTables(dir, s.index, who, &tables_));
    s.dir = dir.header;
    s.ring = dir.rings[options_.worker_id];
    if (s.index == 0) atomics_ = dir.header.atomics;
    // Staging must hold one block of every table, with its header.
    std::size_t max_block = 0;
    for (const internal::DirectoryTable& d : dir.tables) {
      max_block = std::max<std::size_t>(
          {max_block,
           std::size_t{d.rows_per_block} * internal::RowBytes(d.dim) + sizeof(BlockHeader),
           d.block_stride});
    }
    if (!s.staging) RDMAPS_RETURN_IF_ERROR(AllocateBuffers(s, max_block));
  }
  return Status::OK();
}

Status ClientImpl::AllocateBuffers(ServerLink& s, std::size_t min_staging) {
  const internal::DirectoryHeader& h = s.dir;
  s.staging_bytes = std::max(options_.staging_bytes, min_staging);
  s.staging = internal::AllocateRegionMemory(s.staging_bytes);
  s.push_depth = internal::PushPipelineDepth(h.slot_bytes, h.ring_slots, s.conn->max_outstanding());
  s.push = internal::AllocateRegionMemory(std::size_t{s.push_depth} * h.slot_bytes);
  s.ctrl_bytes = internal::ControlBlockBytes(h.num_workers);
  s.ctrl = internal::AllocateRegionMemory(internal::RoundUp(s.ctrl_bytes, 8) + 8);
  if (!s.staging || !s.push || !s.ctrl) {
    return ResourceExhaustedError(
        "allocating client staging memory failed; lower "
        "ClientOptions.staging_bytes");
  }
  RDMAPS_ASSIGN_OR_RETURN(
      s.staging_mr, endpoint_->Register(s.staging.get(), s.staging_bytes, transport::kAccessNone));
  RDMAPS_ASSIGN_OR_RETURN(
      s.push_mr, endpoint_->Register(s.push.get(), std::size_t{s.push_depth} * h.slot_bytes,
                                     transport::kAccessNone));
  RDMAPS_ASSIGN_OR_RETURN(s.ctrl_mr,
                          endpoint_->Register(s.ctrl.get(), internal::RoundUp(s.ctrl_bytes, 8) + 8,
                                              transport::kAccessNone));
  s.clocks.assign(h.num_workers, internal::ControlWorker{});
  if (options_.failover) {
    const std::size_t bytes = std::size_t{h.ring_slots} * h.slot_bytes;
    s.retain = internal::AllocateRegionMemory(bytes);
    if (!s.retain) {
      return ResourceExhaustedError("allocating " + std::to_string(bytes) +
                                    " bytes to keep unacknowledged pushes failed");
    }
    RDMAPS_ASSIGN_OR_RETURN(s.retain_mr,
                            endpoint_->Register(s.retain.get(), bytes, transport::kAccessNone));
    s.retain_len.assign(h.ring_slots, 0);
  }
  return Status::OK();
}

// ---- failover ------------------------------------------------------------------

template <typename F>
Status ClientImpl::Failsafe(Deadline deadline, F&& f) {
  if (!options_.failover) return f();
  constexpr int kMaxFailovers = 4;
  std::vector<std::uint64_t> start(links_.size());
  for (std::uint32_t i = 0; i < links_.size(); ++i) start[i] = links_[i].pushed_seq;
  Status st;
  for (int attempt = 0;; ++attempt) {
    st = f();
    if (st.ok() || links_.broken().ok() || attempt == kMaxFailovers) break;
    if (Status r = Recover(deadline); !r.ok()) {
      st = r.WithContext("after " + st.ToString());
      break;
    }
    for (ServerLink& s : links_.servers()) {
      s.replay_until = std::max(s.replay_until, s.pushed_seq);
      s.pushed_seq = start[s.index];
    }
  }
  for (ServerLink& s : links_.servers()) {
    // A retry that failed before it rebuilt every slot sent keeps them counted.
    s.pushed_seq = std::max(s.pushed_seq, s.replay_until);
    s.replay_until = 0;
  }
  return st;
}

Status ClientImpl::Recover(Deadline deadline) {
  // The waits in here look at their own shard's entry only: a failed
  // Recover ends the call, and another shard that moves meanwhile is met
  // by the retried call's waits.
  internal::ServerLinks::SweepOff sweep_off(links_);
  bool moved = false;
  for (ServerLink& s : links_.servers()) {
    auto a = options_.failover->Current(s.index);
    if (!a.ok()) return a.status().WithContext("failover: reading the shard map");
    if ((!s.conn || !s.conn->health().ok() || s.failed) &&
        (a->epoch == s.epoch || a->primary == s.address)) {
      // Its server is lost (its connection broke, or an op on it ran past
      // its deadline: a hung server keeps its connections open): wait for
      // the decision about its shard (the map may have moved on with the
      // same primary: a re-protection). A lost primary without a backup
      // has nobody to hand the shard to (a replacement copies from a live
      // primary): waiting could only run out the call's deadline.
      if (a->backup.empty() && a->primary == s.address) {
        return UnavailableError("failover: " + ServerName(s) + " is lost and shard " +
                                std::to_string(s.index) + " has no backup at epoch " +
                                std::to_string(a->epoch) +
                                ": nothing can take it over (restore it from a checkpoint)");
      }
      a = options_.failover->WaitForEpochAfter(s.index, a->epoch, deadline);
      if (!a.ok()) {
        return a.status().WithContext("failover: " + ServerName(s) + " is lost");
      }
    }
    if (a->epoch != s.epoch) {
      RDMAPS_LOG(WARNING) << "worker " << options_.worker_id << ": shard " << s.index
                          << " moved to " << a->primary << " at epoch " << a->epoch
                          << "; reconnecting";
      moved = true;
      s.epoch = a->epoch;
      s.address = a->primary;
    }
  }
  if (!moved) return FailedPreconditionError("no shard changed its primary");
  links_.ClearBroken();
  for (ServerLink& s : links_.servers()) s.failed = false;
  // Every link anew: the failed call may have left any of them out of step
  // (a server still serving takes the new connection as this worker's and
  // drops what the old one still delivers).
  for (ServerLink& s : links_.servers()) {
    Status st = links_.Reconnect(*endpoint_, s, connect_options_, deadline);
    if (st.ok()) st = ReadDirectory(s, deadline);
    if (st.ok()) {
      s.applied_seq = 0;
      st = links_.ReadControl({s.index}, deadline);
    }
    // A server re-protected since the map was read serves at a newer
    // epoch; one whose decision is a moment old may not have published it.
    if (st.ok() && s.replica.serving == 1 && s.replica.epoch > s.epoch) s.epoch = s.replica.epoch;
    const Deadline publish_by =
        std::min(deadline, transport::DeadlineAfter(std::chrono::milliseconds(100)));
    while (st.ok() && s.replica.serving == 1 && s.replica.epoch < s.epoch &&
           std::chrono::steady_clock::now() < publish_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      st = links_.ReadControl({s.index}, deadline);
    }
    if (st.ok() && (s.replica.serving == 0 || s.replica.epoch != s.epoch)) {
      st = UnavailableError(ServerName(s) + " serves at epoch " + std::to_string(s.replica.epoch) +
                            (s.replica.serving ? "" : " and acknowledges nothing") +
                            "; the shard map says epoch " + std::to_string(s.epoch));
    }
    // Elastic: a worker the promoted server departed while it was silent
    // is no member there; its session is over (resending would apply its
    // pushes to a fresh slot, twice).
    if (st.ok() && elastic_.elastic) {
      st = internal::CheckStillMember(s, options_.worker_id);
      if (!st.ok()) {
        // Its session is over: every server sees it go now (a server that
        // still counts it stops, and the slot is free for a new Client).
        for (ServerLink& o : links_.servers()) {
          if (o.conn) o.conn->Close();
        }
      }
    }
    if (st.ok()) st = push_.Resend(s, deadline);
    if (!st.ok()) return links_.Fail(s, st.WithContext("failover"));
  }
  stats_.Update([](ClientStats& st) { ++st.failovers; });
  return Status::OK();
}

// ---- argument checks ---------------------------------------------------------

Result<const RemoteTable*> ClientImpl::CheckTable(std::uint32_t table) const {
  auto it = tables_.find(table);
  if (it == tables_.end()) {
    std::string ids;
    for (const auto& [id, t] : tables_) ids += " " + std::to_string(id);
    return InvalidArgumentError("unknown table id " + std::to_string(table) +
                                "; the servers publish tables:" + ids);
  }
  return &it->second;
}

Status ClientImpl::Usable() const {
  if (closed_) return FailedPreconditionError("the Client is closed");
  return links_.broken();
}

Status ClientImpl::CheckBuffer(std::string_view call, std::string_view buffer, const RemoteTable& t,
                               std::uint64_t rows, std::size_t floats) {
  if (floats == rows * t.info.dim) return Status::OK();
  return InvalidArgumentError(std::string(call) + ": " + std::string(buffer) + " buffer has " +
                              std::to_string(floats) + " floats; " + std::to_string(rows) +
                              " rows of table '" + t.info.name + "' need " +
                              std::to_string(rows * t.info.dim));
}

Result<const RemoteTable*> ClientImpl::CheckCall(std::string_view call, std::string_view buffer,
                                                 std::uint32_t table, RowRange range,
                                                 std::size_t floats) const {
  RDMAPS_RETURN_IF_ERROR(Usable());
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t, CheckTable(table));
  if (range.begin > t->info.rows || range.count > t->info.rows - range.begin) {
    return InvalidArgumentError(std::string(call) + ": rows [" + std::to_string(range.begin) +
                                ", " + std::to_string(range.begin + range.count) + ") of table '" +
                                t->info.name + "' are out of range; it has " +
                                std::to_string(t->info.rows) + " rows");
  }
  RDMAPS_RETURN_IF_ERROR(CheckBuffer(call, buffer, *t, range.count, floats));
  return t;
}

Result<const RemoteTable*> ClientImpl::CheckCall(std::string_view call, std::string_view buffer,
                                                 std::uint32_t table,
                                                 std::span<const std::uint64_t> rows,
                                                 std::size_t floats,
                                                 internal::IdSummary* summary) const {
  RDMAPS_RETURN_IF_ERROR(Usable());
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t, CheckTable(table));
  // (One pass without branches; the bad id's index only when there is one.)
  std::uint64_t max_id;
  if (summary != nullptr) {
    *summary = internal::SummarizeIds(rows);
    max_id = summary->max;
  } else {
    max_id = internal::MaxId(rows);
  }
  const bool any_bad = !rows.empty() && max_id >= t->info.rows;
  for (std::size_t i = 0; any_bad && i < rows.size(); ++i) {
    if (rows[i] >= t->info.rows) {
      return InvalidArgumentError(std::string(call) + ": row id " + std::to_string(rows[i]) +
                                  " (index " + std::to_string(i) + ") is out of range; table '" +
                                  t->info.name + "' has " + std::to_string(t->info.rows) + " rows");
    }
  }
  RDMAPS_RETURN_IF_ERROR(CheckBuffer(call, buffer, *t, rows.size(), floats));
  return t;
}

// ---- clocks ------------------------------------------------------------------

Status ClientImpl::WaitReadable(const RemoteTable& t, const std::vector<std::uint32_t>& servers,
                                Deadline deadline) {
  const std::uint32_t st = t.info.staleness;
  const std::uint64_t required = (st == kAsp || clock_ < st) ? 0 : clock_ - st;
  RDMAPS_RETURN_IF_ERROR(WaitForClocks(
      required, servers,
      [&] { return "pulling table '" + t.info.name + "' (staleness " + std::to_string(st) + ")"; },
      deadline));
  std::uint64_t min_seen = internal::kClockDone;
  for (std::uint32_t i : servers) min_seen = std::min(min_seen, links_[i].min_clock);
  const std::uint64_t staleness = min_seen >= clock_ ? 0 : clock_ - min_seen;
  stats_.Update([&](ClientStats& s) {
    s.staleness_sum += staleness;
    s.staleness_max = std::max(s.staleness_max, staleness);
    ++s.staleness_samples;
  });
  return Status::OK();
}

// ---- pull ----------------------------------------------------------------------

Status ClientImpl::PullRuns(const RemoteTable& t, const std::vector<Run>& runs,
                            const std::vector<std::uint32_t>& involved, std::uint64_t rows,
                            std::span<float> out) {
  const Deadline deadline = CallDeadline();
  RDMAPS_RETURN_IF_ERROR(WaitReadable(t, involved, deadline));
  RDMAPS_RETURN_IF_ERROR(
      pull_.Read(t, runs, out, FindRegistered(out.data(), out.size_bytes()), deadline));
  stats_.Update([&](ClientStats& st) {
    ++st.pulls;
    st.rows_pulled += rows;
  });
  return Status::OK();
}

Status ClientImpl::Pull(std::uint32_t table, RowRange range, std::span<float> out) {
  const std::uint64_t epoch = Epoch();
  MutexLock lock(mu_);
  call_epoch_ = epoch;
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t,
                          CheckCall("Pull", "output", table, range, out.size()));
  if (range.count == 0) return Status::OK();
  std::vector<Run> runs;
  std::vector<std::uint32_t> involved;
  internal::RunsOfRange(*t, num_servers(), range, &runs, &involved);
  return Failsafe(CallDeadline(), [&]() RDMAPS_REQUIRES(mu_) {
    return PullRuns(*t, runs, involved, range.count, out);
  });
}

Status ClientImpl::Pull(std::uint32_t table, std::span<const std::uint64_t> rows,
                        std::span<float> out) {
  const std::uint64_t epoch = Epoch();
  MutexLock lock(mu_);
  call_epoch_ = epoch;
  const bool planned = rows.size() >= internal::kSpanMinRows;
  internal::IdSummary summary;
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t, CheckCall("Pull", "output", table, rows, out.size(),
                                                          planned ? &summary : nullptr));
  if (rows.empty()) return Status::OK();
  if (planned) {
    const internal::SpanPlan plan =
        internal::PlanScatteredPull(*t, num_servers(), rows, costs_, &summary);
    if (plan.use_span) {
      return Failsafe(CallDeadline(),
                      [&]() RDMAPS_REQUIRES(mu_) { return PullSpans(*t, plan, rows, out); });
    }
  }
  std::vector<Run> runs;
  std::vector<std::uint32_t> involved;
  internal::RunsOfRows(*t, num_servers(), rows, &runs, &involved);
  if (!t->inline_headers() && !t->layout_hint_logged && runs.size() >= 8 &&
      2 * runs.size() > rows.size() &&
      internal::RowBytes(t->info.dim) < internal::kScatterMinRowBytes) {
    t->layout_hint_logged = true;
    RDMAPS_LOG(INFO) << "table '" << t->info.name << "' has the dense layout and is pulled by "
                     << "scattered ids (" << runs.size() << " runs in " << rows.size()
                     << " rows): each run costs a READ of its checked block of "
                     << t->rows_per_block << " row(s) and a header READ; \"layout\": \"inline\" "
                     << "makes it one READ (docs/ps.md, Row layouts)";
  }
  return Failsafe(CallDeadline(), [&]() RDMAPS_REQUIRES(mu_) {
    return PullRuns(*t, runs, involved, rows.size(), out);
  });
}

Status ClientImpl::PullSpans(const RemoteTable& t, const internal::SpanPlan& plan,
                             std::span<const std::uint64_t> rows, std::span<float> out) {
  const std::size_t floats = plan.scratch_rows * t.info.dim;
  if (floats > scratch_floats_) {
    // Grow by doubling so that a run of pulls registers a few times only.
    const std::size_t want = std::max(floats, 2 * scratch_floats_);
    scratch_mr_.reset();
    scratch_ = internal::AllocateRegionMemory(want * sizeof(float));
    scratch_floats_ = 0;
    if (!scratch_) {
      return ResourceExhaustedError("allocating " + std::to_string(want * sizeof(float)) +
                                    " bytes of pull scratch failed: out of memory");
    }
    RDMAPS_ASSIGN_OR_RETURN(scratch_mr_, endpoint_->Register(scratch_.get(), want * sizeof(float),
                                                             transport::kAccessNone));
    scratch_floats_ = want;
  }
  std::vector<Run> runs;
  for (std::uint32_t si : plan.involved) {
    runs.push_back({si, plan.lo[si], plan.hi[si] - plan.lo[si] + 1, plan.scratch_row[si]});
  }
  auto* scratch = reinterpret_cast<float*>(scratch_.get());
  const Deadline deadline = CallDeadline();
  RDMAPS_RETURN_IF_ERROR(WaitReadable(t, plan.involved, deadline));
  RDMAPS_RETURN_IF_ERROR(pull_.Read(t, runs, {scratch, floats}, scratch_mr_.get(), deadline));
  internal::GatherFromSpans(t, num_servers(), plan, rows, scratch, out.data());
  stats_.Update([&](ClientStats& st) {
    ++st.pulls;
    ++st.span_pulls;
    st.rows_pulled += rows.size();
    st.bytes_staged += out.size_bytes();
  });
  return Status::OK();
}

// ---- push ----------------------------------------------------------------------

Status ClientImpl::Push(std::uint32_t table, RowRange range, std::span<const float> grads) {
  MutexLock lock(mu_);
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t,
                          CheckCall("Push", "gradient", table, range, grads.size()));
  if (range.count == 0) return Status::OK();
  const Deadline deadline = CallDeadline();
  const transport::MemoryRegion* mr = FindRegistered(grads.data(), grads.size_bytes());
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    return push_.PushRange(*t, range, grads, mr, clock_, deadline);
  }));
  pushed_this_clock_ = true;
  stats_.Update([&](ClientStats& st) {
    ++st.pushes;
    st.rows_pushed += range.count;
  });
  return Status::OK();
}

Status ClientImpl::Push(std::uint32_t table, std::span<const std::uint64_t> rows,
                        std::span<const float> grads) {
  MutexLock lock(mu_);
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t,
                          CheckCall("Push", "gradient", table, rows, grads.size()));
  if (rows.empty()) return Status::OK();
  const Deadline deadline = CallDeadline();
  const transport::MemoryRegion* mr = FindRegistered(grads.data(), grads.size_bytes());
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    return push_.PushRows(*t, rows, grads, mr, clock_, deadline);
  }));
  pushed_this_clock_ = true;
  stats_.Update([&](ClientStats& st) {
    ++st.pushes;
    st.rows_pushed += rows.size();
  });
  return Status::OK();
}

Status ClientImpl::PushPull(std::uint32_t table, RowRange range, std::span<const float> grads,
                            std::span<float> out) {
  const std::uint64_t epoch = Epoch();
  MutexLock lock(mu_);
  call_epoch_ = epoch;
  // Both buffers are checked before the push sends anything.
  RDMAPS_ASSIGN_OR_RETURN(const RemoteTable* t,
                          CheckCall("PushPull", "gradient", table, range, grads.size()));
  RDMAPS_RETURN_IF_ERROR(CheckBuffer("PushPull", "output", *t, range.count, out.size()));
  if (range.count == 0) return Status::OK();
  const Deadline deadline = CallDeadline();
  const transport::MemoryRegion* mr = FindRegistered(grads.data(), grads.size_bytes());
  const transport::MemoryRegion* out_mr = FindRegistered(out.data(), out.size_bytes());
  // Pipelined (src/ps/push_pull.h) into a registered output of a dense
  // table; never when the output overlaps the gradients (an in-place
  // PushPull: a row READ could land on gradients not sent yet).
  const auto* g0 = reinterpret_cast<const std::byte*>(grads.data());
  const auto* o0 = reinterpret_cast<const std::byte*>(out.data());
  const bool overlap = g0 < o0 + out.size_bytes() && o0 < g0 + grads.size_bytes();
  const bool pipelined = out_mr != nullptr && !t->inline_headers() && !overlap;
  const std::uint32_t stale = t->info.staleness;
  const std::uint64_t required = (stale == kAsp || clock_ < stale) ? 0 : clock_ - stale;
  std::uint64_t pipelined_rows = 0;
  const Status st = Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    std::vector<Run> runs;
    std::vector<std::uint32_t> involved;
    if (!pipelined) {
      RDMAPS_RETURN_IF_ERROR(push_.PushRange(*t, range, grads, mr, clock_, deadline));
      internal::RunsOfRange(*t, num_servers(), range, &runs, &involved);
    } else {
      // A fresh follower per attempt: a retry after a failover pulls anew.
      internal::RangeFollower follow(*t, range, out.data(), out_mr, required, &links_);
      RDMAPS_RETURN_IF_ERROR(push_.PushRange(*t, range, grads, mr, clock_, deadline, &follow));
      follow.Residual(&runs, &involved);
      pipelined_rows = follow.rows_verified();
      follower_torn_.fetch_add(follow.torn_blocks());
      const std::uint64_t bytes = follow.bytes_read(), torn = follow.torn_blocks();
      stats_.Update([&](ClientStats& cs) {
        cs.bytes_read += bytes;
        cs.torn_retries += torn;
        cs.rows_pulled_pipelined += pipelined_rows;
      });
      // Read-my-writes and the staleness bound on every server of the
      // range (already met where the follower pulled everything: no wait).
      std::vector<Run> all;
      involved.clear();
      internal::RunsOfRange(*t, num_servers(), range, &all, &involved);
    }
    RDMAPS_RETURN_IF_ERROR(WaitReadable(*t, involved, deadline));
    if (runs.empty()) return Status::OK();
    return pull_.Read(*t, runs, out, out_mr, deadline);
  });
  if (!st.ok()) return st;
  pushed_this_clock_ = true;
  stats_.Update([&](ClientStats& cs) {
    ++cs.pushes;
    cs.rows_pushed += range.count;
    ++cs.pulls;
    cs.rows_pulled += range.count;
    if (pipelined_rows > 0) ++cs.zero_copy_calls;
  });
  return Status::OK();
}

// ---- zero-copy buffers -------------------------------------------------------------

const transport::MemoryRegion* ClientImpl::FindRegistered(const void* p, std::size_t bytes) const {
  if (bytes == 0) return nullptr;
  for (const UserBuffer& b : user_buffers_) {
    if (b.mr->Contains(p, bytes)) return b.mr.get();
  }
  return nullptr;
}

Status ClientImpl::RegisterBuffer(std::span<float> buffer) {
  if (buffer.empty()) return InvalidArgumentError("RegisterBuffer: the buffer is empty");
  MutexLock lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  for (const UserBuffer& b : user_buffers_) {
    if (buffer.data() < b.data + b.floats && b.data < buffer.data() + buffer.size()) {
      return InvalidArgumentError("RegisterBuffer: [" + std::to_string(buffer.size()) +
                                  " floats] overlaps a buffer registered earlier; unregister it "
                                  "first or register one buffer that covers both");
    }
  }
  auto mr = endpoint_->Register(buffer.data(), buffer.size_bytes(), transport::kAccessNone);
  if (!mr.ok()) {
    return mr.status().WithContext("RegisterBuffer of " + std::to_string(buffer.size_bytes()) +
                                   " bytes");
  }
  user_buffers_.push_back({buffer.data(), buffer.size(), std::move(mr).value()});
  return Status::OK();
}

Status ClientImpl::UnregisterBuffer(std::span<float> buffer) {
  MutexLock lock(mu_);
  for (auto it = user_buffers_.begin(); it != user_buffers_.end(); ++it) {
    if (it->data == buffer.data() && it->floats == buffer.size()) {
      user_buffers_.erase(it);
      return Status::OK();
    }
  }
  return NotFoundError("UnregisterBuffer: this span (" + std::to_string(buffer.size()) +
                       " floats) was not given to RegisterBuffer");
}

// ---- Clock, Barrier, Close ---------------------------------------------------------

Result<std::uint64_t> ClientImpl::Clock() {
  const std::uint64_t epoch = Epoch();
  MutexLock lock(mu_);
  call_epoch_ = epoch;
  RDMAPS_RETURN_IF_ERROR(Usable());
  const Deadline deadline = CallDeadline();
  // Each server's control block is read behind the marker: a cut a server
  // published before this call began is relayed before the next marker.
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    return push_.SendControlSlot(SlotKind::kClock, clock_ + 1, deadline, /*read_control=*/true);
  }));
  ++clock_;
  pushed_this_clock_ = false;
  RDMAPS_RETURN_IF_ERROR(RelayCuts(deadline));
  const std::uint64_t now = clock_;
  stats_.Update([now](ClientStats& st) { st.clock = now; });
  // Do not run more than `bound` clocks ahead of the slowest worker.
  if (options_.clock_waits && clock_bound_ != kAsp && clock_ > clock_bound_) {
    std::vector<std::uint32_t> all(links_.size());
    for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
      return WaitForClocks(
          clock_ - clock_bound_, all,
          [&] {
            return "ending its iteration (staleness bound " + std::to_string(clock_bound_) + ")";
          },
          deadline);
    }));
  }
  return clock_;
}

Status ClientImpl::RelayCuts(Deadline deadline) {
  // Both parts fail over: the clock marker is sent and clock_ counted, so
  // an Unavailable here would leave the worker a clock ahead of a retried
  // Clock(). The sweep stays off: a shard neither part uses is not their
  // business. The cuts are fixed before any is sent, because a retried send
  // must rebuild the same slots (Failsafe).
  internal::ServerLinks::SweepOff sweep_off(links_);
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    std::vector<std::uint32_t> torn;
    for (const ServerLink& s : links_.servers()) {
      if (s.ctrl_torn) torn.push_back(s.index);
    }
    return torn.empty() ? Status::OK() : links_.ReadControl(torn, deadline);
  }));
  const std::uint64_t now = clock_;
  std::erase_if(relayed_cuts_, [now](std::uint64_t c) { return c < now; });
  std::vector<std::uint64_t> cuts;
  for (const ServerLink& s : links_.servers()) {
    if (s.ckpt.cut_plus1 == 0) continue;
    const std::uint64_t c = s.ckpt.cut_plus1 - 1;
    if (c < clock_ ||
        std::find(relayed_cuts_.begin(), relayed_cuts_.end(), c) != relayed_cuts_.end() ||
        std::find(cuts.begin(), cuts.end(), c) != cuts.end()) {
      continue;  // passed (so taken already), or relayed
    }
    cuts.push_back(c);
  }
  if (cuts.empty()) return Status::OK();
  if (test_before_cuts_) test_before_cuts_();
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    Status sent;
    for (std::size_t k = 0; k < cuts.size() && sent.ok(); ++k) {
      sent = push_.SendControlSlot(SlotKind::kCut, cuts[k], deadline);
    }
    return sent;
  }));
  relayed_cuts_.insert(relayed_cuts_.end(), cuts.begin(), cuts.end());
  return Status::OK();
}

Status ClientImpl::FlushLocked(Deadline deadline) {
  // Every server this worker pushed to has applied up to pushed_seq: the
  // control block is published after the rows (and their seals) changed, so
  // any READ posted after we saw it returns the new rows.
  std::vector<std::uint32_t> all(links_.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  return WaitForClocks(
      0, all, [] { return std::string("flushing its pushes"); }, deadline);
}

Status ClientImpl::WaitForClocks(std::uint64_t required, const std::vector<std::uint32_t>& servers,
                                 const std::function<std::string()>& why, Deadline deadline) {
  // The first slice costs what a plain wait does (the coarse clock, no
  // stats read): most waits end in it, most without waiting at all.
  Deadline slice = std::min(deadline, transport::CoarseNowCeil() + kInterruptPoll);
  // One look at the shard map per kMoveProbeEvery over all the slices.
  internal::MoveProbe probe(links_);
  Status st = links_.WaitForClocks(required, servers, clock_, why, slice, &probe);
  // TimedOut at a slice's end (not the call's) means: not yet.
  if (st.code() != StatusCode::kTimedOut || slice >= deadline) return st;
  // That slice counted this wait in pull_waits; the next ones must not.
  const std::uint64_t waits = stats_.Get().pull_waits;
  while (true) {
    if (Interrupted()) {
      st = InterruptedError("worker " + std::to_string(options_.worker_id) + " " + why());
      break;
    }
    slice = std::min(deadline, transport::CoarseNowCeil() + kInterruptPoll);
    st = links_.WaitForClocks(required, servers, clock_, why, slice, &probe);
    if (st.code() != StatusCode::kTimedOut || slice >= deadline) break;
  }
  stats_.Update([&](ClientStats& s) { s.pull_waits = std::min(s.pull_waits, waits); });
  return st;
}

Status ClientImpl::Flush() {
  const std::uint64_t epoch = Epoch();
  MutexLock lock(mu_);
  call_epoch_ = epoch;
  RDMAPS_RETURN_IF_ERROR(Usable());
  const Deadline deadline = CallDeadline();
  return Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) { return FlushLocked(deadline); });
}

Result<CheckpointInfo> ClientImpl::Checkpoint() {
  MutexLock lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  if (pushed_this_clock_) {
    return FailedPreconditionError(
        "Checkpoint() at clock " + std::to_string(clock_) + " of worker " +
        std::to_string(options_.worker_id) +
        " came after a push of that clock's iteration: call it right after Clock(), before the "
        "next iteration pushes (the checkpoint holds the pushes of earlier clocks only)");
  }
  const Deadline deadline = CallDeadline();
  const std::uint64_t want = clock_ + 1;
  // With failover: a shard whose primary is lost before its part is seen
  // durable lost the cut with it (a backup takes none, it only passes the
  // request on), so the call fails, retryably; the servers that took the
  // cut answer the retry at once (docs/ps.md, "Replication and failover").
  std::vector<std::uint64_t> epochs(links_.size());
  std::vector<bool> durable(links_.size(), false);
  for (std::uint32_t i = 0; i < links_.size(); ++i) epochs[i] = links_[i].epoch;
  RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
    return push_.SendControlSlot(SlotKind::kCheckpoint, clock_, deadline);
  }));
  std::vector<std::uint32_t> all(links_.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  const auto start = SteadyClock::now();
  internal::Backoff backoff;
  internal::MoveProbe probe(links_);
  while (true) {
    RDMAPS_RETURN_IF_ERROR(Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
      Status read = links_.ReadControl(all, deadline);
      return read.ok() ? probe.Check(all) : read;  // (a primary replaced while this waits)
    }));
    std::string pending;
    for (const ServerLink& s : links_.servers()) {
      if (!durable[s.index] && s.epoch != epochs[s.index]) {
        stats_.AddBlocked(SteadyClock::now() - start);
        return UnavailableError(
            "checkpoint at clock " + std::to_string(clock_) + ": shard " + std::to_string(s.index) +
            " failed over (epoch " + std::to_string(epochs[s.index]) + " -> " +
            std::to_string(s.epoch) +
            ") before its part was durable, and the cut was lost with its primary; call "
            "Checkpoint() again (every worker, still at this clock): the retry completes");
      }
      if (s.ckpt.durable_plus1 >= want) {
        durable[s.index] = true;
        continue;
      }
      if (s.ckpt.failed_plus1 == want) {
        stats_.AddBlocked(SteadyClock::now() - start);
        return FailedPreconditionError(
            "checkpoint at clock " + std::to_string(clock_) + " failed on " + ServerName(s) +
            ": see its log (no --checkpoint_dir, a disk error, or a worker that did not call "
            "Checkpoint() at this clock)");
      }
      pending += " " + ServerName(s);
    }
    if (pending.empty()) break;
    if (SteadyClock::now() >= deadline) {
      stats_.AddBlocked(SteadyClock::now() - start);
      return TimedOutError("checkpoint at clock " + std::to_string(clock_) +
                           " not durable within wait_timeout on" + pending +
                           "; is every worker calling Checkpoint() at this clock, and is the "
                           "disk slow?");
    }
    backoff.Pause();
  }
  stats_.AddBlocked(SteadyClock::now() - start);
  return CheckpointInfo{clock_, internal::CheckpointName(clock_)};
}

Status ClientImpl::RewindSurvivors(Deadline deadline) {
  const std::vector<std::uint64_t>& before = options_.rewind_from;
  std::vector<std::uint32_t> survivors;
  std::optional<std::uint64_t> restored_plus1;
  std::string restarted;
  // The recovery's id: the same for every worker (they see the same
  // restarted servers), new for each restart.
  std::uint64_t id = 0;
  for (const ServerLink& s : links_.servers()) {
    if (s.index < before.size() && s.ckpt.incarnation == before[s.index]) {
      survivors.push_back(s.index);
      continue;
    }
    if (restored_plus1 && *restored_plus1 != s.ckpt.restored_plus1) {
      return FailedPreconditionError(
          "the restarted servers" + restarted + " and " + ServerName(s) +
          " restored different checkpoints; restart them with the same --restore=auto");
    }
    restored_plus1 = s.ckpt.restored_plus1;
    restarted += " " + ServerName(s);
    std::uint64_t x = s.ckpt.incarnation ^ (std::uint64_t{s.index} * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's mixer
    id ^= x ^ (x >> 29);
  }
  if (!restored_plus1) {
    return UnavailableError(
        "no server has restarted since the failure yet (every incarnation "
        "id is the one before it)");
  }
  if (survivors.empty()) return Status::OK();  // every server restarted: nothing to rewind
  if (*restored_plus1 == 0) {
    return FailedPreconditionError(
        "restarted" + restarted +
        " started from the initialisers, not from a checkpoint, so the servers that survived "
        "cannot rewind to its state: restart it with --restore=auto once a checkpoint is "
        "complete, or restart every server");
  }
  const std::uint64_t c = *restored_plus1 - 1;
  if (id == 0) id = 1;
  // This session's sequence starts at 1 on each survivor, whatever the old
  // one had applied there.
  for (std::uint32_t i : survivors) links_[i].applied_seq = 0;
  RDMAPS_RETURN_IF_ERROR(push_.SendRewind(survivors, c, id, deadline));
  const std::uint32_t me = options_.worker_id;
  internal::Backoff backoff;
  while (true) {
    RDMAPS_RETURN_IF_ERROR(links_.ReadControl(survivors, deadline));
    std::string pending;
    for (std::uint32_t i : survivors) {
      const ServerLink& s = links_[i];
      // Done, and this session's own slots are the ones counted there (until
      // the server takes our first slot it shows the old session's count).
      if (s.ckpt.rewind_id != id || s.clocks[me].clock != c ||
          s.clocks[me].applied_seq > s.pushed_seq) {
        pending += " " + ServerName(s);
      }
    }
    if (pending.empty()) {
      // The words read before the rewind were of the old session and clocks:
      // ParseControl keeps the largest it saw, so set them from this read.
      for (std::uint32_t i : survivors) {
        ServerLink& s = links_[i];
        s.applied_seq = s.clocks[me].applied_seq;
        s.min_clock = internal::kClockDone;
        for (const internal::ControlWorker& cw : s.clocks)
          s.min_clock = std::min(s.min_clock, cw.clock);
      }
      return Status::OK();
    }
    if (SteadyClock::now() >= deadline) {
      return TimedOutError("asked" + pending + " to rewind to the checkpoint at clock " +
                           std::to_string(c) + " that" + restarted +
                           " restored; not done by the connect deadline (see their logs)");
    }
    backoff.Pause();
  }
}

Status ClientImpl::ReadStartClock(Deadline deadline) {
  std::vector<std::uint32_t> all(links_.size());
  for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  RDMAPS_RETURN_IF_ERROR(links_.ReadControl(all, deadline));
  if (!options_.rewind_from.empty()) RDMAPS_RETURN_IF_ERROR(RewindSurvivors(deadline));
  const std::uint32_t me = options_.worker_id;
  const ServerLink& first = links_[0];
  for (const ServerLink& s : links_.servers()) {
    if (s.clocks[me].clock != first.clocks[me].clock ||
        s.ckpt.restored_plus1 != first.ckpt.restored_plus1) {
      return FailedPreconditionError(
          ServerName(s) + " has worker " + std::to_string(me) + " at clock " +
          std::to_string(s.clocks[me].clock) + ", " + ServerName(first) + " at " +
          std::to_string(first.clocks[me].clock) +
          ": the servers restored different checkpoints (or some none); restart them all with "
          "the same --restore");
    }
  }
  for (std::size_t i = 0; i < options_.refuse_incarnations.size() && i < links_.size(); ++i) {
    if (links_[static_cast<std::uint32_t>(i)].ckpt.incarnation == options_.refuse_incarnations[i]) {
      return UnavailableError(ServerName(links_[static_cast<std::uint32_t>(i)]) +
                              " has not been restarted since (its incarnation id is one "
                              "ClientOptions.refuse_incarnations refuses)");
    }
  }
  clock_ = first.clocks[me].clock == internal::kClockDone ? 0 : first.clocks[me].clock;
  for (const ServerLink& s : links_.servers()) incarnations_.push_back(s.ckpt.incarnation);
  const std::uint64_t now = clock_;
  stats_.Update([now](ClientStats& st) { st.clock = now; });
  return Status::OK();
}

Status ClientImpl::Barrier() {
  const std::uint64_t epoch = Epoch();
  MutexLock lock(mu_);
  call_epoch_ = epoch;
  RDMAPS_RETURN_IF_ERROR(Usable());
  const Deadline deadline = CallDeadline();
  if (elastic_.elastic || options_.failover) {
    // Counted through the push rings (src/ps/join.h): the current members
    // in elastic mode; with failover, so that a replicated server 0's
    // backup holds every arrival (the atomics counter is not replicated).
    // Arrive only once this worker's pushes are applied (see below).
    RDMAPS_RETURN_IF_ERROR(
        Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) { return FlushLocked(deadline); }));
    const std::uint64_t generation = elastic_.barriers + 1;
    const auto start = SteadyClock::now();
    const std::uint64_t before = links_[0].pushed_seq;
    bool interrupted = false;
    Status st = Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
      return internal::SlotBarrier(
          links_, push_, generation, !elastic_.elastic,
          [this]() RDMAPS_REQUIRES(mu_) { return Interrupted(); }, &interrupted, deadline);
    });
    // Arrived once its slot was sent: the next Barrier() is the next
    // generation, unless this one was interrupted (it waits again).
    if (links_[0].pushed_seq > before && !interrupted) elastic_.barriers = generation;
    stats_.AddBlocked(SteadyClock::now() - start);
    return st;
  }
  ServerLink& s = links_[0];
  auto* result =
      reinterpret_cast<std::uint64_t*>(s.ctrl.get() + internal::RoundUp(s.ctrl_bytes, 8));
  const std::uint64_t W = options_.num_workers;
  Op op;
  std::uint64_t target = barrier_target_;  // an interrupted Barrier() arrived already
  if (target == 0) {
    // Arrive only once this worker's pushes are applied: then, when the last
    // worker arrives, every push made before the barrier is visible, whatever
    // the tables' staleness (ASP included).
    RDMAPS_RETURN_IF_ERROR(FlushLocked(deadline));
    op = Op::FetchAdd(result, s.ctrl_mr.get(), atomics_.addr, atomics_.rkey, 1);
    RDMAPS_RETURN_IF_ERROR(links_.Exec(s, {&op, 1}, deadline));
    target = (*result / W + 1) * W;
  }
  barrier_target_ = 0;
  const auto start = SteadyClock::now();
  internal::Backoff backoff;
  while (true) {
    // COMPARE_SWAP(0, 0) is an atomic read of a word only atomics touch.
    op = Op::CompareSwap(result, s.ctrl_mr.get(), atomics_.addr, atomics_.rkey, 0, 0);
    RDMAPS_RETURN_IF_ERROR(links_.Exec(s, {&op, 1}, deadline));
    if (*result >= target) break;
    // Server 0's control block says whether a worker died (and so will
    // never arrive): one READ beside each atomic read.
    RDMAPS_RETURN_IF_ERROR(links_.ReadControl({0}, deadline));
    if (Status died = links_.CheckNoneDied(
            {0}, internal::kClockDone, "Barrier of worker " + std::to_string(options_.worker_id));
        !died.ok()) {
      stats_.AddBlocked(SteadyClock::now() - start);
      return died;
    }
    if (Interrupted()) {
      stats_.AddBlocked(SteadyClock::now() - start);
      barrier_target_ = target;
      return InterruptedError("Barrier of worker " + std::to_string(options_.worker_id) +
                              " (arrived; its next Barrier() waits for the others)");
    }
    if (SteadyClock::now() >= deadline) {
      stats_.AddBlocked(SteadyClock::now() - start);
      // Who has not arrived is not recorded; the workers behind this one's
      // clock on server 0 (just read) are the likely ones (a stopped or
      // hung process keeps its connections open).
      std::string behind;
      const auto& clocks = links_[0].clocks;
      for (std::uint32_t w = 0; w < clocks.size(); ++w) {
        if (w != options_.worker_id && clocks[w].clock < clock_) {
          behind +=
              " worker " + std::to_string(w) + " (clock " + std::to_string(clocks[w].clock) + ")";
        }
      }
      return TimedOutError("Barrier: worker " + std::to_string(options_.worker_id) + " waited " +
                           "wait_timeout; only " + std::to_string(*result - (target - W)) + " of " +
                           std::to_string(W) + " workers arrived" +
                           (behind.empty()
                                ? std::string()
                                : "; behind this worker's clock " + std::to_string(clock_) +
                                      " on " + internal::ServerName(links_[0]) + ":" + behind) +
                           ". Are the others alive and calling Barrier()?");
    }
    backoff.Pause();
  }
  stats_.AddBlocked(SteadyClock::now() - start);
  return Status::OK();
}

Status ClientImpl::Close() {
  MutexLock lock(mu_);
  if (closed_) return Status::OK();
  closed_ = true;
  Status st;
  if (connected_ && links_.broken().ok()) {
    // With failover the goodbye follows a shard that moved (behind the
    // pushes its old primary had not acknowledged, resent by Recover), so
    // the new primary counts this worker done, not dead. The sweep stays
    // off: a shard this call does not reach is not its business.
    internal::ServerLinks::SweepOff sweep_off(links_);
    const Deadline deadline = SteadyClock::now() + std::chrono::seconds(10);
    st = Failsafe(deadline, [&]() RDMAPS_REQUIRES(mu_) {
      return push_.SendControlSlot(SlotKind::kBye, clock_, deadline);
    });
  }
  for (ServerLink& s : links_.servers()) {
    if (s.conn) s.conn->Close();
  }
  return st;
}

// ---- async -----------------------------------------------------------------------

Handle ClientImpl::Submit(std::function<Status()> fn, Callback done) {
  auto state = std::make_shared<Handle::State>(std::move(done));
  {
    MutexLock lock(exec_mu_);
    if (!executor_.joinable() && !exec_stop_) executor_ = std::thread([this] { ExecutorLoop(); });
    if (exec_stop_) {
      MutexLock slock(state->mu);
      state->done = true;
      state->status = CancelledError("the Client is being destroyed");
      return Handle(state);
    }
    queue_.emplace_back(std::move(fn), state);
  }
  exec_cv_.notify_one();
  return Handle(state);
}

void ClientImpl::ExecutorLoop() {
  MutexLock lock(exec_mu_);
  while (true) {
    while (!exec_stop_ && queue_.empty()) exec_cv_.wait(lock.native());
    if (queue_.empty()) return;  // stopping and drained
    auto [fn, state] = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    Status st = fn();
    Callback cb;
    {
      MutexLock slock(state->mu);
      state->status = st;
      state->done = true;
      cb = std::move(state->callback);
    }
    state->cv.notify_all();
    if (cb) cb(st);
    lock.Lock();
  }
}

void ClientImpl::StopExecutor() {
  {
    MutexLock lock(exec_mu_);
    exec_stop_ = true;
  }
  exec_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
}

}  // namespace

namespace internal {
transport::Endpoint* TEST_ClientEndpoint(Client& client) {
  return static_cast<ClientImpl&>(client).TEST_endpoint();
}
void TEST_Abandon(Client& client) { static_cast<ClientImpl&>(client).TEST_Abandon(); }
void TEST_BeforeRelayingCuts(Client& client, std::function<void()> hook) {
  static_cast<ClientImpl&>(client).TEST_BeforeRelayingCuts(std::move(hook));
}
std::uint64_t TEST_FollowerTornBlocks(Client& client) {
  return static_cast<ClientImpl&>(client).TEST_follower_torn();
}
}  // namespace internal

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  try {
    if (!options.failover && !options.failover_coordinator.address.empty()) {
      ClientOptions with = options;
      RDMAPS_ASSIGN_OR_RETURN(with.failover, OpenFailoverDecider(with.failover_coordinator));
      return Connect(with);
    }
    auto client = std::make_unique<ClientImpl>(options);
    RDMAPS_RETURN_IF_ERROR(client->Init());
    return std::unique_ptr<Client>(std::move(client));
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("rdmaps client: out of memory while connecting");
  } catch (const std::system_error& e) {
    return InternalError(std::string("rdmaps client: cannot start its threads: ") + e.what());
  }
}

}  // namespace rdmaps

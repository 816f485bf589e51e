// The worker side. One Connection per server, owned under mu_; every call
// builds its one-sided ops, posts them per server (servers are served in
// parallel) and drains the completions. Protocol: src/ps/wire.h.
#include "rdmaps/client.h"

#include <glog/logging.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "src/ps/common.h"
#include "src/ps/wire.h"
#include "src/ps/memory.h"
#include "src/ps/test_hooks.h"
#include "transport/transport.h"

namespace rdmaps {

struct Handle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  Callback callback;
};

Status Handle::Wait(std::chrono::steady_clock::time_point deadline) const {
  if (!state_) return FailedPreconditionError("Handle::Wait on an empty Handle");
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) {
    return TimedOutError("the asynchronous call has not finished by the deadline (it keeps "
                         "running; Wait again with a later deadline)");
  }
  return state_->status;
}

bool Handle::done() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

namespace {

using internal::AlignedBuffer;
using internal::BlockHeader;
using internal::ControlHead;
using internal::ControlWorker;
using internal::SlotHeader;
using internal::SlotKind;
using transport::Completion;
using transport::Deadline;
using transport::Op;
using SteadyClock = std::chrono::steady_clock;

// Ops one pull batch posts to a server (bounded by the connection's
// max_outstanding): a scattered pull of up to 256 rows is one round trip.
constexpr std::size_t kMaxOpsPerPost = 512;
// Large pulls are cut into READs of at most this size, so checking the rows of
// one overlaps the transfer of the next.
constexpr std::size_t kMaxReadBytes = 256 * 1024;
// Rows smaller than this are staged: their copy costs less than a segment's
// bookkeeping (measured on tcp: 64- and 256-byte rows pull 5-10 % faster
// staged).
constexpr std::size_t kScatterMinRowBytes = 1024;
// A push WRITEs gradients straight from a registered caller buffer when they
// are in at most this many pieces; more pieces are gathered by a copy.
constexpr std::size_t kMaxGatherRuns = 8;

struct ShardRemote {
  std::uint64_t begin = 0;
  std::uint64_t count = 0;
  std::uint64_t base = 0;  // the shard's region, laid out as `geo` says
  std::uint32_t rkey = 0;
  internal::ShardGeometry geo;
};

struct TableMeta {
  TableInfo info;
  std::uint32_t layout = internal::kLayoutDense;
  std::uint32_t rows_per_block = 1;  // the same on every shard
  std::size_t block_stride = 0;      // of the inline layout (the same on every shard)
  std::vector<ShardRemote> shards;   // per server
  // A dense table pulled by scattered ids was pointed at the inline layout
  // (logged once per client and table); ClientImpl::mu_.
  mutable bool layout_hint_logged = false;
  bool inline_headers() const { return layout == internal::kLayoutInline; }
};

// Caller memory registered with RegisterBuffer().
struct UserBuffer {
  const float* data = nullptr;
  std::size_t floats = 0;
  std::unique_ptr<transport::MemoryRegion> mr;
};

struct ServerLink {
  std::uint32_t index = 0;
  std::string address;
  std::unique_ptr<transport::Connection> conn;
  internal::DirectoryHeader dir{};
  internal::WireRegion ring{};
  AlignedBuffer staging;  // pulls
  std::unique_ptr<transport::MemoryRegion> staging_mr;
  std::size_t staging_bytes = 0;
  AlignedBuffer push;  // one slot
  std::unique_ptr<transport::MemoryRegion> push_mr;
  AlignedBuffer ctrl;  // control block copy, then 8 bytes for atomics
  std::unique_ptr<transport::MemoryRegion> ctrl_mr;
  std::size_t ctrl_bytes = 0;
  // Flow control and consistency state, as last read.
  std::uint64_t pushed_seq = 0;
  std::uint64_t applied_seq = 0;
  std::uint64_t min_clock = 0;
  std::vector<ControlWorker> clocks;
  // PostSlot added a READ of the control block behind the push (credits ran
  // low): refreshes applied_seq without an extra round trip.
  bool ctrl_inflight = false;
  // Ops PostSlot posted for the slot in flight (FinishSlot completes them).
  std::size_t slot_ops = 0;
};

// Rows [local, local + count) of one server's shard go to output rows
// [out_row, out_row + count).
struct Run {
  std::uint32_t server;
  std::uint64_t local;
  std::uint64_t count;
  std::uint64_t out_row;
};

// Checked blocks [block, block + count) of a server's shard, READ whole. Of
// their rows, the shard-local rows [lo, hi) are wanted, for output rows from
// out_row. `user`: the rows land in the caller's registered buffer (every
// row of the blocks is wanted); else in staging, copied out once they
// verify. Once placed in a batch: the first block's header at `headers`
// (then one per header stride), its first row at `rows` (then one block per
// row-block stride; ClientImpl::Strides).
struct Piece {
  std::uint64_t block, count, lo, hi, out_row;
  bool user;
  std::byte* headers;
  std::byte* rows;
};

// The ops of one pull batch, and the segments of its scattered READs (an
// op's `segments` point into `segments` only once Seal() has run: the
// vector grows while the batch is built).
struct ReadBatch {
  std::vector<Op> ops;
  std::vector<transport::Segment> segments;
  std::vector<std::size_t> first_segment;  // per op

  void clear() {
    ops.clear();
    segments.clear();
    first_segment.clear();
  }
  void Add(const Op& op) {
    ops.push_back(op);
    first_segment.push_back(segments.size());
  }
  std::span<const Op> Seal() {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].num_segments > 0) ops[i].segments = segments.data() + first_segment[i];
    }
    return ops;
  }
};

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(const ClientOptions& options) : options_(options) {}
  ~ClientImpl() override {
    StopExecutor();  // runs what is queued first
    (void)Close();
  }

  Status Init();

  std::uint32_t worker_id() const override { return options_.worker_id; }
  std::uint32_t num_workers() const override { return options_.num_workers; }
  std::uint32_t num_servers() const override {
    return static_cast<std::uint32_t>(servers_.size());
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
  Status Barrier() override;
  Status Close() override;

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

  ClientStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }
  std::uint64_t clock() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_.clock;
  }

  transport::Endpoint* TEST_endpoint() const { return endpoint_.get(); }

 private:
  // --- setup
  Status ConnectAll(Deadline deadline);
  Status ReadDirectories(Deadline deadline);

  // --- helpers (mu_ held)
  Result<const TableMeta*> CheckTable(std::uint32_t table) const;
  Status Usable() const;
  Status Fail(ServerLink& s, const Status& st);
  Status PostOps(ServerLink& s, std::span<const Op> ops);
  Status Drain(ServerLink& s, std::size_t n, Deadline deadline);
  Status Exec(ServerLink& s, std::span<const Op> ops, Deadline deadline);
  // Takes at least `at_least` and at most `at_most` completions of s (adds
  // how many to *completed); the first failed op fails the call.
  Status DrainSome(ServerLink& s, std::size_t at_least, std::size_t at_most,
                   std::size_t* completed, Deadline deadline);
  Status ReadControl(const std::vector<std::uint32_t>& servers, Deadline deadline);
  // Takes the control block in s.ctrl; false when it is torn.
  bool ParseControl(ServerLink& s);
  // Completes the slot PostSlot posted (and its piggybacked control READ).
  Status FinishSlot(ServerLink& s, Deadline deadline);
  // Polls the control blocks of `servers` until every worker's clock there
  // is >= required and each has applied this worker's pushes. TimedOut
  // naming the laggards (`why` says what waits) at the deadline.
  Status WaitForClocks(std::uint64_t required, const std::vector<std::uint32_t>& servers,
                       const std::function<std::string()>& why, Deadline deadline);
  Status WaitReadable(const TableMeta& t, const std::vector<std::uint32_t>& servers,
                      Deadline deadline);
  Status ReadRuns(const TableMeta& t, std::vector<Run> runs, std::span<float> out,
                  Deadline deadline);
  Status EnsureCredit(ServerLink& s, Deadline deadline);
  // The registered caller buffer holding [p, p + bytes), or null.
  const transport::MemoryRegion* FindRegistered(const void* p, std::size_t bytes) const;
  std::uint64_t ScatterInline(const TableMeta& t, const std::vector<Run>& runs) const;
  // Remote address of the ring slot of push `seq` on `s`.
  static std::uint64_t SlotAddress(const ServerLink& s, std::uint64_t seq) {
    return s.ring.addr + (seq - 1) % s.dir.ring_slots * s.dir.slot_bytes;
  }
  // Sends the next slot as ONE WRITE_WITH_IMM: the first `bytes` of s.push
  // (the header and whatever payload is staged there), then `data` (pieces
  // of the caller's registered memory, zero-copy; may be empty), gathered.
  // Where the connection takes fewer segments, the pieces go first as
  // WRITEs of their own and the immediate last, so the server sees it only
  // after every piece's data (transport.h's ordering rule).
  Status PostSlot(ServerLink& s, SlotHeader h, std::size_t bytes,
                  std::span<const transport::Segment> data = {});
  Status PushRange(const TableMeta& t, RowRange range, std::span<const float> grads,
                   Deadline deadline);
  Status PushRows(const TableMeta& t, std::span<const std::uint64_t> rows,
                  std::span<const float> grads, Deadline deadline);
  Status SendControlSlot(SlotKind kind, std::uint64_t clock, Deadline deadline);
  // On error, completes the ops already posted to `posted` (one each) so the
  // connections stay in step, and returns `st`.
  Status DrainOnError(const std::vector<std::uint32_t>& posted, Status st, Deadline deadline) {
    if (st.ok()) return st;
    for (std::uint32_t si : posted) (void)FinishSlot(servers_[si], deadline);
    return st;
  }
  Deadline CallDeadline() const { return transport::CoarseNowCeil() + options_.wait_timeout; }
  void AddBlocked(SteadyClock::duration d) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.blocked_time += std::chrono::duration_cast<std::chrono::nanoseconds>(d);
  }

  // --- async
  Handle Submit(std::function<Status()> fn, Callback done);
  void ExecutorLoop();
  void StopExecutor();

  // Constant after Init().
  const ClientOptions options_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  AlignedBuffer boot_;
  std::unique_ptr<transport::MemoryRegion> boot_mr_;
  std::unordered_map<std::uint32_t, TableMeta> tables_;
  // The smallest staleness bound of the tables (Clock() waits by it).
  std::uint32_t clock_bound_ = kAsp;
  internal::WireRegion atomics_{};  // server 0's barrier counter

  // Protected by mu_ (serialises all network use).
  std::mutex mu_;
  std::vector<ServerLink> servers_;
  std::vector<UserBuffer> user_buffers_;
  // ReadRuns' scratch, kept for its capacity; mu_.
  ReadBatch read_batch_;
  std::vector<std::deque<Piece>> block_queues_;
  std::vector<std::vector<Piece>> pieces_;
  std::uint64_t clock_ = 0;
  Status broken_;
  bool closed_ = false;

  mutable std::mutex stats_mu_;
  ClientStats stats_;

  // Async executor.
  std::mutex exec_mu_;
  std::condition_variable exec_cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<Handle::State>>> queue_;
  bool exec_stop_ = false;
  std::thread executor_;
};

std::string ServerName(const ServerLink& s) {
  return "server " + std::to_string(s.index) + " (" + s.address + ")";
}

// Sleeps a growing amount between polls: spin a little, then 1 us .. 1 ms.
class Backoff {
 public:
  void Pause() {
    if (n_++ < 16) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int n_ = 0;
  std::chrono::microseconds delay_{1};
};

Status ClientImpl::Init() {
  if (options_.num_workers == 0 || options_.worker_id >= options_.num_workers) {
    return InvalidArgumentError("ClientOptions.worker_id " + std::to_string(options_.worker_id) +
                                " must be < num_workers " +
                                std::to_string(options_.num_workers));
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
  const Deadline deadline = SteadyClock::now() + options_.connect_timeout;
  RDMAPS_RETURN_IF_ERROR(ConnectAll(deadline));
  RDMAPS_RETURN_IF_ERROR(ReadDirectories(deadline));
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
  transport::ConnectOptions copts;
  copts.user_data.resize(sizeof(hello));
  std::memcpy(copts.user_data.data(), &hello, sizeof(hello));

  servers_.resize(S);
  for (std::uint32_t i = 0; i < S; ++i) {
    ServerLink& s = servers_[i];
    s.index = i;
    s.address = options_.servers[i];
    Backoff backoff;
    while (true) {
      auto r = endpoint_->Connect(s.address, copts, deadline);
      if (r.ok()) {
        s.conn = std::move(r).value();
        break;
      }
      // A server may not listen yet when the launcher starts everyone at once.
      if (r.status().code() != StatusCode::kUnavailable || SteadyClock::now() >= deadline) {
        std::string missing;
        for (std::uint32_t j = i; j < S; ++j) missing += " " + options_.servers[j];
        return r.status().WithContext("worker " + std::to_string(options_.worker_id) +
                                      " connecting to " + ServerName(s) +
                                      " (not yet connected:" + missing +
                                      "); is the server running and the address right?");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      (void)backoff;
    }
  }
  // Each server WRITE_WITH_IMMs where its directory is.
  std::vector<bool> got(S, false);
  std::size_t n_got = 0;
  std::vector<transport::Notification> notes(16);
  while (n_got < S) {
    auto r = endpoint_->WaitNotifications(notes, deadline);
    if (!r.ok()) return r.status().WithContext("waiting for the servers' bootstrap messages");
    if (*r == 0) {
      std::string missing;
      for (std::uint32_t j = 0; j < S; ++j) {
        if (!got[j]) missing += " " + std::to_string(j) + " (" + options_.servers[j] + ")";
      }
      return TimedOutError("worker " + std::to_string(options_.worker_id) +
                           ": no bootstrap message from servers" + missing +
                           " before connect_timeout; they accepted the connection but did not "
                           "answer (check the server logs: worker id vs --num_workers?)");
    }
    for (std::size_t k = 0; k < *r; ++k) {
      const auto& n = notes[k];
      if (n.kind != transport::Notification::Kind::kImmediate) continue;
      if ((n.imm & internal::kBootstrapImm) == 0) continue;
      const std::uint32_t idx = n.imm & ~internal::kBootstrapImm;
      if (idx < S && !got[idx]) {
        got[idx] = true;
        ++n_got;
      }
    }
  }
  return Status::OK();
}

Status ClientImpl::ReadDirectories(Deadline deadline) {
  const std::uint32_t S = static_cast<std::uint32_t>(servers_.size());
  bool first = true;
  for (ServerLink& s : servers_) {
    internal::BootstrapMsg b;
    std::memcpy(&b, boot_.get() + s.index * internal::kBootstrapSlotBytes, sizeof(b));
    if (b.magic != internal::kBootstrapMagic || b.server_index != s.index) {
      return FailedPreconditionError(
          ServerName(s) + " sent a bootstrap message for server index " +
          std::to_string(b.server_index) +
          ": the worker's server list order must match each server's --server_index");
    }
    auto dir_buf = internal::AllocateRegionMemory(b.directory.length);
    if (!dir_buf) return ResourceExhaustedError("allocating the directory copy failed");
    RDMAPS_ASSIGN_OR_RETURN(auto dir_mr, endpoint_->Register(dir_buf.get(), b.directory.length,
                                                             transport::kAccessNone));
    const Op op = Op::Read(dir_buf.get(), dir_mr.get(), b.directory.length, b.directory.addr,
                           b.directory.rkey);
    RDMAPS_RETURN_IF_ERROR(Exec(s, {&op, 1}, deadline));
    if (b.directory.length < sizeof(internal::DirectoryHeader)) {
      return DataLossError(ServerName(s) + ": directory too short");
    }
    std::memcpy(&s.dir, dir_buf.get(), sizeof(s.dir));
    const internal::DirectoryHeader& h = s.dir;
    if (h.magic != internal::kDirectoryMagic || h.layout_version != internal::kLayoutVersion) {
      return FailedPreconditionError(ServerName(s) + ": directory layout version " +
                                     std::to_string(h.layout_version) + ", this client speaks " +
                                     std::to_string(internal::kLayoutVersion) +
                                     "; run the same rdmaps build everywhere");
    }
    if (h.num_servers != S || h.server_index != s.index || h.num_workers != options_.num_workers) {
      return FailedPreconditionError(
          ServerName(s) + " believes it is server " + std::to_string(h.server_index) + " of " +
          std::to_string(h.num_servers) + " with " + std::to_string(h.num_workers) +
          " workers; this worker was given " + std::to_string(S) + " servers and " +
          std::to_string(options_.num_workers) + " workers. Start everyone with the same layout");
    }
    if (b.directory.length < internal::DirectoryBytes(h.num_tables, h.num_workers)) {
      return DataLossError(ServerName(s) + ": directory shorter than its header says");
    }
    const std::byte* p = dir_buf.get() + sizeof(h);
    std::size_t max_row = 0;  // staging must hold one row and its header
    for (std::uint32_t i = 0; i < h.num_tables; ++i, p += sizeof(internal::DirectoryTable)) {
      internal::DirectoryTable d;
      std::memcpy(&d, p, sizeof(d));
      d.name[sizeof(d.name) - 1] = '\0';
      // Staging must hold one block of every table, with its header.
      max_row = std::max<std::size_t>(
          {max_row, std::size_t{d.rows_per_block} * internal::RowBytes(d.dim) + sizeof(BlockHeader),
           d.block_stride});
      auto it = tables_.find(d.id);
      if (first) {
        if (it != tables_.end()) {
          return DataLossError(ServerName(s) + ": directory lists table " +
                               std::to_string(d.id) + " twice");
        }
        TableMeta m;
        m.info.id = d.id;
        m.info.name = d.name;
        m.info.rows = d.rows;
        m.info.dim = d.dim;
        m.info.staleness = d.staleness;
        m.info.layout = static_cast<RowLayout>(d.layout);
        m.layout = d.layout;
        m.rows_per_block = d.rows_per_block;
        m.block_stride = d.block_stride;
        if (d.layout != internal::kLayoutDense && d.layout != internal::kLayoutInline) {
          return FailedPreconditionError(ServerName(s) + ": table '" + d.name +
                                         "' has row layout " + std::to_string(d.layout) +
                                         ", which this client does not know; run the same "
                                         "rdmaps build everywhere");
        }
        if (options_.staleness_override) {
          m.info.staleness = std::min(m.info.staleness, *options_.staleness_override);
        }
        m.shards.resize(S);
        it = tables_.emplace(d.id, std::move(m)).first;
      } else if (it == tables_.end() || it->second.info.rows != d.rows ||
                 it->second.info.dim != d.dim || it->second.info.name != d.name ||
                 it->second.layout != d.layout) {
        return FailedPreconditionError(ServerName(s) + " publishes table " +
                                       std::to_string(d.id) + " ('" + d.name +
                                       "') differently from server 0; give every server the "
                                       "same table list");
      }
      const internal::ShardRange expect = internal::PartitionOf(d.rows, S, s.index);
      const internal::ShardGeometry g = internal::GeometryOf(
          d.layout, d.shard_rows, d.dim, internal::RowsPerBlock(d.layout, d.rows, d.dim, S));
      if (d.shard_begin != expect.begin || d.shard_rows != expect.count ||
          d.row_bytes != internal::RowBytes(d.dim) || d.headers_offset != g.headers_offset ||
          d.rows_per_block != g.rows_per_block || d.block_stride != g.block_stride ||
          d.shard.length < g.bytes) {
        return FailedPreconditionError(ServerName(s) + ": shard of table '" + d.name +
                                       "' is not the range partition and layout this client "
                                       "computes; run the same rdmaps build everywhere");
      }
      it->second.shards[s.index] = {d.shard_begin, d.shard_rows, d.shard.addr, d.shard.rkey, g};
    }
    if (!first && h.num_tables != tables_.size()) {
      return FailedPreconditionError(ServerName(s) + " has " + std::to_string(h.num_tables) +
                                     " tables, server 0 has " + std::to_string(tables_.size()) +
                                     "; give every server the same table list");
    }
    std::memcpy(&s.ring, p + options_.worker_id * sizeof(internal::DirectoryWorker),
                sizeof(s.ring));
    if (first) atomics_ = h.atomics;
    first = false;

    // Registered buffers for this server.
    s.staging_bytes = std::max(options_.staging_bytes, max_row);
    s.staging = internal::AllocateRegionMemory(s.staging_bytes);
    s.push = internal::AllocateRegionMemory(h.slot_bytes);
    s.ctrl_bytes = internal::ControlBlockBytes(h.num_workers);
    s.ctrl = internal::AllocateRegionMemory(internal::RoundUp(s.ctrl_bytes, 8) + 8);
    if (!s.staging || !s.push || !s.ctrl) {
      return ResourceExhaustedError("allocating client staging memory failed; lower "
                                    "ClientOptions.staging_bytes");
    }
    RDMAPS_ASSIGN_OR_RETURN(s.staging_mr, endpoint_->Register(s.staging.get(), s.staging_bytes,
                                                              transport::kAccessNone));
    RDMAPS_ASSIGN_OR_RETURN(s.push_mr,
                            endpoint_->Register(s.push.get(), h.slot_bytes, transport::kAccessNone));
    RDMAPS_ASSIGN_OR_RETURN(
        s.ctrl_mr, endpoint_->Register(s.ctrl.get(), internal::RoundUp(s.ctrl_bytes, 8) + 8,
                                       transport::kAccessNone));
    s.clocks.assign(h.num_workers, ControlWorker{});
  }
  for (const auto& [id, t] : tables_) clock_bound_ = std::min(clock_bound_, t.info.staleness);
  for (const TableOptions& want : options_.tables) {
    auto it = tables_.find(want.id);
    if (it == tables_.end() || it->second.info.name != want.name ||
        it->second.info.rows != want.rows || it->second.info.dim != want.dim ||
        it->second.layout != internal::ResolveRowLayout(static_cast<std::uint32_t>(want.layout),
                                                     want.rows, want.dim, num_servers())) {
      return FailedPreconditionError("table " + std::to_string(want.id) + " ('" + want.name +
                                     "') of ClientOptions.tables is not what the servers "
                                     "publish; give workers and servers the same table list");
    }
  }
  return Status::OK();
}

// ---- helpers -----------------------------------------------------------------

Result<const TableMeta*> ClientImpl::CheckTable(std::uint32_t table) const {
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
  return broken_;
}

Status ClientImpl::Fail(ServerLink& s, const Status& st) {
  Status err = st.WithContext("worker " + std::to_string(options_.worker_id) + ", " +
                              ServerName(s));
  if (broken_.ok()) {
    broken_ = Status(StatusCode::kUnavailable, "an earlier transport error broke this Client: " +
                                                   err.ToString());
  }
  return err;
}

Status ClientImpl::PostOps(ServerLink& s, std::span<const Op> ops) {
  Status st = s.conn->Post(ops);
  if (!st.ok()) return Fail(s, st);
  return Status::OK();
}

Status ClientImpl::Drain(ServerLink& s, std::size_t n, Deadline deadline) {
  std::size_t completed = 0;
  return DrainSome(s, n, n, &completed, deadline);
}

Status ClientImpl::DrainSome(ServerLink& s, std::size_t at_least, std::size_t at_most,
                             std::size_t* completed, Deadline deadline) {
  Completion c[64];
  std::size_t got = 0;
  Status first;
  while (got < at_least) {
    auto r = s.conn->Wait({c, std::min<std::size_t>(at_most - got, 64)}, deadline);
    if (!r.ok()) return Fail(s, r.status());
    if (*r == 0) return Fail(s, TimedOutError("no completion by the deadline"));
    for (std::size_t i = 0; i < *r; ++i) {
      if (!c[i].status.ok() && first.ok()) first = c[i].status;
    }
    got += *r;
  }
  *completed += got;
  if (!first.ok()) return Fail(s, first);
  return Status::OK();
}

Status ClientImpl::Exec(ServerLink& s, std::span<const Op> ops, Deadline deadline) {
  RDMAPS_RETURN_IF_ERROR(PostOps(s, ops));
  return Drain(s, ops.size(), deadline);
}

bool ClientImpl::ParseControl(ServerLink& s) {
  const std::uint32_t W = s.dir.num_workers;
  if (!internal::VerifyBlock(s.ctrl.get(), internal::ControlPayloadBytes(W))) return false;
  const std::byte* p = s.ctrl.get() + sizeof(BlockHeader);
  ControlHead head;
  std::memcpy(&head, p, sizeof(head));
  std::memcpy(s.clocks.data(), p + sizeof(head), W * sizeof(ControlWorker));
  // The newest knowledge wins (a piggybacked read may be older than a poll).
  s.min_clock = std::max(s.min_clock, head.min_clock);
  s.applied_seq = std::max(s.applied_seq, s.clocks[options_.worker_id].applied_seq);
  return true;
}

Status ClientImpl::FinishSlot(ServerLink& s, Deadline deadline) {
  const bool ctrl = s.ctrl_inflight;
  const std::size_t n = s.slot_ops;
  s.ctrl_inflight = false;
  s.slot_ops = 0;
  RDMAPS_RETURN_IF_ERROR(Drain(s, n, deadline));
  if (ctrl) {
    (void)ParseControl(s);  // torn: ignore, a later poll will tell
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.clock_reads;
  }
  return Status::OK();
}

Status ClientImpl::ReadControl(const std::vector<std::uint32_t>& servers, Deadline deadline) {
  std::vector<std::uint32_t> todo = servers;
  while (!todo.empty()) {
    for (std::uint32_t i : todo) {
      ServerLink& s = servers_[i];
      const Op op = Op::Read(s.ctrl.get(), s.ctrl_mr.get(), s.ctrl_bytes, s.dir.control.addr,
                             s.dir.control.rkey);
      RDMAPS_RETURN_IF_ERROR(PostOps(s, {&op, 1}));
    }
    std::vector<std::uint32_t> torn;
    for (std::uint32_t i : todo) {
      ServerLink& s = servers_[i];
      RDMAPS_RETURN_IF_ERROR(Drain(s, 1, deadline));
      if (!ParseControl(s)) torn.push_back(i);
    }
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.clock_reads += todo.size();
      stats_.torn_retries += torn.size();
    }
    if (!torn.empty() && SteadyClock::now() >= deadline) {
      return TimedOutError("the control block of server " + std::to_string(torn[0]) +
                           " stayed torn until the deadline");
    }
    todo = std::move(torn);
  }
  return Status::OK();
}

Status ClientImpl::WaitForClocks(std::uint64_t required, const std::vector<std::uint32_t>& servers,
                                 const std::function<std::string()>& why, Deadline deadline) {
  auto pending = [&] {
    std::vector<std::uint32_t> p;
    for (std::uint32_t i : servers) {
      const ServerLink& s = servers_[i];
      if (s.min_clock < required || s.applied_seq < s.pushed_seq) p.push_back(i);
    }
    return p;
  };
  std::vector<std::uint32_t> p = pending();
  if (p.empty()) return Status::OK();
  const auto start = SteadyClock::now();
  bool waited = false;
  Backoff backoff;
  while (true) {
    RDMAPS_RETURN_IF_ERROR(ReadControl(p, deadline));
    p = pending();
    if (p.empty()) break;
    if (!waited) {
      waited = true;
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.pull_waits;
    }
    if (SteadyClock::now() >= deadline) {
      AddBlocked(SteadyClock::now() - start);
      const ServerLink& s = servers_[p[0]];
      std::string lagging;
      for (std::uint32_t w = 0; w < s.clocks.size(); ++w) {
        if (s.clocks[w].clock < required) {
          lagging += " worker " + std::to_string(w) + " (clock " +
                     std::to_string(s.clocks[w].clock) + ")";
        }
      }
      if (lagging.empty()) {
        return TimedOutError(ServerName(s) + " has applied push " +
                             std::to_string(s.applied_seq) + " of this worker's " +
                             std::to_string(s.pushed_seq) +
                             " within wait_timeout: the server is overloaded or stuck");
      }
      return TimedOutError("worker " + std::to_string(options_.worker_id) + " at clock " +
                           std::to_string(clock_) + " " + why() +
                           " needs every worker at clock >= " + std::to_string(required) + " on " +
                           ServerName(s) + "; lagging:" + lagging +
                           ". Are those workers alive and calling Clock()?");
    }
    backoff.Pause();
  }
  AddBlocked(SteadyClock::now() - start);
  return Status::OK();
}

Status ClientImpl::WaitReadable(const TableMeta& t, const std::vector<std::uint32_t>& servers,
                                Deadline deadline) {
  const std::uint32_t st = t.info.staleness;
  const std::uint64_t required = (st == kAsp || clock_ < st) ? 0 : clock_ - st;
  RDMAPS_RETURN_IF_ERROR(WaitForClocks(
      required, servers,
      [&] { return "pulling table '" + t.info.name + "' (staleness " + std::to_string(st) + ")"; },
      deadline));
  std::uint64_t min_seen = internal::kClockDone;
  for (std::uint32_t i : servers) min_seen = std::min(min_seen, servers_[i].min_clock);
  const std::uint64_t staleness = min_seen >= clock_ ? 0 : clock_ - min_seen;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.staleness_sum += staleness;
  stats_.staleness_max = std::max(stats_.staleness_max, staleness);
  ++stats_.staleness_samples;
  return Status::OK();
}

// Header and row-block strides of a piece's blocks where they land: inline
// blocks in staging keep their remote layout (header, rows, padding); rows
// in the caller's buffer or in dense staging lie back to back.
struct Strides {
  std::size_t header;
  std::size_t rows;
};
Strides StridesOf(const TableMeta& t, bool user) {
  const std::size_t block_rows = t.rows_per_block * internal::RowBytes(t.info.dim);
  if (!t.inline_headers()) return {sizeof(BlockHeader), block_rows};
  return {t.block_stride, user ? block_rows : t.block_stride};
}

// The READs of the blocks of `pc` (placed): for a dense table the rows (to
// pc.rows) and their headers (to pc.headers); for an inline table both at
// once, into staging or, with a registered caller buffer (blocks of one row,
// ScatterInline), scattered: each header (and the row's padding) to staging,
// each row to the caller's buffer. Returns the bytes they move.
std::size_t AddBlockReads(const ShardRemote& shard, const transport::MemoryRegion* staging,
                          const transport::MemoryRegion* user_mr, const Piece& pc,
                          ReadBatch* batch) {
  const internal::ShardGeometry& g = shard.geo;
  const std::size_t row_bytes = g.row_bytes;
  if (g.inline_headers()) {
    const std::uint64_t remote = shard.base + g.header(pc.block);
    if (!pc.user) {
      // Up to the last row (a shard's last block may be short).
      const std::uint64_t last = pc.block + pc.count - 1;
      const std::size_t bytes =
          (pc.count - 1) * g.block_stride + sizeof(BlockHeader) + g.block_rows(last) * row_bytes;
      batch->Add(Op::Read(pc.headers, staging, bytes, remote, shard.rkey));
      return bytes;
    }
    const std::size_t bytes = pc.count * g.block_stride;
    const auto row = static_cast<std::uint32_t>(row_bytes);
    const auto pad = static_cast<std::uint32_t>(g.block_stride - sizeof(BlockHeader) - row_bytes);
    batch->Add(Op::Read(nullptr, nullptr, bytes, remote, shard.rkey));
    for (std::uint64_t k = 0; k < pc.count; ++k) {
      std::byte* header = pc.headers + k * g.block_stride;
      batch->segments.push_back({header, staging, sizeof(BlockHeader)});
      batch->segments.push_back({pc.rows + k * row_bytes, user_mr, row});
      if (pad > 0) batch->segments.push_back({header + sizeof(BlockHeader), staging, pad});
    }
    batch->ops.back().num_segments = static_cast<std::uint32_t>(pc.count * (pad > 0 ? 3 : 2));
    return bytes;
  }
  const std::uint64_t first = g.first_row(pc.block);
  const std::size_t rows = (g.end_row(pc.block + pc.count - 1) - first) * row_bytes;
  batch->Add(
      Op::Read(pc.rows, pc.user ? user_mr : staging, rows, shard.base + g.row(first), shard.rkey));
  batch->Add(Op::Read(pc.headers, staging, pc.count * sizeof(BlockHeader),
                      shard.base + g.header(pc.block), shard.rkey));
  return rows + pc.count * sizeof(BlockHeader);
}

// Block k of `pc` as a piece of its own (where it already landed).
Piece BlockOf(const TableMeta& t, const internal::ShardGeometry& g, const Piece& pc,
              std::uint64_t k) {
  const Strides st = StridesOf(t, pc.user);
  Piece one = pc;
  one.block = pc.block + k;
  one.count = 1;
  one.lo = std::max(pc.lo, g.first_row(one.block));
  one.hi = std::min(pc.hi, g.end_row(one.block));
  one.out_row = pc.out_row + (one.lo - pc.lo);
  one.headers += k * st.header;
  one.rows += k * st.rows;
  return one;
}

// "row 7" or, for a block of several rows, "rows 0-24 (one checked block)".
std::string BlockName(const ShardRemote& shard, std::uint64_t block) {
  const std::uint64_t first = shard.begin + shard.geo.first_row(block);
  const std::uint64_t last = shard.begin + shard.geo.end_row(block) - 1;
  if (first == last) return "row " + std::to_string(first);
  return "rows " + std::to_string(first) + "-" + std::to_string(last) + " (one checked block)";
}

// Whether a pull of an inline table into a registered buffer scatters each
// row READ into header and row (zero-copy) or stages it. Rows under
// kScatterMinRowBytes are staged (so blocks of several rows, which only rows
// under internal::kBlockMinRowBytes get, always are). A scattered READ
// carries at most max_segments() / (2 or 3, with padding) rows, so it is
// chosen only when that takes no more ops than staging: always on tcp; on
// verbs (16 segments) for runs of up to 8 rows. More ops cost more than the
// copy on Soft-RoCE (64 rows of 1 KiB: 1.36x raw in 8 scattered READs, 1.19x
// staged). Returns rows per scattered READ, or 0 to stage.
std::uint64_t ClientImpl::ScatterInline(const TableMeta& t, const std::vector<Run>& runs) const {
  const std::size_t row_bytes = internal::RowBytes(t.info.dim);
  static_assert(kScatterMinRowBytes >= internal::kBlockMinRowBytes);
  if (row_bytes < kScatterMinRowBytes) return 0;
  const std::size_t segs_per_row = t.block_stride > sizeof(BlockHeader) + row_bytes ? 3 : 2;
  std::uint64_t rows_per_read = std::numeric_limits<std::uint64_t>::max();
  for (const Run& r : runs) {
    rows_per_read = std::min<std::uint64_t>(rows_per_read,
                                            servers_[r.server].conn->max_segments() / segs_per_row);
  }
  if (runs.empty() || rows_per_read == 0) return 0;
  const std::uint64_t staged_rows_per_read =
      std::max<std::size_t>(1, kMaxReadBytes / t.block_stride);
  for (const Run& r : runs) {
    if ((r.count + rows_per_read - 1) / rows_per_read >
        (r.count + staged_rows_per_read - 1) / staged_rows_per_read) {
      return 0;
    }
  }
  return rows_per_read;
}

Status ClientImpl::ReadRuns(const TableMeta& t, std::vector<Run> runs, std::span<float> out,
                            Deadline deadline) {
  const std::uint32_t dim = t.info.dim;
  const std::size_t row_bytes = internal::RowBytes(dim);
  auto* out_bytes = reinterpret_cast<std::byte*>(out.data());
  // Rows land straight in `out` when the caller registered it (zero-copy),
  // except for blocks only partly wanted; otherwise in staging, and are
  // copied out once they verify. Headers always go to staging.
  // Inline tables READ headers and rows together (one op per piece),
  // scattered into header and row when zero-copy (ScatterInline says when).
  const bool inl = t.inline_headers();
  const transport::MemoryRegion* user_mr = FindRegistered(out.data(), out.size_bytes());
  std::uint64_t max_blocks_per_scatter = 0;
  if (inl && user_mr) {
    max_blocks_per_scatter = ScatterInline(t, runs);
    if (max_blocks_per_scatter == 0) user_mr = nullptr;
  }
  const std::size_t ops_per_piece = inl ? 1 : 2;
  const std::size_t block_bytes = t.rows_per_block * row_bytes;
  // Remote bytes one READ moves per block, and staging bytes per block.
  const std::size_t read_block = inl ? t.block_stride : block_bytes;
  auto staged_block = [&](bool user) {
    return inl ? t.block_stride : sizeof(BlockHeader) + (user ? 0 : block_bytes);
  };
  std::uint64_t max_blocks_per_op = std::max<std::uint64_t>(1, kMaxReadBytes / read_block);
  if (max_blocks_per_scatter > 0) {
    max_blocks_per_op = std::min(max_blocks_per_op, max_blocks_per_scatter);
  }
  // The blocks each server must READ, consumed front to back, and the
  // pieces of them in flight. Blocks wholly wanted land in the caller's
  // buffer (zero-copy); a partly wanted block at either end of a run is
  // staged.
  auto& queues = block_queues_;
  auto& pieces = pieces_;
  queues.resize(servers_.size());
  pieces.resize(servers_.size());
  for (auto& q : queues) q.clear();
  bool any_user = false;
  for (const Run& r : runs) {
    const internal::ShardGeometry& g = t.shards[r.server].geo;
    const std::uint64_t lo = r.local, hi = r.local + r.count;
    const std::uint64_t b0 = g.block_of(lo), b1 = g.block_of(hi - 1) + 1;
    auto add = [&](std::uint64_t from, std::uint64_t to, bool user) {
      const std::uint64_t l = std::max(lo, g.first_row(from));
      queues[r.server].push_back({from, to - from, l, std::min(hi, g.end_row(to - 1)),
                                  r.out_row + (l - lo), user, nullptr, nullptr});
      any_user |= user;
    };
    const std::uint64_t f0 = g.first_row(b0) == lo ? b0 : b0 + 1;
    const std::uint64_t f1 = g.end_row(b1 - 1) == hi ? b1 : b1 - 1;
    if (!user_mr || f0 >= f1) {
      add(b0, b1, false);
      continue;
    }
    if (b0 < f0) add(b0, f0, false);
    add(f0, f1, true);
    if (f1 < b1) add(f1, b1, false);
  }
  ReadBatch& batch = read_batch_;
  std::uint64_t retries = 0, bytes = 0, copied = 0;
  while (true) {
    bool any = false;
    for (std::uint32_t si = 0; si < servers_.size(); ++si) {
      ServerLink& s = servers_[si];
      auto& q = queues[si];
      pieces[si].clear();
      if (q.empty()) continue;
      any = true;
      const ShardRemote& shard = t.shards[si];
      std::size_t used = 0;  // staging bytes
      batch.clear();
      const std::size_t max_ops = std::min(kMaxOpsPerPost, s.conn->max_outstanding());
      while (!q.empty() && batch.ops.size() + ops_per_piece <= max_ops) {
        Piece& r = q.front();
        const std::size_t start = internal::RoundUp(used, internal::kCacheLine);
        const std::size_t per_block = staged_block(r.user);
        std::uint64_t n = std::min(r.count, max_blocks_per_op);
        if (start + n * per_block > s.staging_bytes) {  // staging is full: what fits
          n = start < s.staging_bytes ? (s.staging_bytes - start) / per_block : 0;
        }
        if (n == 0) break;
        Piece pc = r;
        pc.count = n;
        pc.hi = std::min(r.hi, shard.geo.end_row(r.block + n - 1));
        pc.headers = s.staging.get() + start;
        if (pc.user) {
          pc.rows = out_bytes + pc.out_row * row_bytes;
        } else {
          pc.rows = pc.headers + (inl ? sizeof(BlockHeader) : n * sizeof(BlockHeader));
        }
        bytes += AddBlockReads(shard, s.staging_mr.get(), user_mr, pc, &batch);
        pieces[si].push_back(pc);
        used = start + n * per_block;
        r.block += n;
        r.count -= n;
        r.out_row += pc.hi - pc.lo;
        r.lo = pc.hi;
        if (r.count == 0) q.pop_front();
      }
      // ReadDirectories sizes staging to hold a block of every table.
      if (batch.ops.empty()) return InternalError("staging smaller than one checked block");
      RDMAPS_RETURN_IF_ERROR(PostOps(s, batch.Seal()));
    }
    if (!any) break;
    for (std::uint32_t si = 0; si < servers_.size(); ++si) {
      if (pieces[si].empty()) continue;
      ServerLink& s = servers_[si];
      const ShardRemote& shard = t.shards[si];
      const internal::ShardGeometry& g = shard.geo;
      // Accepts a piece of one block (BlockOf) when the block matches its
      // header, copying its wanted rows out when it is staged.
      auto accept = [&](const Piece& one) {
        const std::uint64_t first = g.first_row(one.block);
        const auto* header = reinterpret_cast<const BlockHeader*>(one.headers);
        if (!internal::VerifyRow(*header, one.rows, g.block_rows(one.block) * row_bytes)) {
          return false;
        }
        if (!one.user) {
          std::memcpy(out_bytes + one.out_row * row_bytes, one.rows + (one.lo - first) * row_bytes,
                      (one.hi - one.lo) * row_bytes);
          copied += (one.hi - one.lo) * row_bytes;
        }
        return true;
      };
      // Verify the blocks of each piece as its READs complete (overlapping
      // the check with the later READs' transfer); re-READ torn blocks,
      // rows and header, until they verify.
      std::vector<Piece> torn;
      // Completions are taken in bulk (up to all of this server's), so many
      // small pieces cost few Waits.
      const std::size_t total_ops = pieces[si].size() * ops_per_piece;
      std::size_t completed = 0, needed = 0;
      for (const Piece& pc : pieces[si]) {
        needed += ops_per_piece;
        if (completed < needed) {
          RDMAPS_RETURN_IF_ERROR(
              DrainSome(s, needed - completed, total_ops - completed, &completed, deadline));
        }
        for (std::uint64_t k = 0; k < pc.count; ++k) {
          const Piece one = BlockOf(t, g, pc, k);
          if (!accept(one)) torn.push_back(one);
        }
      }
      while (!torn.empty()) {
        retries += torn.size();
        if (SteadyClock::now() >= deadline) {
          // Complete what the later servers still have in flight, so their
          // connections stay in step for the next call.
          for (std::uint32_t sj = si + 1; sj < servers_.size(); ++sj) {
            if (pieces[sj].empty()) continue;
            RDMAPS_RETURN_IF_ERROR(Drain(servers_[sj], pieces[sj].size() * ops_per_piece,
                                         SteadyClock::now() + std::chrono::seconds(10)));
          }
          return TimedOutError(BlockName(shard, torn[0].block) + " of table '" + t.info.name +
                               "' on " + ServerName(s) + " read torn until the deadline (" +
                               std::to_string(retries) +
                               " retries): the server rewrites it faster than it can be read");
        }
        const std::size_t per_post =
            std::min(kMaxOpsPerPost, s.conn->max_outstanding()) / ops_per_piece;
        for (std::size_t off = 0; off < torn.size(); off += per_post) {
          batch.clear();
          const std::size_t end = std::min(torn.size(), off + per_post);
          for (std::size_t k = off; k < end; ++k) {
            bytes += AddBlockReads(shard, s.staging_mr.get(), user_mr, torn[k], &batch);
          }
          RDMAPS_RETURN_IF_ERROR(Exec(s, batch.Seal(), deadline));
        }
        std::vector<Piece> still;
        for (const Piece& pc : torn) {
          if (!accept(pc)) still.push_back(pc);
        }
        torn = std::move(still);
      }
    }
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.torn_retries += retries;
  stats_.bytes_read += bytes;
  stats_.bytes_staged += copied;
  if (any_user) ++stats_.zero_copy_calls;
  return Status::OK();
}

// ---- pull ----------------------------------------------------------------------

Status ClientImpl::Pull(std::uint32_t table, RowRange range, std::span<float> out) {
  std::lock_guard<std::mutex> lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  RDMAPS_ASSIGN_OR_RETURN(const TableMeta* t, CheckTable(table));
  if (range.begin > t->info.rows || range.count > t->info.rows - range.begin) {
    return InvalidArgumentError("Pull: rows [" + std::to_string(range.begin) + ", " +
                                std::to_string(range.begin + range.count) + ") of table '" +
                                t->info.name + "' are out of range; it has " +
                                std::to_string(t->info.rows) + " rows");
  }
  if (out.size() != range.count * t->info.dim) {
    return InvalidArgumentError("Pull: output buffer has " + std::to_string(out.size()) +
                                " floats; " + std::to_string(range.count) + " rows of table '" +
                                t->info.name + "' need " +
                                std::to_string(range.count * t->info.dim));
  }
  if (range.count == 0) return Status::OK();
  const Deadline deadline = CallDeadline();
  std::vector<Run> runs;
  std::vector<std::uint32_t> involved;
  const std::uint32_t S = num_servers();
  for (std::uint32_t si = internal::ServerOfRow(t->info.rows, S, range.begin); si < S; ++si) {
    const ShardRemote& sh = t->shards[si];
    if (sh.begin >= range.begin + range.count) break;
    const std::uint64_t b = std::max(sh.begin, range.begin);
    const std::uint64_t e = std::min(sh.begin + sh.count, range.begin + range.count);
    if (b >= e) continue;
    runs.push_back({si, b - sh.begin, e - b, b - range.begin});
    involved.push_back(si);
  }
  RDMAPS_RETURN_IF_ERROR(WaitReadable(*t, involved, deadline));
  RDMAPS_RETURN_IF_ERROR(ReadRuns(*t, std::move(runs), out, deadline));
  std::lock_guard<std::mutex> slock(stats_mu_);
  ++stats_.pulls;
  stats_.rows_pulled += range.count;
  return Status::OK();
}

Status ClientImpl::Pull(std::uint32_t table, std::span<const std::uint64_t> rows,
                        std::span<float> out) {
  std::lock_guard<std::mutex> lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  RDMAPS_ASSIGN_OR_RETURN(const TableMeta* t, CheckTable(table));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= t->info.rows) {
      return InvalidArgumentError("Pull: row id " + std::to_string(rows[i]) + " (index " +
                                  std::to_string(i) + ") is out of range; table '" +
                                  t->info.name + "' has " + std::to_string(t->info.rows) +
                                  " rows");
    }
  }
  if (out.size() != rows.size() * t->info.dim) {
    return InvalidArgumentError("Pull: output buffer has " + std::to_string(out.size()) +
                                " floats; " + std::to_string(rows.size()) + " rows of table '" +
                                t->info.name + "' need " +
                                std::to_string(rows.size() * t->info.dim));
  }
  if (rows.empty()) return Status::OK();
  const Deadline deadline = CallDeadline();
  const std::uint32_t S = num_servers();
  std::vector<Run> runs;
  std::vector<bool> used(S, false);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t si = internal::ServerOfRow(t->info.rows, S, rows[i]);
    const std::uint64_t local = rows[i] - t->shards[si].begin;
    used[si] = true;
    if (!runs.empty()) {
      Run& last = runs.back();
      if (last.server == si && last.local + last.count == local &&
          last.out_row + last.count == i) {
        ++last.count;
        continue;
      }
    }
    runs.push_back({si, local, 1, i});
  }
  std::vector<std::uint32_t> involved;
  for (std::uint32_t si = 0; si < S; ++si) {
    if (used[si]) involved.push_back(si);
  }
  if (!t->inline_headers() && !t->layout_hint_logged && runs.size() >= 8 &&
      2 * runs.size() > rows.size() && internal::RowBytes(t->info.dim) < kScatterMinRowBytes) {
    t->layout_hint_logged = true;
    LOG(INFO) << "table '" << t->info.name << "' has the dense layout and is pulled by "
              << "scattered ids (" << runs.size() << " runs in " << rows.size()
              << " rows): each run costs a READ of its checked block of "
              << t->rows_per_block << " row(s) and a header READ; \"layout\": \"inline\" "
              << "makes it one READ (docs/ps.md, Row layouts)";
  }
  RDMAPS_RETURN_IF_ERROR(WaitReadable(*t, involved, deadline));
  RDMAPS_RETURN_IF_ERROR(ReadRuns(*t, std::move(runs), out, deadline));
  std::lock_guard<std::mutex> slock(stats_mu_);
  ++stats_.pulls;
  stats_.rows_pulled += rows.size();
  return Status::OK();
}

// ---- push ----------------------------------------------------------------------

Status ClientImpl::EnsureCredit(ServerLink& s, Deadline deadline) {
  if (s.pushed_seq - s.applied_seq < s.dir.ring_slots) return Status::OK();
  const auto start = SteadyClock::now();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.credit_waits;
  }
  Backoff backoff;
  while (true) {
    RDMAPS_RETURN_IF_ERROR(ReadControl({s.index}, deadline));
    if (s.pushed_seq - s.applied_seq < s.dir.ring_slots) break;
    if (SteadyClock::now() >= deadline) {
      AddBlocked(SteadyClock::now() - start);
      return TimedOutError(ServerName(s) + " has consumed only " +
                           std::to_string(s.applied_seq) + " of worker " +
                           std::to_string(options_.worker_id) + "'s " +
                           std::to_string(s.pushed_seq) +
                           " pushes within wait_timeout: its apply thread is stuck or overloaded");
    }
    backoff.Pause();
  }
  AddBlocked(SteadyClock::now() - start);
  return Status::OK();
}

Status ClientImpl::PostSlot(ServerLink& s, SlotHeader h, std::size_t bytes,
                            std::span<const transport::Segment> data) {
  h.seq = s.pushed_seq + 1;
  std::memcpy(s.push.get(), &h, sizeof(h));
  CHECK_LE(data.size(), kMaxGatherRuns);
  Op ops[kMaxGatherRuns + 2];
  transport::Segment gather[kMaxGatherRuns + 1];
  std::size_t n = 0;
  std::uint64_t total = bytes;
  const std::uint64_t slot = SlotAddress(s, h.seq);
  const std::uint32_t imm = internal::ImmOfSeq(h.seq);
  if (data.empty()) {
    ops[n++] = Op::WriteWithImm(s.push.get(), s.push_mr.get(), bytes, slot, s.ring.rkey, imm);
  } else if (data.size() + 1 <= s.conn->max_segments()) {
    gather[0] = {s.push.get(), s.push_mr.get(), static_cast<std::uint32_t>(bytes)};
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
    ops[n++] = Op::WriteWithImm(s.push.get(), s.push_mr.get(), bytes, slot, s.ring.rkey, imm);
  }
  // Half the credits used: refresh them with a READ behind the write, in the
  // same doorbell, so a steady pusher rarely stops to poll.
  const bool refresh = (h.seq - s.applied_seq) * 2 >= s.dir.ring_slots;
  if (refresh) {
    ops[n++] = Op::Read(s.ctrl.get(), s.ctrl_mr.get(), s.ctrl_bytes, s.dir.control.addr,
                        s.dir.control.rkey);
  }
  RDMAPS_RETURN_IF_ERROR(PostOps(s, {ops, n}));
  s.ctrl_inflight = refresh;
  s.slot_ops = n;
  s.pushed_seq = h.seq;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.bytes_written += total;
  return Status::OK();
}

Status ClientImpl::PushRange(const TableMeta& t, RowRange range, std::span<const float> grads,
                             Deadline deadline) {
  const std::uint32_t S = num_servers();
  const std::uint32_t dim = t.info.dim;
  const transport::MemoryRegion* user_mr = FindRegistered(grads.data(), grads.size_bytes());
  std::uint64_t copied = 0;
  // Per server the remaining sub-range; each round sends one slot per server.
  std::vector<RowRange> todo(S);
  for (std::uint32_t si = 0; si < S; ++si) {
    const ShardRemote& sh = t.shards[si];
    const std::uint64_t b = std::max(sh.begin, range.begin);
    const std::uint64_t e = std::min(sh.begin + sh.count, range.begin + range.count);
    if (b < e) todo[si] = {b, e - b};
  }
  while (true) {
    std::vector<std::uint32_t> posted;
    for (std::uint32_t si = 0; si < S; ++si) {
      if (todo[si].count == 0) continue;
      ServerLink& s = servers_[si];
      RDMAPS_RETURN_IF_ERROR(DrainOnError(posted, EnsureCredit(s, deadline), deadline));
      const std::uint64_t cap = internal::SlotRowCapacity(s.dir.slot_bytes, dim, false);
      const std::uint64_t n = std::min(cap, todo[si].count);
      SlotHeader h{};
      h.clock = clock_;
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
        std::memcpy(s.push.get() + sizeof(SlotHeader), src, bytes);
        copied += bytes;
        st = PostSlot(s, h, sizeof(SlotHeader) + bytes);
      }
      RDMAPS_RETURN_IF_ERROR(DrainOnError(posted, st, deadline));
      todo[si].begin += n;
      todo[si].count -= n;
      posted.push_back(si);
    }
    if (posted.empty()) break;
    for (std::uint32_t si : posted) RDMAPS_RETURN_IF_ERROR(FinishSlot(servers_[si], deadline));
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.bytes_staged += copied;
  if (user_mr) ++stats_.zero_copy_calls;
  return Status::OK();
}

Status ClientImpl::PushRows(const TableMeta& t, std::span<const std::uint64_t> rows,
                            std::span<const float> grads, Deadline deadline) {
  const std::uint32_t S = num_servers();
  const std::uint32_t dim = t.info.dim;
  const std::size_t row_bytes = internal::RowBytes(dim);
  const transport::MemoryRegion* user_mr = FindRegistered(grads.data(), grads.size_bytes());
  std::uint64_t copied = 0;
  bool zero_copy = false;
  std::vector<std::vector<std::uint32_t>> by_server(S);  // indices into rows
  for (std::size_t i = 0; i < rows.size(); ++i) {
    by_server[internal::ServerOfRow(t.info.rows, S, rows[i])].push_back(
        static_cast<std::uint32_t>(i));
  }
  std::vector<std::size_t> next(S, 0);
  transport::Segment data[kMaxGatherRuns];
  while (true) {
    std::vector<std::uint32_t> posted;
    for (std::uint32_t si = 0; si < S; ++si) {
      const auto& idx = by_server[si];
      if (next[si] == idx.size()) continue;
      ServerLink& s = servers_[si];
      RDMAPS_RETURN_IF_ERROR(DrainOnError(posted, EnsureCredit(s, deadline), deadline));
      const std::uint64_t cap = internal::SlotRowCapacity(s.dir.slot_bytes, dim, true);
      const std::size_t n = std::min<std::size_t>(cap, idx.size() - next[si]);
      const std::uint32_t* slot_idx = idx.data() + next[si];
      SlotHeader h{};
      h.clock = clock_;
      h.table = t.info.id;
      h.kind = static_cast<std::uint32_t>(SlotKind::kRows);
      h.num_rows = static_cast<std::uint32_t>(n);
      std::byte* ids = s.push.get() + sizeof(SlotHeader);
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
      RDMAPS_RETURN_IF_ERROR(DrainOnError(posted, st, deadline));
      next[si] += n;
      posted.push_back(si);
    }
    if (posted.empty()) break;
    for (std::uint32_t si : posted) RDMAPS_RETURN_IF_ERROR(FinishSlot(servers_[si], deadline));
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.bytes_staged += copied;
  if (zero_copy) ++stats_.zero_copy_calls;
  return Status::OK();
}

Status ClientImpl::Push(std::uint32_t table, RowRange range, std::span<const float> grads) {
  std::lock_guard<std::mutex> lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  RDMAPS_ASSIGN_OR_RETURN(const TableMeta* t, CheckTable(table));
  if (range.begin > t->info.rows || range.count > t->info.rows - range.begin) {
    return InvalidArgumentError("Push: rows [" + std::to_string(range.begin) + ", " +
                                std::to_string(range.begin + range.count) + ") of table '" +
                                t->info.name + "' are out of range; it has " +
                                std::to_string(t->info.rows) + " rows");
  }
  if (grads.size() != range.count * t->info.dim) {
    return InvalidArgumentError("Push: gradient buffer has " + std::to_string(grads.size()) +
                                " floats; " + std::to_string(range.count) + " rows of table '" +
                                t->info.name + "' need " +
                                std::to_string(range.count * t->info.dim));
  }
  if (range.count == 0) return Status::OK();
  RDMAPS_RETURN_IF_ERROR(PushRange(*t, range, grads, CallDeadline()));
  std::lock_guard<std::mutex> slock(stats_mu_);
  ++stats_.pushes;
  stats_.rows_pushed += range.count;
  return Status::OK();
}

Status ClientImpl::Push(std::uint32_t table, std::span<const std::uint64_t> rows,
                        std::span<const float> grads) {
  std::lock_guard<std::mutex> lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  RDMAPS_ASSIGN_OR_RETURN(const TableMeta* t, CheckTable(table));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= t->info.rows) {
      return InvalidArgumentError("Push: row id " + std::to_string(rows[i]) + " (index " +
                                  std::to_string(i) + ") is out of range; table '" +
                                  t->info.name + "' has " + std::to_string(t->info.rows) +
                                  " rows");
    }
  }
  if (grads.size() != rows.size() * t->info.dim) {
    return InvalidArgumentError("Push: gradient buffer has " + std::to_string(grads.size()) +
                                " floats; " + std::to_string(rows.size()) + " rows of table '" +
                                t->info.name + "' need " +
                                std::to_string(rows.size() * t->info.dim));
  }
  if (rows.empty()) return Status::OK();
  RDMAPS_RETURN_IF_ERROR(PushRows(*t, rows, grads, CallDeadline()));
  std::lock_guard<std::mutex> slock(stats_mu_);
  ++stats_.pushes;
  stats_.rows_pushed += rows.size();
  return Status::OK();
}

Status ClientImpl::PushPull(std::uint32_t table, RowRange range, std::span<const float> grads,
                            std::span<float> out) {
  // Validate both halves before sending anything.
  {
    std::lock_guard<std::mutex> lock(mu_);
    RDMAPS_ASSIGN_OR_RETURN(const TableMeta* t, CheckTable(table));
    if (out.size() != range.count * t->info.dim) {
      return InvalidArgumentError("PushPull: output buffer has " + std::to_string(out.size()) +
                                  " floats; " + std::to_string(range.count) +
                                  " rows need " + std::to_string(range.count * t->info.dim));
    }
  }
  RDMAPS_RETURN_IF_ERROR(Push(table, range, grads));
  return Pull(table, range, out);
}

// ---- zero-copy buffers -------------------------------------------------------------

const transport::MemoryRegion* ClientImpl::FindRegistered(const void* p,
                                                          std::size_t bytes) const {
  if (bytes == 0) return nullptr;
  for (const UserBuffer& b : user_buffers_) {
    if (b.mr->Contains(p, bytes)) return b.mr.get();
  }
  return nullptr;
}

Status ClientImpl::RegisterBuffer(std::span<float> buffer) {
  if (buffer.empty()) return InvalidArgumentError("RegisterBuffer: the buffer is empty");
  std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = user_buffers_.begin(); it != user_buffers_.end(); ++it) {
    if (it->data == buffer.data() && it->floats == buffer.size()) {
      user_buffers_.erase(it);
      return Status::OK();
    }
  }
  return NotFoundError("UnregisterBuffer: this span (" + std::to_string(buffer.size()) +
                       " floats) was not given to RegisterBuffer");
}

Status ClientImpl::SendControlSlot(SlotKind kind, std::uint64_t clock, Deadline deadline) {
  std::vector<std::uint32_t> posted;
  for (ServerLink& s : servers_) {
    RDMAPS_RETURN_IF_ERROR(DrainOnError(posted, EnsureCredit(s, deadline), deadline));
    SlotHeader h{};
    h.clock = clock;
    h.kind = static_cast<std::uint32_t>(kind);
    RDMAPS_RETURN_IF_ERROR(PostSlot(s, h, sizeof(SlotHeader)));
    posted.push_back(s.index);
  }
  for (ServerLink& s : servers_) RDMAPS_RETURN_IF_ERROR(FinishSlot(s, deadline));
  return Status::OK();
}

Result<std::uint64_t> ClientImpl::Clock() {
  std::lock_guard<std::mutex> lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  const Deadline deadline = CallDeadline();
  RDMAPS_RETURN_IF_ERROR(SendControlSlot(SlotKind::kClock, clock_ + 1, deadline));
  ++clock_;
  {
    std::lock_guard<std::mutex> slock(stats_mu_);
    stats_.clock = clock_;
  }
  // Do not run more than `bound` clocks ahead of the slowest worker.
  if (options_.clock_waits && clock_bound_ != kAsp && clock_ > clock_bound_) {
    std::vector<std::uint32_t> all(servers_.size());
    for (std::uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    RDMAPS_RETURN_IF_ERROR(WaitForClocks(
        clock_ - clock_bound_, all,
        [&] {
          return "ending its iteration (staleness bound " + std::to_string(clock_bound_) + ")";
        },
        deadline));
  }
  return clock_;
}

Status ClientImpl::Barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  RDMAPS_RETURN_IF_ERROR(Usable());
  const Deadline deadline = CallDeadline();
  ServerLink& s = servers_[0];
  auto* result = reinterpret_cast<std::uint64_t*>(s.ctrl.get() +
                                                  internal::RoundUp(s.ctrl_bytes, 8));
  Op op = Op::FetchAdd(result, s.ctrl_mr.get(), atomics_.addr, atomics_.rkey, 1);
  RDMAPS_RETURN_IF_ERROR(Exec(s, {&op, 1}, deadline));
  const std::uint64_t W = options_.num_workers;
  const std::uint64_t target = (*result / W + 1) * W;
  const auto start = SteadyClock::now();
  Backoff backoff;
  while (true) {
    // COMPARE_SWAP(0, 0) is an atomic read of a word only atomics touch.
    op = Op::CompareSwap(result, s.ctrl_mr.get(), atomics_.addr, atomics_.rkey, 0, 0);
    RDMAPS_RETURN_IF_ERROR(Exec(s, {&op, 1}, deadline));
    if (*result >= target) break;
    if (SteadyClock::now() >= deadline) {
      AddBlocked(SteadyClock::now() - start);
      return TimedOutError("Barrier: worker " + std::to_string(options_.worker_id) + " waited " +
                           "wait_timeout; only " + std::to_string(*result - (target - W)) +
                           " of " + std::to_string(W) +
                           " workers arrived. Are the others alive and calling Barrier()?");
    }
    backoff.Pause();
  }
  AddBlocked(SteadyClock::now() - start);
  return Status::OK();
}

Status ClientImpl::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return Status::OK();
  closed_ = true;
  Status st;
  if (broken_.ok()) {
    st = SendControlSlot(SlotKind::kBye, clock_, SteadyClock::now() + std::chrono::seconds(10));
  }
  for (ServerLink& s : servers_) {
    if (s.conn) s.conn->Close();
  }
  return st;
}

// ---- async -----------------------------------------------------------------------

Handle ClientImpl::Submit(std::function<Status()> fn, Callback done) {
  auto state = std::make_shared<Handle::State>();
  state->callback = std::move(done);
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
    if (!executor_.joinable() && !exec_stop_) executor_ = std::thread([this] { ExecutorLoop(); });
    if (exec_stop_) {
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
  std::unique_lock<std::mutex> lock(exec_mu_);
  while (true) {
    exec_cv_.wait(lock, [&] { return exec_stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    auto [fn, state] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Status st = fn();
    Callback cb;
    {
      std::lock_guard<std::mutex> slock(state->mu);
      state->status = st;
      state->done = true;
      cb = std::move(state->callback);
    }
    state->cv.notify_all();
    if (cb) cb(st);
    lock.lock();
  }
}

void ClientImpl::StopExecutor() {
  {
    std::lock_guard<std::mutex> lock(exec_mu_);
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
}  // namespace internal

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto client = std::make_unique<ClientImpl>(options);
  RDMAPS_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace rdmaps

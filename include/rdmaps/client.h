// A worker's handle on the parameter servers: pulls rows with one-sided
// READs, pushes gradients with one-sided WRITEs, advances its clock and
// synchronises with the other workers.
//
// Consistency (see docs/ps.md for the full argument):
// - Every worker starts at clock 0; Clock() ends an iteration and returns the
//   new clock (the number of completed iterations). A push made at clock c
//   belongs to iteration c.
// - A Pull of a table with staleness s at worker clock c sees every update
//   that any worker pushed at clocks <= c - s - 1: it first waits (polling the
//   servers' clock words with one-sided READs, with backoff) until every
//   worker has completed iteration c - s - 1 on every server involved. s = 0 is
//   BSP, s = kAsp never waits (ASP). On timeout: TimedOut naming the lagging
//   workers and their clocks.
// - Clock() holds a worker back the same way: it returns once every worker
//   has reached (new clock) - s, s being the smallest bound of the tables
//   (ClientOptions::clock_waits), so no worker runs more than s clocks ahead
//   of the slowest, whether it pulls or not.
// - Read-my-writes: a Pull also waits until each server involved has applied
//   every push this client sent it before the Pull started.
// - Rows are never torn: each block of rows carries a checksum; a torn READ
//   of a block is retried (ClientStats::torn_retries counts them).
//
// Buffers: `out` and `grads` are dense row-major [rows x dim] float spans of
// exactly rows * dim floats, owned by the caller. Zero-copy: when the span
// lies inside memory given to RegisterBuffer(), a Pull READs rows straight
// into it (kInline tables: rows of 1 KiB and more, by scattered READs; their
// smaller rows are staged; rows of a checked block the pull wants only in
// part are staged too, see RowLayout) and a Push sends gradients straight
// from it (a push of scattered rows whose gradients are in many separate
// pieces is still copied). Other spans are staged through the client's
// registered memory (one copy).
// ClientStats::bytes_staged counts the copies. On error, the contents of
// `out` are unspecified.
//
// Errors: bad arguments (unknown table, row out of range, wrong buffer size,
// duplicate ids are allowed) fail with InvalidArgument before anything is
// sent. A transport failure fails the call and every later call with
// Unavailable naming the server.
//
// Thread safety: a Client is safe for concurrent use by multiple threads;
// calls are serialised internally (use one Client per thread for parallel
// network use). Async calls run in submission order on an internal thread;
// the caller's spans must stay valid until the handle completes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/options.h"
#include "rdmaps/status.h"
#include "rdmaps/table.h"

namespace rdmaps {

struct ClientStats {
  std::uint64_t pulls = 0;
  std::uint64_t pushes = 0;
  std::uint64_t rows_pulled = 0;
  std::uint64_t rows_pushed = 0;
  std::uint64_t bytes_read = 0;              // READ payload incl. block headers
  std::uint64_t bytes_written = 0;           // WRITE payload incl. slot headers
  std::uint64_t bytes_staged = 0;            // payload copied between staging and caller buffers
  std::uint64_t zero_copy_calls = 0;         // pulls/pushes that used a registered buffer
  std::uint64_t torn_retries = 0;            // blocks of rows re-read: their checksum failed
  std::uint64_t control_torn_retries = 0;    // control blocks re-read: torn by the server's update
  std::uint64_t clock_reads = 0;             // READs of server clock words
  std::uint64_t pull_waits = 0;              // pulls that had to wait for other workers
  std::uint64_t credit_waits = 0;            // pushes that had to wait for ring space
  std::chrono::nanoseconds blocked_time{0};  // total time spent waiting (all reasons)
  // Observed staleness: at each pull, worker clock minus the min clock seen.
  std::uint64_t staleness_sum = 0;
  std::uint64_t staleness_max = 0;
  std::uint64_t staleness_samples = 0;
  std::uint64_t clock = 0;  // this worker's clock
  // Scattered pulls carried out as range pulls of each server's span of
  // wanted rows and a gather (docs/ps.md, "Scattered pulls").
  std::uint64_t span_pulls = 0;
  // Rows a pipelined PushPull READ while its push was still being sent or
  // applied, each once the server had applied the slots covering it
  // (docs/ps.md, "PushPull").
  std::uint64_t rows_pulled_pipelined = 0;
  // Replicated shards (docs/ps.md, "Replication and failover"): failovers
  // this worker went through (each reconnected every server) and the
  // unacknowledged pushes it sent again to a new primary.
  std::uint64_t failovers = 0;
  std::uint64_t pushes_resent = 0;
};

// Describes a table as the servers publish it.
struct TableInfo {
  std::uint32_t id = 0;
  std::string name;
  std::uint64_t rows = 0;
  std::uint32_t dim = 0;
  std::uint32_t staleness = kAsp;        // effective bound for this client
  RowLayout layout = RowLayout::kDense;  // as the servers chose it (never kAuto)
};

// A durable checkpoint (Client::Checkpoint).
struct CheckpointInfo {
  std::uint64_t clock = 0;  // workers resume at this clock after a restore from it
  std::string name;         // its folder under the servers' checkpoint_dir: "ckpt-<clock>"
};

// Completion of an asynchronous call. Copyable; all copies share the result.
class Handle {
 public:
  Handle() = default;
  // Waits until the call has finished or `deadline` passed. Returns the
  // call's Status, or TimedOut (the call keeps running) at the deadline.
  Status Wait(std::chrono::steady_clock::time_point deadline) const;
  // Wait(now + timeout).
  Status WaitFor(std::chrono::nanoseconds timeout) const {
    return Wait(std::chrono::steady_clock::now() + timeout);
  }
  bool done() const;

  // Internal: the client creates handles.
  struct State;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

using Callback = std::function<void(const Status&)>;

class Client {
 public:
  // Connects to every server, reads their directories and checks that they
  // agree. TimedOut naming the unreachable servers after connect_timeout.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Calls Close().
  virtual ~Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  virtual std::uint32_t worker_id() const = 0;
  virtual std::uint32_t num_workers() const = 0;
  virtual std::uint32_t num_servers() const = 0;
  virtual std::vector<TableInfo> tables() const = 0;
  // NotFound when no table has this name.
  virtual Result<TableInfo> FindTable(std::string_view name) const = 0;

  // --- Zero-copy buffers -------------------------------------------------
  // Registers `buffer` with the transport (pins it; on verbs it becomes a
  // memory region of the device) so that pulls into and pushes from spans
  // inside it skip the staging copy. The memory must stay valid until
  // UnregisterBuffer() or the Client's destruction. InvalidArgument when it
  // overlaps a registered buffer; ResourceExhausted (with the fix) when the
  // transport cannot pin it (verbs: memlock limit).
  virtual Status RegisterBuffer(std::span<float> buffer) = 0;
  // Forgets a buffer given to RegisterBuffer() (the same span). Waits for
  // calls in progress; later calls on spans inside it are staged.
  // NotFound when it was not registered.
  virtual Status UnregisterBuffer(std::span<float> buffer) = 0;

  // --- Synchronous calls ------------------------------------------------
  // Reads rows [range) of `table` into out (range.count * dim floats).
  virtual Status Pull(std::uint32_t table, RowRange range, std::span<float> out) = 0;
  // Reads the given rows (any order, duplicates allowed) into out
  // (rows.size() * dim floats, in the order given).
  virtual Status Pull(std::uint32_t table, std::span<const std::uint64_t> rows,
                      std::span<float> out) = 0;
  // Sends gradients for rows [range) (range.count * dim floats). Returns once
  // the data is in the servers' push rings (not applied yet: Flush() waits
  // for that; a later Pull by this worker sees it anyway).
  virtual Status Push(std::uint32_t table, RowRange range, std::span<const float> grads) = 0;
  // Sends gradients for the given rows (duplicates each apply once).
  virtual Status Push(std::uint32_t table, std::span<const std::uint64_t> rows,
                      std::span<const float> grads) = 0;
  // Push then Pull of the rows, seeing this push (pipelined: docs/ps.md, "PushPull").
  virtual Status PushPull(std::uint32_t table, RowRange range, std::span<const float> grads,
                          std::span<float> out) = 0;
  // Ends the current iteration: after this worker's earlier pushes, every
  // server learns the new clock. Then, with ClientOptions::clock_waits, waits
  // until no worker is more than s clocks behind (TimedOut naming the lagging
  // workers after wait_timeout). Returns the new clock.
  virtual Result<std::uint64_t> Clock() = 0;
  // Returns once every push this worker made before the call has been
  // applied by its servers, so that every later Pull by any worker sees it
  // (ps-lite's Wait on a push). Costs nothing when the servers are already
  // known to have applied everything; otherwise polls their control blocks
  // (one READ per server and poll). TimedOut naming the server that lags
  // after wait_timeout.
  virtual Status Flush() = 0;
  // A checkpoint of every table on every server at this worker's clock c:
  // the state after every push sent before each worker's c-th Clock() and
  // none later (docs/ps.md, "Checkpoints"). Collective: every worker calls
  // it at the same clock, right after Clock() and before the iteration's
  // first push (FailedPrecondition otherwise). Returns once every server has
  // written its part durably; fails (naming the server) when one could not
  // (no checkpoint_dir, a disk error, a worker already past c) and with
  // TimedOut after wait_timeout. A checkpoint the servers take at the same
  // clock on their own (checkpoint_every) is the same one.
  virtual Result<CheckpointInfo> Checkpoint() = 0;
  // Returns when every worker has called Barrier() the same number of times.
  // Every push any worker made before its Barrier() is applied and visible
  // to every pull after the barrier, in every consistency mode (each worker
  // Flush()es before it arrives). TimedOut (how many arrived, or the
  // server whose apply lags) after wait_timeout.
  virtual Status Barrier() = 0;
  // Tells every server this worker is done (so others no longer wait for its
  // clock) and closes the connections. Idempotent.
  virtual Status Close() = 0;

  // --- Cancellation -----------------------------------------------------
  // Cuts short the waits of every call that entered before Interrupt() and
  // has not returned yet (running, or waiting its turn behind another
  // call): a Pull waiting for other workers' clocks (staleness), Clock()'s
  // wait, Flush() and Barrier() return Cancelled ("interrupted") within
  // about 20 ms. Calls entered after it are not affected; nothing is
  // sticky. Operations already posted to the network complete first, and
  // waits that only the servers end (a Push waiting for ring space,
  // Checkpoint()) are not cut. The client stays usable: an interrupted Pull
  // read nothing (`out` is unspecified); an interrupted Clock() has still
  // ended its iteration; a Barrier() interrupted after this worker arrived
  // is resumed, not re-entered, by its next Barrier(). Safe from any thread
  // (not from a signal handler). For interactive front ends (the Python
  // binding's Ctrl-C).
  virtual void Interrupt() = 0;

  // --- Asynchronous calls -----------------------------------------------
  // Same arguments and semantics as the synchronous forms; run in submission
  // order on the client's internal thread.
  virtual Handle PullAsync(std::uint32_t table, RowRange range, std::span<float> out) = 0;
  virtual Handle PullAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                           std::span<float> out) = 0;
  virtual Handle PushAsync(std::uint32_t table, RowRange range, std::span<const float> grads) = 0;
  virtual Handle PushAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                           std::span<const float> grads) = 0;
  virtual Handle PushPullAsync(std::uint32_t table, RowRange range, std::span<const float> grads,
                               std::span<float> out) = 0;
  // Completes once Flush() would return (runs after every call submitted
  // before it).
  virtual Handle FlushAsync() = 0;
  // Callback forms: `done` runs on the client's internal thread.
  virtual void PullAsync(std::uint32_t table, RowRange range, std::span<float> out,
                         Callback done) = 0;
  virtual void PullAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                         std::span<float> out, Callback done) = 0;
  virtual void PushAsync(std::uint32_t table, RowRange range, std::span<const float> grads,
                         Callback done) = 0;
  virtual void PushAsync(std::uint32_t table, std::span<const std::uint64_t> rows,
                         std::span<const float> grads, Callback done) = 0;
  virtual void PushPullAsync(std::uint32_t table, RowRange range, std::span<const float> grads,
                             std::span<float> out, Callback done) = 0;

  virtual ClientStats stats() const = 0;
  virtual std::uint64_t clock() const = 0;
  // Per server, the random id it drew when it started (read at Connect): a
  // server restarted since has another one. For reconnecting after a server
  // failure only to servers that have all been restarted.
  virtual std::vector<std::uint64_t> server_incarnations() const = 0;

 protected:
  Client() = default;
};

}  // namespace rdmaps

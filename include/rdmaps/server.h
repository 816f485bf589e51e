// A parameter server node: owns the shards of every table that the range
// partition gives it, in registered memory that workers READ directly, and
// applies the gradients workers WRITE into its push rings with each table's
// optimizer. It posts no operations on the data path: pulls cost it no CPU.
//
// Usage:
//   RDMAPS_ASSIGN_OR_RETURN(auto server, rdmaps::Server::Start(options));
//   std::cout << server->address();   // give this to the workers
//   RDMAPS_RETURN_IF_ERROR(server->Run());   // until the workers are done or Stop()
//
// Start() allocates and registers everything, starts listening and starts
// the background threads (accepting workers, applying pushes); the server
// serves from then on whether or not Run() is called.
//
// Thread safety: every method is safe to call from any thread. Stop() may be
// called from a signal-handling thread while another thread is in Run().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rdmaps/options.h"
#include "rdmaps/status.h"

namespace rdmaps {

struct ServerStats {
  std::uint64_t pushes_applied = 0;   // push slots applied (exactly once each)
  std::uint64_t rows_applied = 0;     // row updates done by optimizers
  std::uint64_t clocks_applied = 0;   // Clock() markers received
  std::uint64_t apply_batches = 0;    // notification batches processed
  std::uint64_t protocol_errors = 0;  // malformed or out-of-sequence slots dropped
  // Notifications (a ring write, a disconnect) of a connection that claimed a
  // worker's id but is not the one that worker bootstrapped on: ignored.
  std::uint64_t unbound_notifications = 0;
  std::uint64_t min_clock = 0;  // min over workers (members) of their applied clock
  // Elastic mode: +1 on every join and leave; the workers counted now.
  std::uint32_t membership_epoch = 0;
  std::uint32_t members = 0;
  std::uint64_t barrier_arrivals =
      0;  // Barrier() arrivals applied (elastic mode, or with failover)
  std::uint32_t workers_connected = 0;
  std::uint32_t workers_done = 0;            // said goodbye (Client::Close)
  std::vector<std::uint32_t> dead_workers;   // disconnected without goodbye
  std::vector<std::uint64_t> worker_clocks;  // per worker, applied clock
  std::uint64_t registered_bytes = 0;
  // Replication: slots forwarded to the backup (a primary) or applied from
  // the primary's log (a backup).
  std::uint64_t log_records = 0;
  // A primary: log WRITEs posted to its backup (each one transfer and one
  // completion; log_records / log_writes records per WRITE) and READs of
  // the backup's applied index (credits).
  std::uint64_t log_writes = 0;
  std::uint64_t log_credit_reads = 0;
  // Re-protection, on a replacement backup: bytes of shard state (rows,
  // optimizer state, worker words) copied from the primary's snapshot, and
  // the time from its Start until it was in sync (0 until then).
  std::uint64_t catchup_bytes = 0;
  double catchup_seconds = 0;
  // On a primary: re-protections that completed (a new backup counts).
  std::uint32_t reprotections = 0;
};

class Server {
 public:
  // Validates options (InvalidArgument naming the bad field), allocates and
  // registers shards, rings and the directory, and starts listening.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);

  virtual ~Server() = default;
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The address workers connect to ("host:port" with the real port).
  virtual const std::string& address() const = 0;

  // Blocks until Stop() is called, or (options.exit_when_workers_done) until
  // every worker has connected and then closed or died. Returns OK on a
  // clean finish, Unavailable naming the workers that died without closing
  // (in elastic mode, ServerOptions::max_workers, a death is a leave: OK).
  virtual Status Run() = 0;

  // Like Run() but gives up at `deadline` with TimedOut naming the workers
  // that have not connected or not finished.
  virtual Status RunUntil(std::chrono::steady_clock::time_point deadline) = 0;

  // Stops the background threads and makes Run() return. Idempotent; the
  // destructor calls it.
  virtual void Stop() = 0;

  virtual ServerStats stats() const = 0;

  // Asks for a checkpoint of the whole job (the operator's trigger:
  // rdmaps-server takes it on SIGUSR1) and returns at once. The apply thread
  // picks a clock no worker can have passed on any server (or a cut already
  // pending) and publishes it; every worker relays it to every server with
  // its next Clock(), so all servers take the same cut (docs/ps.md,
  // "Checkpoints"). Needs options.checkpoint_dir (else logged and ignored).
  virtual void RequestCheckpoint() = 0;

  // RequestCheckpoint(), then waits until this server's part of the
  // checkpoint that serves it is durable, and returns its clock (the final
  // checkpoint of a graceful stop). FailedPrecondition without a
  // checkpoint_dir or when no worker has connected yet (nothing to save);
  // Unavailable when it failed or was abandoned (a disk error, a worker
  // that died: see the log); TimedOut at `deadline`, naming
  // the workers that have not reached it; Cancelled by Stop().
  virtual Result<std::uint64_t> CheckpointNow(std::chrono::steady_clock::time_point deadline) = 0;

  // Copies this server's current values of rows [range) of `table` (rows it
  // owns) into `out` (range.count * dim floats). For tests and checkpoints.
  virtual Status ReadLocal(std::uint32_t table, RowRange range, std::vector<float>* out) const = 0;

 protected:
  Server() = default;
};

}  // namespace rdmaps

// Options of a parameter server node (ServerOptions) and of a worker
// (ClientOptions). Plain value types; tools fill them from flags and pass them
// to Server::Start() / Client::Connect().
//
// Under a launcher, FromCluster() fills in what the resolved cluster layout
// decides (rdmaps/cluster.h); the caller adds the rest:
//
//   RDMAPS_ASSIGN_OR_RETURN(ClusterLayout layout,
//                           ResolveWorkerCluster(ClusterOptions{}, CurrentEnvironment()));
//   ClientOptions options = ClientOptions::FromCluster(layout);
//   options.tables = my_tables;  // optional: checked against the servers'
//   RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
//
// Every server and every client of a job must be given the same `tables` (the
// servers check that their table lists agree through the directory each
// client reads; a mismatch fails Client::Connect with FailedPrecondition).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/table.h"

namespace rdmaps {

struct ClusterLayout;   // rdmaps/cluster.h
class FailoverDecider;  // rdmaps/failover.h

// A Server's part in its shard's replication (rdmaps/failover.h).
enum class ReplicaRole : std::uint32_t {
  kPrimary = 0,  // serves workers; with replicas == 2 forwards every slot to its backup
  kBackup = 1,   // applies its primary's log; serves workers once promoted
};

// Which transport to use and how; mirrors the transport layer's endpoint
// options without exposing its header.
struct TransportOptions {
  // "tcp", "fake", "verbs" or "auto" (verbs when a usable device exists, else
  // tcp). Fake endpoints exist only inside one process.
  std::string transport = "tcp";
  // The job secret: every process of a job must know the same one (it is
  // proven by a challenge-response, never sent). Empty is refused unless
  // `insecure` (docs/security.md).
  std::string job_token;
  // Run without authentication; logged at WARNING by every process.
  bool insecure = false;
  // A one-sided op without an answer for this long fails its connection.
  std::chrono::milliseconds op_timeout{30000};
  // Completion waits spin this long before sleeping.
  std::chrono::microseconds busy_poll{50};
  // verbs only: device (empty: the one owning the listen address, on a worker the
  // one routing to its first server), port, GID index
  // (-1: rdma_cm chooses).
  std::string ib_dev;
  int ib_port = 1;
  int gid_index = -1;
};

struct ServerOptions {
  TransportOptions transport;
  // "host:port" to listen on; port 0 picks a free port (read it back with
  // Server::address()). The fake transport accepts any unique name.
  std::string listen_address = "127.0.0.1:0";
  // This server's index in [0, num_servers) and the job's shape.
  std::uint32_t server_index = 0;
  std::uint32_t num_servers = 1;
  std::uint32_t num_workers = 1;
  // Elastic mode (docs/ps.md "Elastic workers") when not 0: worker slots
  // (a push ring and a control word each) for up to this many workers, at
  // least num_workers. Workers [0, num_workers) are members from the start;
  // others join a running job (Client::Connect with an id of a free slot)
  // and any member may leave (Close, or dying) without stalling the rest:
  // clocks, SSP/BSP waits, barriers and checkpoints count current members
  // only. 0: a fixed set of num_workers; one that dies fails the waits of
  // the others, naming it.
  std::uint32_t max_workers = 0;
  std::vector<TableOptions> tables;

  // Push ring per worker: `push_slots` slots of `push_slot_bytes` each (a
  // push larger than one slot is split across several). Memory per worker is
  // push_slots * push_slot_bytes (4 MiB by default). push_slot_bytes must be a
  // multiple of 64. Fewer, larger slots cost less per byte: each slot is one
  // WRITE, one notification and one wake-up (docs/perf.md "Push slots").
  std::uint32_t push_slots = 16;
  std::uint32_t push_slot_bytes = 256 * 1024;
  // Threads that apply optimizer updates of one large push (oneTBB); 0 = all
  // cores.
  std::uint32_t apply_threads = 0;
  // Run() returns once every worker has connected and then closed or died
  // (elastic mode: workers [0, num_workers) and every one that joined).
  bool exit_when_workers_done = true;

  // Checkpoints (docs/ps.md, "Checkpoints"). The folder this server writes
  // its part of each checkpoint to; every server of a job gives the same one
  // (a shared file system when they run on several hosts). Empty: no
  // checkpoints are written (Client::Checkpoint fails).
  std::string checkpoint_dir;
  // A checkpoint at every clock that is a multiple of this (0: only those
  // workers ask for with Client::Checkpoint). The same on every server.
  std::uint64_t checkpoint_every = 0;
  // A checkpoint of the whole job about every this long (0: none), timed by
  // server 0 (the others ignore it): a trigger like RequestCheckpoint().
  std::chrono::milliseconds checkpoint_interval{0};
  // Keep the newest this many complete checkpoints (0: keep all).
  std::uint32_t checkpoint_keep = 3;
  // A cut still waiting for a worker after this long is abandoned (a worker
  // died or stopped clocking); the workers it held go on.
  std::chrono::milliseconds checkpoint_timeout{600000};
  // A worker that disconnected without Close() counts as gone (for
  // exit_when_workers_done) only after this long without reconnecting: a
  // worker reconnects after a dead server's restart (docs/ps.md, "Recovery
  // from a dead server"). 0: at once. When set, a connection that carried
  // no slot of the worker's but its rewind (a recovery attempt that gave
  // up) ends without marking the worker dead for its peers' waits.
  std::chrono::milliseconds rejoin_timeout{0};
  // Start from a checkpoint instead of the initialisers: the path of a
  // ckpt-<clock> folder, or "latest" (the newest complete one under
  // checkpoint_dir), or "auto" (like latest, but with none there yet, start
  // from the initialisers: what a restarted job wants). Start() fails, naming the cause and the
  // fix, when it is incomplete, damaged, of a newer format or of other tables; it may have been
  // written by a different number of servers. Every worker then starts at the checkpoint's clock.
  std::string restore;

  // Replication and failover (docs/ps.md, "Replication and failover").
  // 1: the shard has one copy. 2: a primary and a backup, started as two
  // Servers with the same server_index (the placement rule,
  // rdmaps::BackupHostOf, says which process hosts the backup); `failover`
  // must be set on both.
  std::uint32_t replicas = 1;
  ReplicaRole replica_role = ReplicaRole::kPrimary;
  // A primary with replicas == 2: the address its backup listens on
  // (Server::address() of the backup, started first).
  std::string backup_address;
  // How long a primary's wait for its log WRITEs (the backup holds them)
  // spins before sleeping, instead of transport.busy_poll. 0 (default):
  // sleep at once. The wait is a round trip through the backup's process
  // (tens of microseconds on tcp); spinning through it takes a core from
  // the backup and the workers where cores are few (docs/perf.md,
  // "repl-bench"). Raise it where every thread has a core of its own.
  std::chrono::microseconds log_busy_poll{0};
  // Where the primary registers its shard and the survivor of a lost peer
  // asks who serves next (the job's coordinator, or
  // rdmaps::NewEmbeddedFailoverDecider() in one process).
  std::shared_ptr<FailoverDecider> failover;
  // Re-protection (docs/ps.md, "Re-protection"): a replacement backup
  // (replica_role = kBackup, replicas = 2, `failover` set) of a shard that
  // runs with one copy after a failover: the address of the shard's
  // current primary. The replacement connects to it, copies the shard
  // from a snapshot the primary takes at a log index, catches up from the
  // log and, once equal, becomes the shard's backup (a new epoch in the
  // shard map). Empty: an initial backup, which its primary connects to.
  std::string rejoin_as_backup_of;
  // Elastic mode (max_workers > 0), a backup once promoted: each member
  // has this long to connect to it; a member that has not (it died with
  // the old primary, which never told the backup) then leaves as dead, so
  // SSP/BSP waits and barriers stop counting it (logged with the
  // membership epoch). A live worker finds the new primary at its next
  // call (a wait looks at the shard map every 100 ms): keep this above the
  // longest stretch a worker goes without calling the servers.
  std::chrono::milliseconds failover_reconnect_window{10000};

  // The options a server of `layout` (role kServer) starts with: the
  // layout's transport (when it names one) and job token, listen_address,
  // server_index (when known: a ps-lite server learns it in CompleteCluster;
  // until then it stays 0), num_servers and num_workers. Every other field
  // keeps its default.
  static ServerOptions FromCluster(const ClusterLayout& layout);
};

struct ClientOptions {
  TransportOptions transport;
  // This worker's id in [0, num_workers), or in elastic mode in [0,
  // max_workers): an id of a slot no live worker holds. Connect() then joins
  // the running job at the members' current clock (the servers refuse an id
  // a live worker holds).
  std::uint32_t worker_id = 0;
  std::uint32_t num_workers = 1;
  // The servers' ServerOptions::max_workers (0: not elastic).
  std::uint32_t max_workers = 0;
  // The servers' addresses, indexed by server index (all of them).
  std::vector<std::string> servers;
  // Optional: when not empty, checked against the tables the servers
  // publish (ids, names, rows, dims must match). When empty, the client uses
  // the servers' tables as published.
  std::vector<TableOptions> tables;
  // When set, every table's staleness bound becomes min(table's, this).
  std::optional<std::uint32_t> staleness_override;
  // Clock() returns only once this worker is at most s clocks ahead of the
  // slowest worker (s = the smallest staleness bound of the tables; ASP never
  // waits), so a worker that pushes but never pulls is held back too. false:
  // only Pull waits (the next Pull then waits for the same condition); for
  // driving several workers from one thread, as some tests do.
  bool clock_waits = true;
  // Connect() gives up (naming the missing servers) after this long.
  std::chrono::milliseconds connect_timeout{30000};
  // A Pull waiting for slow workers, a Push waiting for ring space, a
  // Barrier: each fails with TimedOut (naming who is late) after this long.
  std::chrono::milliseconds wait_timeout{60000};
  // Connect() fails with Unavailable (having sent nothing) when server i's
  // incarnation id (Client::server_incarnations) is refuse_incarnations[i]:
  // for reconnecting after a failure only to servers restarted since.
  std::vector<std::uint64_t> refuse_incarnations;
  // Reconnecting after a server failure with only the dead servers
  // restarted: the incarnation ids of the servers before it
  // (Client::server_incarnations of the broken Client). Servers whose id is
  // new restarted from a checkpoint c (all must agree); Connect asks every
  // other server (a survivor) to rewind in place to c, waits until each
  // did, and starts at c. Unavailable while no server has restarted yet.
  std::vector<std::uint64_t> rewind_from;
  // Bytes of registered staging memory per server connection (pull side);
  // a pull larger than this is split into several batches of READs.
  std::size_t staging_bytes = 4 << 20;
  // Replicated shards (docs/ps.md, "Replication and failover"): the shard
  // map the servers registered in. When set, `servers` are the addresses at
  // start, the worker keeps each push until its server acknowledged it
  // (ring_slots slots of memory per server) and, when a server is lost,
  // waits (within wait_timeout) for the new epoch of its shard, reconnects,
  // resends what was not acknowledged and retries the call. Pull, Push,
  // PushPull, Clock and Flush fail over; Barrier and Checkpoint do not yet.
  std::shared_ptr<FailoverDecider> failover;
  // Without `failover`: when this has an address, Connect opens the
  // decider kept in that coordinator (rdmaps::OpenFailoverDecider) and uses
  // it as `failover`. FromCluster sets it for a layout with replicas == 2.
  CoordinatorConfig failover_coordinator;

  // The options a worker of a completed `layout` (role kWorker, after
  // CompleteCluster or ResolveWorkerCluster) connects with: the layout's
  // transport (when it names one) and job token, worker_id, num_workers,
  // servers and, as connect_timeout, the layout's startup_timeout. Every
  // other field keeps its default.
  static ClientOptions FromCluster(const ClusterLayout& layout);
};

}  // namespace rdmaps

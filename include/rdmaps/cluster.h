// Cluster layout: who this process is (a parameter server, a worker, or a
// ps-lite style scheduler), its index, and the addresses of every server.
//
// One resolver, shared by rdmaps-server, rdmaps-local, the client library and
// every tool, so that rdmaps fits whatever launcher a cluster already has. It
// takes the FIRST source that is present, in this order, and logs which one:
//
//  1. explicit options (role, task_index, ps_hosts, worker_hosts/num_workers),
//     or a TensorFlow ClusterSpec JSON file ({"ps": [...], "worker": [...]});
//  2. RDMAPS_ROLE, RDMAPS_TASK_INDEX, RDMAPS_PS_HOSTS, RDMAPS_WORKER_HOSTS,
//     RDMAPS_NUM_WORKERS (what rdmaps-local gives the processes it starts);
//  3. TF_CONFIG ({"cluster": {...}, "task": {"type": "ps", "index": 0}}, as
//     Kubeflow's TFJob sets it; "chief" counts as a worker, placed first);
//  4. ps-lite's DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT,
//     DMLC_NUM_SERVER, DMLC_NUM_WORKER (the scheduler hosts a rendezvous that
//     hands out indices in arrival order);
//  5. rank-based launchers, innermost first (a launcher started inside
//     another one inherits its variables): torchrun (RANK, WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK/SIZE), MPICH
//     (PMI_RANK/PMI_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS,
//     SLURM_JOB_NODELIST). The first num_servers ranks serve, the rest work;
//     a rendezvous at rank 0 exchanges addresses. RDMAPS_NUM_SERVERS and
//     RDMAPS_RENDEZVOUS stand in for options.num_servers / .rendezvous, so a
//     worker program needs no flags of its own (mpirun -x RDMAPS_...);
//  6. nothing set: one server and one worker on loopback.
//
// A source that is present but malformed is an error (InvalidArgument quoting
// the offending part), never silently skipped: skipping is how start-ups hang.
//
// Two steps, because a server must listen before it can report its address:
//   RDMAPS_ASSIGN_OR_RETURN(ClusterLayout layout, ResolveCluster(options, env));
//   // A server: listen on layout.listen_address, then pass the real address.
//   RDMAPS_ASSIGN_OR_RETURN(layout, CompleteCluster(std::move(layout),
//                                                  listen_address, options));
// CompleteCluster is a no-op for sources that already name every server, and
// otherwise runs the rendezvous, by options.startup_timeout; when that passes
// every waiting process gets TimedOut naming the ranks that never arrived.
//
// Thread safety: these are free functions on values; call them from any
// thread. The rendezvous blocks the calling thread until it ends.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/status.h"

namespace rdmaps {

enum class Role : std::uint8_t {
  kServer,     // Holds parameter shards ("ps" in TensorFlow's words).
  kWorker,     // Trains; pulls and pushes.
  kScheduler,  // ps-lite's scheduler: hosts the rendezvous, then exits.
  kEvaluator,  // TFJob's Evaluator replica (TF_CONFIG task type "evaluator"):
               // not part of the training cluster; rdmaps' tools exit 0.
};

// "ps", "worker", "scheduler" or "evaluator".
std::string_view RoleName(Role role);
// Accepts "ps", "server", "worker", "chief", "scheduler" (any case).
Result<Role> ParseRole(std::string_view text);

// The process environment as a map; tools pass CurrentEnvironment(), tests
// pass their own.
using Environment = std::map<std::string, std::string>;
Environment CurrentEnvironment();

// Port a server listens on when nothing at all is configured (source 6).
inline constexpr int kDefaultServerPort = 7470;
// Rendezvous port at the root when the launcher does not imply one.
inline constexpr int kDefaultRendezvousPort = 7471;

// Where a job's decisions live (docs/coordination.md): which server is the
// primary and which the backup of each shard, at which epoch, and which
// processes are alive. An empty address: no coordinator (no failover).
struct CoordinatorConfig {
  // "memory:NAME" (one process: threads, tests), "dir:/PATH" (the processes
  // of one machine; rdmaps-local gives its children one), or
  // "etcd://HOST:PORT[,HOST:PORT...]" / "etcd+https://..." (a cluster).
  std::string address;
  // Prepended to every key, so jobs can share an etcd ("rdmaps/<job>/").
  std::string job_prefix;
  // etcd with authentication: a user and a file (mode 0600) holding its
  // password; with TLS, the CA bundle and a client certificate and key.
  std::string etcd_user;
  std::string etcd_password_file;
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
};

struct ClusterOptions {
  // Explicit layout (source 1). role: "ps"/"server", "worker" or "chief".
  std::string role;
  int task_index = -1;
  // Comma-separated host:port lists. A worker does not listen, so it may be
  // given as host:0, or only counted with num_workers.
  std::string ps_hosts;
  std::string worker_hosts;
  // Path of a ClusterSpec JSON file: {"ps": ["h:p", ...], "worker": [...]}.
  std::string cluster_spec;

  // Worker count when worker_hosts is not given; with 0, the loopback
  // default (source 6) has one worker.
  int num_workers = 0;
  // Rank-based sources: the first num_servers ranks serve (0 means 1).
  // When set, every other source is checked against it.
  int num_servers = 0;

  // Role this process takes when nothing is configured (source 6):
  // rdmaps-server passes kServer, worker programs kWorker.
  Role default_role = Role::kWorker;

  // Where the rendezvous root listens: "host:port", or "file:PATH" (the root
  // listens on a free port and publishes "host:port" in PATH, which must be
  // on a file system every rank sees). Empty: MASTER_ADDR:MASTER_PORT+1 for
  // torchrun, DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT for ps-lite, the first
  // Slurm node at kDefaultRendezvousPort, loopback for a single-node MPI job.
  std::string rendezvous;
  // The host other processes reach this one at (rank-based and ps-lite
  // sources). Empty: loopback when the job is on one node, else the node
  // name (SLURMD_NODENAME, DMLC_NODE_HOST) or gethostname().
  std::string advertise_host;

  // The job secret, proven (never sent) in the rendezvous and every
  // transport handshake. Empty: RDMAPS_JOB_SECRET_FILE, RDMAPS_JOB_SECRET,
  // else derived from the launcher's job and the per-user key
  // (docs/security.md).
  std::string job_token;
  // Run without a secret (also RDMAPS_INSECURE=1): logged at WARNING.
  bool insecure = false;
  // Deadline of the whole rendezvous (RDMAPS_STARTUP_TIMEOUT_S, when set,
  // stands in for it: see ClusterLayout::startup_timeout).
  std::chrono::milliseconds startup_timeout{60000};
  // The job's coordinator; an empty address defers to the environment (see
  // ClusterLayout::coordinator).
  CoordinatorConfig coordinator;
};

struct ClusterLayout {
  Role role = Role::kWorker;
  // Index within the role: servers 0..num_servers-1, workers likewise. -1
  // until a ps-lite rendezvous assigns it.
  int index = 0;
  int num_servers = 0;
  int num_workers = 0;
  // Every server's address, by index; complete after CompleteCluster.
  std::vector<std::string> servers;
  // Workers' addresses by index when the source names them (informational:
  // workers do not listen), else empty.
  std::vector<std::string> workers;
  // Where this process listens when it is a server ("host:port"; port 0
  // means any free port).
  std::string listen_address;
  // Which source won ("options", "cluster_spec", "RDMAPS_*", "TF_CONFIG",
  // "DMLC", "torchrun", "Open MPI", "MPICH", "Slurm", "loopback") and the
  // variables that decided it, for logs.
  std::string source;
  std::string source_detail;
  // Carried to the transport: RDMAPS_TRANSPORT and the job secret (empty
  // when none was found, or insecure).
  std::string transport;
  std::string job_token;
  // The start-up deadline of the job: RDMAPS_STARTUP_TIMEOUT_S (seconds;
  // rdmaps-server and rdmaps-local give it to the workers they start, from
  // their --startup_timeout_s) or else ClusterOptions.startup_timeout. The
  // rendezvous (CompleteCluster) and ClientOptions::FromCluster's
  // connect_timeout use it, so a worker waits for its servers as long as
  // the servers wait for it.
  std::chrono::milliseconds startup_timeout{0};
  // Copies of each shard: RDMAPS_REPLICAS (1 or 2; rdmaps-local --replicas
  // gives it to every process), else 1. With 2, ClientOptions::FromCluster
  // makes the worker follow the shard map in `coordinator` (failover).
  int replicas = 1;
  // No secret: ClusterOptions::insecure or RDMAPS_INSECURE=1.
  bool insecure = false;
  // Where the secret came from, for logs ("RDMAPS_JOB_SECRET", "derived
  // from Slurm job 12 step 0 and /home/u/.config/rdmaps/key", ...).
  std::string secret_source;

  // Rank-based and ps-lite sources before CompleteCluster.
  bool needs_rendezvous = false;
  std::string rendezvous;  // "host:port" or "file:PATH".
  int rank = -1;           // -1: assigned by the root (ps-lite).
  int world_size = 0;
  std::string advertise_host;

  // The job's coordinator: ClusterOptions::coordinator when its address is
  // set, else RDMAPS_COORDINATOR, RDMAPS_COORDINATOR_PREFIX (default: from
  // the launcher's job identity, else "rdmaps/job/"), RDMAPS_ETCD_USER,
  // RDMAPS_ETCD_PASSWORD_FILE, RDMAPS_ETCD_CA_FILE, RDMAPS_ETCD_CERT_FILE,
  // RDMAPS_ETCD_KEY_FILE. Empty address: none.
  CoordinatorConfig coordinator;

  // Multi-line, human-readable (what --print_layout prints).
  std::string ToString() const;
  // This process's name in logs: "ps0", "worker2", "scheduler".
  std::string name() const;
};

// Picks the first present source (see the top of this file). No network.
Result<ClusterLayout> ResolveCluster(const ClusterOptions& options, const Environment& env);

// Finishes a layout: for sources that need a rendezvous, registers
// `self_address` (a server's real listen address; a worker may pass "") with
// the root and returns the layout with every server address filled in. The
// root (rank 0, or the ps-lite scheduler) serves the rendezvous inside this
// call. TimedOut at options.startup_timeout naming the missing ranks;
// PermissionDenied on a job-token mismatch; FailedPrecondition on a protocol
// version mismatch; InvalidArgument when ranks disagree on the job's shape.
Result<ClusterLayout> CompleteCluster(ClusterLayout layout, std::string_view self_address,
                                      const ClusterOptions& options);

// ResolveCluster then CompleteCluster with no address of its own: for workers.
Result<ClusterLayout> ResolveWorkerCluster(const ClusterOptions& options, const Environment& env);

// A fresh job secret: 32 random bytes as 64 hex digits (launchers that start
// every process themselves, and servers started by hand).
std::string GenerateJobSecret();

// Writes `secret` to `path` readable by this user only (mode 0600; missing
// directories 0700), replacing a file of ours: what a server started by
// hand leaves for workers started by hand (RDMAPS_JOB_SECRET_FILE=path).
Status WriteJobSecretFile(const std::string& path, const std::string& secret);

// Where such a server writes it by default:
// ${XDG_RUNTIME_DIR:-${XDG_CONFIG_HOME:-$HOME/.config}/rdmaps}/job-secret-<pid>
// (empty when none of these is set).
std::string DefaultJobSecretFile(const Environment& env, int pid);

}  // namespace rdmaps

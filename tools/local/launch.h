// One rdmaps-local run: a whole rdmaps job on this machine, in phases.
//
// 1. Tables: LaunchOptions::tables, or else the worker command is run once
//    with RDMAPS_DESCRIBE_TABLES=PATH and must write its tables there
//    (rdmaps::DescribeTablesIfAsked) and exit 0.
// 2. Servers: N rdmaps-server child processes listening on port 0 of `host`;
//    each reports its real address on a pipe (--ready_fd) when ready.
// 3. Workers: M child processes of the worker command, each with its layout
//    in the environment: RDMAPS_ROLE=worker, RDMAPS_TASK_INDEX,
//    RDMAPS_PS_HOSTS, RDMAPS_NUM_WORKERS, RDMAPS_TRANSPORT, RDMAPS_JOB_SECRET
//    (or, with layout_env "tf_config", a TF_CONFIG per process).
// 4. Every child's output is streamed with a prefix ("[ps0] ...",
//    "[worker2] ..."). The job ends when every worker has exited: Launch
//    returns the first non-zero exit code (a signal N counts as 128+N), or 0.
//    A failing worker, a server exiting early, Ctrl-C / SIGTERM (forwarded
//    to every child) or the job deadline stop everything: SIGTERM, then
//    SIGKILL after the grace period. With restart_servers, a server that
//    dies has every server restarted from the latest checkpoint instead.
//    With replicas = 2 a dead copy of a shard is replaced by a new backup
//    that copies the shard from the survivor (max_replacements).
// The children are supervised by a Job (job.h).
//
// Thread safety: Launch blocks the calling thread until the job has ended.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace rdmaps::local {

// Exit codes of Launch besides the children's.
inline constexpr int kExitConfig = 2;
inline constexpr int kExitTimeout = 124;

struct LaunchOptions {
  int servers = 1;
  int workers = 1;
  // "tcp", "verbs" or "auto"; given to every process as RDMAPS_TRANSPORT.
  std::string transport = "auto";
  // The address servers listen on.
  std::string host = "127.0.0.1";
  // The job's tables as a JSON file; empty: ask the worker command.
  std::string tables;
  // "rdmaps" (RDMAPS_* variables) or "tf_config".
  std::string layout_env = "rdmaps";
  // rdmaps-server to run; empty: next to this executable, else from PATH.
  std::string server_binary;
  // Extra flags for every rdmaps-server, space-separated.
  std::string server_args;
  // Empty: random per run.
  std::string job_token;  // the job secret; empty: a random one
  bool insecure = false;  // children get RDMAPS_INSECURE=1 instead of a secret
  // For the servers to be ready and the workers to connect.
  std::chrono::seconds startup_timeout{60};
  // For the whole job (exit kExitTimeout); 0: none.
  std::chrono::seconds timeout{0};
  // After SIGTERM, children get this long before SIGKILL.
  std::chrono::seconds grace{10};
  // A server that dies is not the end of the job, this many times: every
  // server is killed and started again on its port with --restore=auto
  // (the newest complete checkpoint under the --checkpoint_dir that
  // server_args must give), and the workers reconnect and rewind to it
  // (rdmaps-train --max_recoveries). 0: a dead server stops the job.
  int restart_servers = 0;
  // Fault drill: this worker is not started (its slot stays empty).
  int omit_worker = -1;
  // Elastic workers (docs/ps.md "Elastic workers"): servers get
  // --max_workers=max_workers and every worker RDMAPS_NUM_WORKERS =
  // max_workers (the slot count; TF_CONFIG lists that many workers). 0: a
  // fixed set. join_workers more workers (ids workers, workers + 1, ...)
  // start join_after after the first ones and join the running job.
  int max_workers = 0;
  int join_workers = 0;
  std::chrono::seconds join_after{0};
  // Copies of each shard (docs/ps.md, "Replication and failover"): 2 starts
  // per shard a backup (rdmaps-server --replicas=2 --replica_role=backup)
  // and then its primary (--backup_address=the backup's address); every
  // process gets RDMAPS_REPLICAS=2, so workers follow the shard map in the
  // job's coordinator. A server that dies is then not the end of the job:
  // the other copy serves its shard. Backups still running when the last
  // worker has exited are stopped (SIGTERM) at once.
  int replicas = 1;
  // Re-protection (docs/ps.md, "Re-protection"), with replicas = 2: when a
  // copy of a shard dies and the shard map names its survivor as the
  // shard's only copy, a replacement rdmaps-server (ps<i>r<k>) is started
  // with --rejoin_as_backup_of=the survivor; it copies the shard while the
  // workers go on and becomes its backup, so the shard survives another
  // death. At most this many replacements are started over the whole job
  // (each attempt counts; one that fails is tried again 0.5 s later). 0:
  // none (a shard stays with one copy).
  int max_replacements = 4;
  // Print the layout the workers would get, start nothing.
  bool print_layout = false;
  // The worker command.
  std::vector<std::string> command;
};

// Runs the job; returns rdmaps-local's exit code.
int Launch(const LaunchOptions& options);

}  // namespace rdmaps::local

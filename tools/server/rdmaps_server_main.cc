// rdmaps-server: runs one parameter-server node.
//
//   rdmaps-server --tables=tables.json --role=ps --task_index=0
//       --ps_hosts=10.0.0.1:7470,10.0.0.2:7470 --num_workers=4   (one line)
//   rdmaps-server --flagfile=/etc/rdmaps/server.flags
//   mpirun -np 6 rdmaps-server --num_servers=2 --tables=t.json -- ./my_worker
//
// The layout comes from the resolver (include/rdmaps/cluster.h): flags, a
// ClusterSpec file, RDMAPS_*, TF_CONFIG, DMLC_*, or a rank-based launcher.
// Under a rank-based launcher every rank runs the same command; the ranks
// that the layout makes workers exec the command given after `--`.
//
// Lifecycle: start-up (listen, rendezvous if any) -> ready (a log line,
// sd_notify READY=1 under systemd, "host:port\n" on --ready_fd) -> wait for
// every worker to connect by --startup_timeout_s (else exit 3 naming the
// missing workers) -> serve until every worker has closed (exit 0) or some
// died (exit 4 naming them). SIGTERM/SIGINT: without --checkpoint_dir stop
// accepting, finish the batch of pushes being applied, exit 0; with it,
// first a final checkpoint of the whole job (Server::CheckpointNow: the cut
// at the next consistent clock, durable within --checkpoint_timeout_s),
// then exit 0; a second SIGTERM/SIGINT, the timeout or a failure of that
// checkpoint exits 1 without it (logged). SIGUSR1: a checkpoint of the whole
// job (Server::RequestCheckpoint), training goes on.
//
//   rdmaps-server --checkpoint_now --pid_file=F [--checkpoint_dir=D]
// sends SIGUSR1 to the rdmaps-server whose --pid_file is F and, with D,
// waits (--checkpoint_timeout_s) until D's `latest` names a newer
// checkpoint, printing it (exit 0; 1 when none came in time, 2 for a pid
// file that names no rdmaps-server).
//
// Signals are blocked in every thread and taken by sigwait() on a thread of
// our own: no signal handler runs, so nothing async-signal-unsafe can.
//
// Exit codes: 0 done, 1 runtime error (or stopped without its final
// checkpoint), 2 bad configuration, 3 start-up deadline passed, 4 workers
// died.
#include <errno.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/failover.h"
#include "rdmaps/server.h"
#include "rdmaps/tables_json.h"
#include "src/base/fd.h"
#include "tools/common/exit.h"
#include "tools/common/flags.h"
#include "tools/common/signal_thread.h"

// ClusterLayout (see include/rdmaps/cluster.h).
DEFINE_string(role, "", "explicit layout: ps (or server) or worker");
DEFINE_int32(task_index, -1, "explicit layout: index of this task within its role");
DEFINE_string(ps_hosts, "", "explicit layout: comma-separated host:port of every server");
DEFINE_string(worker_hosts, "", "explicit layout: comma-separated host:port of every worker");
DEFINE_int32(num_workers, 0, "number of workers (instead of --worker_hosts)");
DEFINE_int32(num_servers, 0, "rank-based launchers: the first N ranks serve (default 1)");
DEFINE_string(cluster_spec, "", "TensorFlow ClusterSpec JSON file (with --role, --task_index)");
DEFINE_string(rendezvous, "", "rank-based launchers: HOST:PORT or file:PATH of the rendezvous");
DEFINE_string(advertise_host, "", "host other processes reach this one at (rank-based)");
DEFINE_bool(insecure, false,
            "run without a job secret (also RDMAPS_INSECURE=1): anyone who reaches the port "
            "can read and overwrite the tables");
DEFINE_string(secret_file, "",
              "started by hand (no launcher, no RDMAPS_JOB_SECRET[_FILE]): write the generated "
              "job secret here, mode 0600 (default: $XDG_RUNTIME_DIR/rdmaps/job-secret-PID); "
              "workers read it with RDMAPS_JOB_SECRET_FILE=PATH");
DEFINE_int32(startup_timeout_s, 120,
             "start-up deadline: rendezvous and every worker connected, else exit 3");
DEFINE_bool(print_layout, false, "print the resolved layout and exit");

// Server.
DEFINE_string(tables, "",
              "the job's tables as JSON (see docs/deploying.md); without it, "
              "the worker command after -- is asked for them");
DEFINE_string(listen, "", "host:port to listen on (default: this server's layout address)");
DEFINE_string(transport, "", "tcp, verbs or auto (default: $RDMAPS_TRANSPORT, else auto)");
DEFINE_int32(op_timeout_ms, 30000, "an operation without an answer for this long fails");
DEFINE_string(ib_dev, "", "verbs: device (default: the one owning the listen address)");
DEFINE_int32(ib_port, 1, "verbs: port");
DEFINE_int32(gid_index, -1, "verbs: GID index (-1: rdma_cm chooses)");
DEFINE_uint32(push_slots, rdmaps::ServerOptions{}.push_slots, "push ring slots per worker");
DEFINE_uint32(push_slot_bytes, rdmaps::ServerOptions{}.push_slot_bytes,
              "bytes per push ring slot (a multiple of 64)");
DEFINE_uint32(apply_threads, 0, "threads applying one large push (0: all cores)");
DEFINE_uint32(max_workers, 0,
              "elastic mode: worker slots for up to this many workers (>= the layout's "
              "workers, who start as members); others join later and any may leave "
              "(docs/ps.md \"Elastic workers\"). 0: a fixed set");
DEFINE_string(checkpoint_dir, "",
              "write checkpoints to this folder (the same, shared, for every server of the job)");
DEFINE_uint64(checkpoint_every, 0,
              "checkpoint at every clock that is a multiple of this (0: only "
              "when workers call Client::Checkpoint)");
DEFINE_uint32(checkpoint_keep, 3, "keep the newest this many complete checkpoints (0: all)");
DEFINE_int32(checkpoint_timeout_s, 600,
             "abandon a checkpoint that a worker has not reached after this long (also the "
             "final checkpoint's deadline on SIGTERM, and --checkpoint_now's wait)");
DEFINE_int32(checkpoint_every_s, 0,
             "a checkpoint of the whole job about every this many seconds, timed by server 0 "
             "(0: none)");
DEFINE_int32(rejoin_timeout_s, 0,
             "a worker that disconnected without closing may reconnect this long (after a "
             "dead server's restart) before this server counts it gone");
DEFINE_string(pid_file, "",
              "write this process's pid here while it serves (--checkpoint_now "
              "reads it)");
DEFINE_bool(checkpoint_now, false,
            "ask the running rdmaps-server of --pid_file for a checkpoint of the whole job "
            "(SIGUSR1) and, with --checkpoint_dir, wait until it is complete");
DEFINE_string(restore, "",
              "start from a checkpoint: its ckpt-<clock> folder, latest (the newest complete "
              "one under --checkpoint_dir) or auto (latest if there is one, else start fresh); "
              "any number of servers may have written it");
// Replication and failover (docs/ps.md, "Replication and failover").
DEFINE_uint32(replicas, 0,
              "copies of this server's shard: 1, or 2 for a primary and a backup (two "
              "rdmaps-server processes with the same index; start the backup first). 0: "
              "$RDMAPS_REPLICAS, else 1");
DEFINE_string(replica_role, "primary",
              "with --replicas=2: primary (serves workers, forwards every push to its backup) "
              "or backup (applies the primary's log; serves once promoted)");
DEFINE_string(backup_address, "",
              "a primary with --replicas=2: HOST:PORT of its backup (the backup's ready line)");
DEFINE_string(coordinator, "",
              "the job's coordinator, where the shard map and the primaries' leases live: "
              "etcd://HOST:PORT[,...], dir:/PATH (one machine) (default: $RDMAPS_COORDINATOR)");
DEFINE_int32(lease_ttl_ms, 750,
             "a replicated primary's lease: one that stops renewing it (hung, SIGSTOPped) is "
             "replaced by its backup within about this long");
DEFINE_string(rejoin_as_backup_of, "",
              "re-protection: with --replicas=2 --replica_role=backup, HOST:PORT of the "
              "shard's current primary, which has served alone since a failover: this "
              "server copies its shard while training goes on, catches up from its log and "
              "becomes its backup");
DEFINE_int32(ready_fd, -1, "write \"host:port\\n\" to this fd when ready (used by rdmaps-local)");
DEFINE_int32(run_timeout_s, 0, "give up (exit 1) after this long serving; 0: no limit");

namespace {

// --replicas, --replica_role, --backup_address, --rejoin_as_backup_of,
// --coordinator and --lease_ttl_ms onto ServerOptions (replicas,
// replica_role, backup_address, rejoin_as_backup_of, failover);
// InvalidArgument naming the flag to fix.
rdmaps::Status ApplyReplicationFlags(const rdmaps::ClusterLayout& layout,
                                     rdmaps::ServerOptions* so) {
  const std::uint32_t replicas =
      FLAGS_replicas != 0 ? FLAGS_replicas : static_cast<std::uint32_t>(layout.replicas);
  if (replicas != 1 && replicas != 2) {
    return rdmaps::InvalidArgumentError("--replicas=" + std::to_string(replicas) +
                                        " is not 1 or 2");
  }
  const bool role_given = !gflags::GetCommandLineFlagInfoOrDie("replica_role").is_default;
  if (FLAGS_replica_role != "primary" && FLAGS_replica_role != "backup") {
    return rdmaps::InvalidArgumentError("--replica_role=" + FLAGS_replica_role +
                                        " is not primary or backup");
  }
  if (replicas == 1) {
    if (role_given || !FLAGS_backup_address.empty() || !FLAGS_rejoin_as_backup_of.empty()) {
      return rdmaps::InvalidArgumentError(
          "--replica_role, --backup_address and --rejoin_as_backup_of need --replicas=2 (or "
          "RDMAPS_REPLICAS=2)");
    }
    return rdmaps::Status::OK();
  }
  so->replicas = 2;
  so->replica_role =
      FLAGS_replica_role == "backup" ? rdmaps::ReplicaRole::kBackup : rdmaps::ReplicaRole::kPrimary;
  if (so->replica_role == rdmaps::ReplicaRole::kPrimary && FLAGS_backup_address.empty()) {
    return rdmaps::InvalidArgumentError(
        "a primary with --replicas=2 needs --backup_address=HOST:PORT of its backup (start the "
        "backup first, with --replica_role=backup; its ready line is its address)");
  }
  if (so->replica_role == rdmaps::ReplicaRole::kBackup && !FLAGS_backup_address.empty()) {
    return rdmaps::InvalidArgumentError("--backup_address is a primary's flag, not a backup's");
  }
  if (!FLAGS_rejoin_as_backup_of.empty() && so->replica_role != rdmaps::ReplicaRole::kBackup) {
    return rdmaps::InvalidArgumentError(
        "--rejoin_as_backup_of is a replacement backup's flag: add --replica_role=backup");
  }
  so->rejoin_as_backup_of = FLAGS_rejoin_as_backup_of;
  so->backup_address = FLAGS_backup_address;
  rdmaps::CoordinatorConfig coordinator = layout.coordinator;
  if (!FLAGS_coordinator.empty()) coordinator.address = FLAGS_coordinator;
  if (coordinator.job_prefix.empty()) coordinator.job_prefix = "rdmaps/job/";
  auto decider =
      rdmaps::OpenFailoverDecider(coordinator, std::chrono::milliseconds(FLAGS_lease_ttl_ms));
  if (!decider.ok()) return decider.status().WithContext("--replicas=2");
  so->failover = std::move(*decider);
  LOG(INFO) << "replicated shard " << so->server_index << ": "
            << (so->replica_role == rdmaps::ReplicaRole::kBackup
                    ? std::string("backup")
                    : "primary, backup at " + so->backup_address)
            << ", shard map in " << coordinator.address << " (prefix " << coordinator.job_prefix
            << "), lease " << FLAGS_lease_ttl_ms << " ms";
  return rdmaps::Status::OK();
}

using rdmaps::ClusterLayout;
using rdmaps::Environment;
using rdmaps::Result;
using rdmaps::Role;
using rdmaps::Status;

constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;
constexpr int kExitStartup = 3;
constexpr int kExitWorkersDied = 4;

// Sends one datagram to $NOTIFY_SOCKET (systemd's sd_notify protocol, no
// libsystemd needed). OK when NOTIFY_SOCKET is unset.
Status SdNotify(const Environment& env, const std::string& state) {
  auto it = env.find("NOTIFY_SOCKET");
  if (it == env.end() || it->second.empty()) return Status::OK();
  const std::string& path = it->second;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.size() >= sizeof(sa.sun_path)) {
    return rdmaps::InvalidArgumentError("NOTIFY_SOCKET path is too long: " + path);
  }
  std::memcpy(sa.sun_path, path.data(), path.size());
  if (path[0] == '@') sa.sun_path[0] = '\0';  // abstract namespace
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  const rdmaps::Fd sock(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return rdmaps::ErrnoError("sd_notify: socket", errno);
  const ssize_t n = sendto(sock.get(), state.data(), state.size(), MSG_NOSIGNAL,
                           reinterpret_cast<sockaddr*>(&sa), len);
  if (n < 0) return rdmaps::ErrnoError("sd_notify to " + path, errno);
  return Status::OK();
}

// The command after `--` (the worker program for worker ranks).
std::vector<std::string> g_worker_command;

[[noreturn]] void ExecWorker(const ClusterLayout& layout) {
  if (g_worker_command.empty()) {
    LOG(ERROR) << "this process is " << layout.name() << " in the " << layout.source
               << " layout, but rdmaps-server runs servers only; give the worker command "
                  "after `--` (rdmaps-server ... -- ./my_worker args) or start workers "
                  "separately";
    std::exit(kExitConfig);
  }
  LOG(INFO) << layout.name() << ": exec " << g_worker_command[0];
  google::FlushLogFiles(google::GLOG_INFO);
  std::vector<char*> argv;
  for (auto& a : g_worker_command) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The worker inherits this environment and resolves the same layout: what
  // this process was told by flags goes with it as the variables that stand
  // in for them (so `--num_servers=2 -- ./my_worker` needs nothing more).
  if (layout.needs_rendezvous) {
    setenv("RDMAPS_NUM_SERVERS", std::to_string(layout.num_servers).c_str(), 1);
    setenv("RDMAPS_RENDEZVOUS", layout.rendezvous.c_str(), 1);
  }
  setenv("RDMAPS_STARTUP_TIMEOUT_S", std::to_string(FLAGS_startup_timeout_s).c_str(), 1);
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  execvp(argv[0], argv.data());
  LOG(ERROR) << "cannot exec the worker command " << g_worker_command[0] << ": "
             << std::strerror(errno) << "; check the path after `--`";
  std::exit(127);
}

// Runs the worker command once with RDMAPS_DESCRIBE_TABLES set and reads the
// tables it writes.
Result<std::vector<rdmaps::TableOptions>> AskWorkerForTables() {
  if (g_worker_command.empty()) {
    return rdmaps::InvalidArgumentError(
        "no tables: pass --tables=FILE (see docs/deploying.md for the format), or a worker "
        "command after `--` that describes its tables");
  }
  char tmpl[] = "/tmp/rdmaps-tables-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return rdmaps::ErrnoError("mkstemp", errno);
  close(fd);
  std::string cmd = std::string(rdmaps::kDescribeTablesEnv) + "=" + tmpl;
  for (const auto& a : g_worker_command) cmd += " '" + a + "'";
  int rc = std::system(cmd.c_str());
  auto tables = rdmaps::ReadTablesFile(tmpl);
  std::remove(tmpl);
  if (rc != 0 || !tables.ok() || tables->empty()) {
    return rdmaps::InvalidArgumentError(
        "no tables: the worker command did not describe its tables (exit " + std::to_string(rc) +
        ", " + tables.status().ToString() + "); pass --tables=FILE");
  }
  return tables;
}

// The newest clock `latest` under `dir` names ("ckpt-<20 digits>"), or -1.
long double LatestClock(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string name;
  if (!(in >> name) || name.size() != 25 || name.rfind("ckpt-", 0) != 0) return -1;
  long double v = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// --checkpoint_now: SIGUSR1 to the server of --pid_file, then (with
// --checkpoint_dir) wait for a newer complete checkpoint.
int CheckpointNowCommand() {
  if (FLAGS_pid_file.empty()) {
    LOG(ERROR) << "--checkpoint_now needs --pid_file=PATH (the one the server was started with)";
    return kExitConfig;
  }
  std::ifstream in(FLAGS_pid_file);
  std::string text;
  in >> text;
  long pid = 0;
  bool ok = !text.empty() && text.size() <= 10;
  for (char ch : text) {
    if (ch < '0' || ch > '9') ok = false;
    if (ok) pid = pid * 10 + (ch - '0');
  }
  if (!ok || pid <= 1 || pid > std::numeric_limits<pid_t>::max()) {
    LOG(ERROR) << "--pid_file " << FLAGS_pid_file << " holds no pid (\"" << text.substr(0, 20)
               << "\"); is the server running with --pid_file=" << FLAGS_pid_file << "?";
    return kExitConfig;
  }
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  if (name != "rdmaps-server") {
    LOG(ERROR) << "pid " << pid << " of " << FLAGS_pid_file << " is not an rdmaps-server ("
               << (name.empty() ? std::string("no such process") : name)
               << "): a stale pid file? not signalled";
    return kExitConfig;
  }
  const long double before = FLAGS_checkpoint_dir.empty() ? -1 : LatestClock(FLAGS_checkpoint_dir);
  if (kill(static_cast<pid_t>(pid), SIGUSR1) != 0) {
    LOG(ERROR) << "kill(" << pid << ", SIGUSR1): " << std::strerror(errno);
    return kExitRuntime;
  }
  if (FLAGS_checkpoint_dir.empty()) {
    std::cout << "asked rdmaps-server " << pid << " for a checkpoint" << std::endl;
    return 0;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::seconds(std::max(1, FLAGS_checkpoint_timeout_s));
  while (std::chrono::steady_clock::now() < deadline) {
    if (LatestClock(FLAGS_checkpoint_dir) > before) {
      std::ifstream latest(FLAGS_checkpoint_dir + "/latest");
      std::string ck;
      latest >> ck;
      std::cout << FLAGS_checkpoint_dir << "/" << ck << std::endl;
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling the folder
  }
  LOG(ERROR) << "no newer complete checkpoint in " << FLAGS_checkpoint_dir << " within "
             << FLAGS_checkpoint_timeout_s << " s of asking rdmaps-server " << pid
             << " (see its log)";
  return kExitRuntime;
}

// The final checkpoint of a graceful stop, run on a thread of its own so
// that the signal thread still sees a second SIGTERM.
struct FinalCheckpoint {
  std::mutex mu;
  std::thread thread;
  bool asked = false;
  bool closed = false;  // the server is shutting down: no final checkpoint now
  Status result;        // of CheckpointNow, once the thread is done
  std::uint64_t clock = 0;
  ~FinalCheckpoint() {
    if (thread.joinable()) thread.join();
  }
};

int RealMain(rdmaps::tools::SignalThread& signals) {
  if (FLAGS_checkpoint_now) return CheckpointNowCommand();
  Environment env = rdmaps::CurrentEnvironment();
  rdmaps::ClusterOptions lo;
  lo.role = FLAGS_role;
  lo.task_index = FLAGS_task_index;
  lo.ps_hosts = FLAGS_ps_hosts;
  lo.worker_hosts = FLAGS_worker_hosts;
  lo.num_workers = FLAGS_num_workers;
  lo.num_servers = FLAGS_num_servers;
  lo.cluster_spec = FLAGS_cluster_spec;
  lo.rendezvous = FLAGS_rendezvous;
  lo.advertise_host = FLAGS_advertise_host;
  lo.insecure = FLAGS_insecure;
  lo.default_role = Role::kServer;
  lo.startup_timeout = std::chrono::seconds(FLAGS_startup_timeout_s);
  const auto startup_deadline = std::chrono::steady_clock::now() + lo.startup_timeout;

  auto resolved = rdmaps::ResolveCluster(lo, env);
  if (!resolved.ok()) {
    LOG(ERROR) << "layout: " << resolved.status();
    return kExitConfig;
  }
  ClusterLayout layout = std::move(*resolved);
  // A generated secret's file goes when the server does.
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } secret_file;
  if (layout.job_token.empty() && !layout.insecure && layout.role == Role::kServer &&
      !FLAGS_print_layout) {
    // Started by hand: make the job's secret and leave it where this user's
    // workers find it (never on a command line).
    const std::string path = !FLAGS_secret_file.empty()
                                 ? FLAGS_secret_file
                                 : rdmaps::DefaultJobSecretFile(env, static_cast<int>(getpid()));
    if (path.empty()) {
      LOG(ERROR) << "no job secret and nowhere to write one (no HOME): pass --secret_file=PATH, "
                    "set RDMAPS_JOB_SECRET_FILE, or --insecure";
      return kExitConfig;
    }
    layout.job_token = rdmaps::GenerateJobSecret();
    if (rdmaps::Status s = rdmaps::WriteJobSecretFile(path, layout.job_token); !s.ok()) {
      LOG(ERROR) << "cannot write the job secret: " << s;
      return kExitConfig;
    }
    secret_file.path = path;
    layout.secret_source = "generated, written to " + path;
    LOG(INFO) << "job secret generated and written to " << path
              << " (mode 0600); start workers with RDMAPS_JOB_SECRET_FILE=" << path;
  }
  if (!layout.secret_source.empty()) LOG(INFO) << "job secret: " << layout.secret_source;
  if (FLAGS_print_layout) {
    std::cout << layout.ToString() << std::endl;
    return 0;
  }
  if (layout.role == Role::kWorker) ExecWorker(layout);
  if (layout.role == Role::kEvaluator) {
    if (!g_worker_command.empty()) ExecWorker(layout);
    LOG(INFO) << layout.name() << ": an evaluator is not part of the training cluster; "
              << "nothing to serve, exiting";
    return 0;
  }
  if (layout.role == Role::kScheduler) {
    auto done = rdmaps::CompleteCluster(layout, "", lo);
    if (!done.ok()) {
      LOG(ERROR) << "scheduler: " << done.status();
      return kExitStartup;
    }
    LOG(INFO) << "scheduler: rendezvous complete; exiting";
    return 0;
  }

  std::vector<rdmaps::TableOptions> tables;
  if (!FLAGS_tables.empty()) {
    auto t = rdmaps::ReadTablesFile(FLAGS_tables);
    if (!t.ok()) {
      LOG(ERROR) << t.status();
      return kExitConfig;
    }
    tables = std::move(*t);
  } else {
    auto t = AskWorkerForTables();
    if (!t.ok()) {
      LOG(ERROR) << t.status();
      return kExitConfig;
    }
    tables = std::move(*t);
  }

  // What the layout decides (transport, token, index, counts, listen
  // address), then this tool's flags over it.
  rdmaps::ServerOptions so = rdmaps::ServerOptions::FromCluster(layout);
  if (!FLAGS_transport.empty()) {
    so.transport.transport = FLAGS_transport;
  } else if (layout.transport.empty()) {
    so.transport.transport = "auto";
  }
  so.transport.op_timeout = std::chrono::milliseconds(FLAGS_op_timeout_ms);
  so.transport.ib_dev = FLAGS_ib_dev;
  so.transport.ib_port = FLAGS_ib_port;
  so.transport.gid_index = FLAGS_gid_index;
  so.tables = std::move(tables);
  so.push_slots = FLAGS_push_slots;
  so.push_slot_bytes = FLAGS_push_slot_bytes;
  so.apply_threads = FLAGS_apply_threads;
  so.max_workers = FLAGS_max_workers;
  if (!FLAGS_listen.empty()) so.listen_address = FLAGS_listen;
  // Checkpoint settings: the tables file's "checkpoint" object, then the
  // flags given on the command line over it.
  if (!FLAGS_tables.empty()) {
    auto ck = rdmaps::ReadCheckpointSettingsFile(FLAGS_tables);
    if (!ck.ok()) {
      LOG(ERROR) << ck.status();
      return kExitConfig;
    }
    ck->ApplyTo(&so);
  }
  auto given = [](const char* flag) {
    return !gflags::GetCommandLineFlagInfoOrDie(flag).is_default;
  };
  if (given("checkpoint_dir")) so.checkpoint_dir = FLAGS_checkpoint_dir;
  if (given("checkpoint_every")) so.checkpoint_every = FLAGS_checkpoint_every;
  if (given("checkpoint_every_s")) {
    so.checkpoint_interval = std::chrono::seconds(std::max(0, FLAGS_checkpoint_every_s));
  }
  if (given("checkpoint_keep")) so.checkpoint_keep = FLAGS_checkpoint_keep;
  if (given("checkpoint_timeout_s")) {
    so.checkpoint_timeout = std::chrono::seconds(std::max(1, FLAGS_checkpoint_timeout_s));
  }
  so.restore = FLAGS_restore;
  so.rejoin_timeout = std::chrono::seconds(std::max(0, FLAGS_rejoin_timeout_s));
  if (rdmaps::Status rs = ApplyReplicationFlags(layout, &so); !rs.ok()) {
    LOG(ERROR) << rs;
    return kExitConfig;
  }

  std::unique_ptr<rdmaps::Server> server;
  if (layout.needs_rendezvous && layout.index < 0) {
    // ps-lite: the scheduler assigns our index, and Server::Start needs it,
    // so the rendezvous comes first with the address we will listen on. A
    // port-0 listen address is not knowable in advance: ask for a port.
    if (so.listen_address.ends_with(":0")) {
      LOG(ERROR) << "under ps-lite (DMLC_*) the server's port must be known before its index "
                    "is: pass --listen=HOST:PORT";
      return kExitConfig;
    }
    auto done = rdmaps::CompleteCluster(layout, so.listen_address, lo);
    if (!done.ok()) {
      LOG(ERROR) << done.status();
      return kExitStartup;
    }
    layout = std::move(*done);
  }
  so.server_index = static_cast<std::uint32_t>(layout.index);
  // Unavailable (the listen host does not resolve yet - a Kubernetes pod's
  // own headless-service name appears some seconds after the pod starts -
  // or its address is not up yet): try again until the start-up deadline.
  auto started = rdmaps::Server::Start(so);
  auto stop_pending = [] {  // the signal thread starts with the server
    sigset_t pending;
    return sigpending(&pending) == 0 &&
           (sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1);
  };
  for (int attempt = 1;
       !started.ok() && started.status().code() == rdmaps::StatusCode::kUnavailable &&
       !stop_pending();
       ++attempt) {
    if (std::chrono::steady_clock::now() >= startup_deadline) {
      LOG(ERROR) << layout.name() << ": cannot listen on " << so.listen_address << " after "
                 << attempt << " attempts within the start-up deadline (" << FLAGS_startup_timeout_s
                 << " s): " << started.status();
      return kExitStartup;
    }
    if (attempt == 1) {
      LOG(WARNING) << layout.name() << ": cannot listen on " << so.listen_address << " yet ("
                   << started.status() << "); trying again until the start-up deadline";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    started = rdmaps::Server::Start(so);
  }
  if (!started.ok()) {
    LOG(ERROR) << layout.name() << ": cannot start: " << started.status();
    // A checkpoint that cannot be restored is a configuration error too.
    const rdmaps::StatusCode code = started.status().code();
    return code == rdmaps::StatusCode::kInvalidArgument ||
                   (!so.restore.empty() && (code == rdmaps::StatusCode::kFailedPrecondition ||
                                            code == rdmaps::StatusCode::kDataLoss ||
                                            code == rdmaps::StatusCode::kNotFound))
               ? kExitConfig
               : kExitRuntime;
  }
  server = std::move(*started);
  rdmaps::Server* raw = server.get();
  // Until the rendezvous is done nothing was served: a signal ends the
  // process at once (the rendezvous cannot be interrupted, and a launcher
  // stopping a failed job should not have to wait for its deadline).
  static std::atomic<bool> in_rendezvous{false};
  in_rendezvous.store(layout.needs_rendezvous);
  static FinalCheckpoint final_ckpt;  // outlives the signal thread
  const bool with_checkpoints = !so.checkpoint_dir.empty();
  const auto final_timeout = so.checkpoint_timeout;
  signals.Start([raw, with_checkpoints, final_timeout](int sig) {
    if (sig == SIGUSR1) {
      if (in_rendezvous.load()) {
        LOG(WARNING) << "received SIGUSR1 during the start-up rendezvous: no checkpoint yet";
        return;
      }
      LOG(INFO) << "received SIGUSR1: a checkpoint of the whole job";
      raw->RequestCheckpoint();
      return;
    }
    if (in_rendezvous.load()) {
      LOG(WARNING) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                   << " during the start-up rendezvous; exiting";
      google::FlushLogFiles(google::GLOG_INFO);
      std::fflush(nullptr);
      std::_Exit(128 + sig);
    }
    const char* name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    std::lock_guard<std::mutex> lock(final_ckpt.mu);
    if (!with_checkpoints) {
      LOG(INFO) << "received " << name << ": draining and stopping";
      raw->Stop();
      return;
    }
    if (final_ckpt.asked || final_ckpt.closed) {
      LOG(WARNING) << "received " << name
                   << (final_ckpt.asked
                           ? " again: stopping without waiting for the final checkpoint"
                           : " while stopping");
      raw->Stop();
      return;
    }
    final_ckpt.asked = true;
    LOG(INFO) << "received " << name << ": a final checkpoint of the whole job (within "
              << final_timeout.count() / 1000 << " s; " << name
              << " again exits without it), then stopping";
    final_ckpt.thread = std::thread([raw, final_timeout] {
      Result<std::uint64_t> r =
          raw->CheckpointNow(std::chrono::steady_clock::now() + final_timeout);
      {
        std::lock_guard<std::mutex> done_lock(final_ckpt.mu);
        final_ckpt.result = r.status();
        if (r.ok()) final_ckpt.clock = *r;
      }
      raw->Stop();
    });
  });
  // The signal thread uses `server`: end it before `server` is destroyed.
  struct JoinSignals {
    rdmaps::tools::SignalThread& s;
    ~JoinSignals() { s.Join(); }
  } join_signals{signals};
  if (layout.needs_rendezvous) {
    auto done = rdmaps::CompleteCluster(layout, server->address(), lo);
    in_rendezvous.store(false);
    if (!done.ok()) {
      LOG(ERROR) << done.status();
      return kExitStartup;
    }
    layout = std::move(*done);
  }

  struct RemovePidFile {
    std::string path;
    ~RemovePidFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } pid_file;
  if (!FLAGS_pid_file.empty()) {
    std::ofstream out(FLAGS_pid_file, std::ios::trunc);
    out << getpid() << "\n";
    if (!out.flush()) {
      LOG(ERROR) << "cannot write --pid_file " << FLAGS_pid_file;
      return kExitConfig;
    }
    pid_file.path = FLAGS_pid_file;
  }
  const std::string address = server->address();
  LOG(INFO) << "rdmaps-server " << layout.name() << " ready: listening on " << address
            << " (layout from " << layout.source << ", " << layout.num_servers << " ps, "
            << layout.num_workers << " workers, " << so.tables.size() << " tables, transport "
            << so.transport.transport << ")";
  Status notified = SdNotify(env, "READY=1\nSTATUS=serving " + layout.name() + " on " + address);
  if (!notified.ok()) LOG(WARNING) << notified;
  if (FLAGS_ready_fd >= 0) {
    std::string line = address + "\n";
    if (write(FLAGS_ready_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      LOG(WARNING) << "cannot write the ready line to fd " << FLAGS_ready_fd << ": "
                   << std::strerror(errno);
    }
    close(FLAGS_ready_fd);
  }

  // Start-up deadline: every worker must connect in time (not to a backup:
  // workers come to it once it is promoted).
  while (signals.received() == 0 && so.replica_role != rdmaps::ReplicaRole::kBackup) {
    auto st = server->stats();
    if (st.workers_connected >= so.num_workers) break;
    if (std::chrono::steady_clock::now() >= startup_deadline) {
      Status why = server->RunUntil(std::chrono::steady_clock::now());
      LOG(ERROR) << layout.name() << ": start-up deadline (" << FLAGS_startup_timeout_s
                 << " s) passed with " << st.workers_connected << " of " << so.num_workers
                 << " workers connected: " << why;
      // Exit at once: the connected workers see this server vanish only as
      // the process ends, so a launcher learns the cause (this exit) first.
      google::FlushLogFiles(google::GLOG_INFO);
      std::fflush(nullptr);
      std::_Exit(kExitStartup);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (signals.received() == 0 && so.replica_role != rdmaps::ReplicaRole::kBackup) {
    LOG(INFO) << layout.name() << ": all " << so.num_workers << " workers connected";
  }

  Status run = FLAGS_run_timeout_s > 0 ? server->RunUntil(std::chrono::steady_clock::now() +
                                                          std::chrono::seconds(FLAGS_run_timeout_s))
                                       : server->Run();
  // The final checkpoint may still wait for the workers' last clocks after
  // they all left (Run returns then): it ends by itself, by its deadline.
  {
    std::thread pending;
    {
      std::lock_guard<std::mutex> lock(final_ckpt.mu);
      pending = std::move(final_ckpt.thread);
      final_ckpt.closed = true;
    }
    if (pending.joinable()) pending.join();
  }
  const int stop_signal = signals.StopSignal(std::chrono::seconds(5));
  auto st = server->stats();
  server->Stop();
  (void)SdNotify(env, "STOPPING=1");
  LOG(INFO) << layout.name() << ": applied " << st.pushes_applied << " pushes (" << st.rows_applied
            << " rows), " << st.clocks_applied << " clocks; min clock "
            << (st.min_clock == std::numeric_limits<std::uint64_t>::max()
                    ? std::string("(every worker done)")
                    : std::to_string(st.min_clock));
  if (stop_signal != 0) {
    std::lock_guard<std::mutex> lock(final_ckpt.mu);
    if (final_ckpt.asked && final_ckpt.result.ok()) {
      LOG(INFO) << layout.name() << ": final checkpoint at clock " << final_ckpt.clock
                << " durable in " << so.checkpoint_dir << "; exiting";
    } else if (final_ckpt.asked &&
               final_ckpt.result.code() == rdmaps::StatusCode::kFailedPrecondition) {
      LOG(INFO) << layout.name() << ": no final checkpoint: " << final_ckpt.result;
    } else if (final_ckpt.asked) {
      LOG(ERROR) << layout.name()
                 << ": stopped without the final checkpoint: " << final_ckpt.result;
      return kExitRuntime;
    }
    LOG(INFO) << layout.name() << ": stopped by signal; exiting cleanly";
    return 0;
  }
  if (!run.ok()) {
    LOG(ERROR) << run;
    return run.code() == rdmaps::StatusCode::kUnavailable ? kExitWorkersDied : kExitRuntime;
  }
  LOG(INFO) << layout.name() << ": every worker finished; exiting";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after `--` is the worker command (rank-based launches).
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      for (int j = i + 1; j < argc; ++j) g_worker_command.emplace_back(argv[j]);
      argc = i;
      break;
    }
  }
  // With TZ unset glibc re-reads the zone (and frees/strdups its name) on
  // every localtime call glog makes per log line; naming the system zone
  // once makes that a no-op (and keeps TSan from flagging glibc's
  // internally locked tzset). Before any thread starts.
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
  gflags::SetUsageMessage(
      "runs one rdmaps parameter server node\n"
      "  rdmaps-server --tables=FILE [layout flags] [-- worker command for worker ranks]");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  FLAGS_logtostderr = FLAGS_logtostderr || std::getenv("GLOG_log_dir") == nullptr;
  google::InitGoogleLogging(argv[0]);
  rdmaps::tools::SignalThread signals;  // before any thread starts
  google::InstallFailureSignalHandler();
  // glog installs a SIGTERM handler too; SIGTERM is blocked and taken by
  // sigwait, but restore the default so nothing can turn it into a "crash".
  signal(SIGTERM, SIG_DFL);
  // No exception reaches std::terminate (tools/common/exit.h).
  int rc = rdmaps::tools::GuardedMain("rdmaps-server", [&] { return RealMain(signals); });
  google::ShutdownGoogleLogging();
  return rc;
}

// detect-bench: how long a replicated shard takes to notice that its
// primary server process is gone and promote its backup (docs/ps.md,
// "Replication and failover"; docs/coordination.md, "Failure detection").
//
// Each drill starts two real rdmaps-server processes for shard 0 (a
// backup, then a primary naming it) over tcp loopback, with the failover
// records in the coordinator, waits until the primary registered (epoch 1),
// then either
//   kill  SIGKILLs the primary (its sockets close: the backup's log
//         connection reports it), or
//   stop  SIGSTOPs it (every connection stays open: only the lease's
//         heartbeat can tell),
// and times from the signal until the coordinator names the backup as the
// primary (epoch 2), read by this process through the public
// FailoverDecider. p50 and max over --drills drills of each kind, for each
// coordinator of --coordinators:
//   etcd  a real etcd (Debian's etcd-server) started by this tool with
//         etcd's DEFAULT flags (leases of at least 2 s), as users run it;
//   dir   the directory coordinator (exact leases), in the same run.
// Output: a table, or one JSON object (--json).
#include <fcntl.h>
#include <gflags/gflags.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/failover.h"

#ifndef DETECT_BENCH_SERVER_BIN
#define DETECT_BENCH_SERVER_BIN ""
#endif
#ifndef DETECT_BENCH_ETCD_BIN
#define DETECT_BENCH_ETCD_BIN "/usr/bin/etcd"
#endif

DEFINE_int32(drills, 20, "drills of each kind (kill, stop) per coordinator");
DEFINE_string(coordinators, "etcd,dir", "comma-separated: etcd (started here), dir");
DEFINE_string(server, DETECT_BENCH_SERVER_BIN, "the rdmaps-server binary");
DEFINE_string(etcd, DETECT_BENCH_ETCD_BIN, "the etcd binary (run with its default flags)");
DEFINE_int32(lease_ttl_ms, 750, "the servers' --lease_ttl_ms");
DEFINE_bool(json, false, "print one JSON object instead of a table");

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "detect-bench: %s\n", what.c_str());
  std::exit(1);
}

// A child process with stdout and stderr in `log`; `ready_fd` (>= 0) is
// left open in the child as fd 3.
pid_t Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const std::string& log, int ready_fd = -1) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (ready_fd >= 0) posix_spawn_file_actions_adddup2(&fa, ready_fd, 3);
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("RDMAPS_", 0) != 0) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) Die("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// SIGKILL (after SIGCONT, for a stopped one) and reap.
void Reap(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  kill(pid, SIGCONT);
  waitpid(pid, nullptr, 0);
}

std::string Tail(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  std::string t = s.str();
  return t.size() > 3000 ? t.substr(t.size() - 3000) : t;
}

// A port nothing listens on now (etcd cannot bind port 0 itself).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// A server of shard 0; its address once it wrote it to its ready fd.
struct Server {
  pid_t pid = -1;
  std::string address;
};

Server StartServer(const std::string& dir, const std::string& coordinator,
                   const std::string& prefix, const std::vector<std::string>& extra,
                   const std::string& log) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) Die("pipe");
  std::vector<std::string> argv = {FLAGS_server, "--tables=" + dir + "/tables.json", "--replicas=2",
                                   "--ready_fd=3",
                                   "--lease_ttl_ms=" + std::to_string(FLAGS_lease_ttl_ms)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Server s;
  s.pid = Spawn(argv,
                {{"RDMAPS_ROLE", "ps"},
                 {"RDMAPS_TASK_INDEX", "0"},
                 {"RDMAPS_PS_HOSTS", "127.0.0.1:0"},
                 {"RDMAPS_NUM_WORKERS", "1"},
                 {"RDMAPS_TRANSPORT", "tcp"},
                 {"RDMAPS_INSECURE", "1"},
                 {"RDMAPS_COORDINATOR", coordinator},
                 {"RDMAPS_COORDINATOR_PREFIX", prefix}},
                log, fds[1]);
  close(fds[1]);
  // The server writes "host:port\n" once it listens; EOF if it died.
  std::string line;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') line += c;
  close(fds[0]);
  if (line.empty()) {
    Reap(s.pid);
    Die("rdmaps-server did not become ready:\n" + Tail(log));
  }
  s.address = line;
  return s;
}

struct Coord {
  std::string name;
  rdmaps::CoordinatorConfig config;
  pid_t etcd = -1;
};

// Starts etcd (default flags) on free loopback ports in `dir`; retried when
// another process took a port first.
Coord StartEtcd(const std::string& dir) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int client = FreePort();
    int peer = FreePort();
    while (peer == client) peer = FreePort();
    const std::string c = "http://127.0.0.1:" + std::to_string(client);
    const std::string p = "http://127.0.0.1:" + std::to_string(peer);
    const std::string log = dir + "/etcd.log";
    std::filesystem::remove_all(dir + "/etcd-data");
    Coord out;
    out.name = "etcd";
    out.config.address = "etcd://127.0.0.1:" + std::to_string(client);
    out.etcd = Spawn({FLAGS_etcd, "--name", "b", "--data-dir", dir + "/etcd-data",
                      "--listen-client-urls", c, "--advertise-client-urls", c, "--listen-peer-urls",
                      p, "--initial-advertise-peer-urls", p, "--initial-cluster", "b=" + p},
                     {}, log);
    const auto until = Clock::now() + std::chrono::seconds(30);
    bool exited = false;
    while (Clock::now() < until) {
      if (waitpid(out.etcd, nullptr, WNOHANG) == out.etcd) {
        exited = true;
        break;
      }
      rdmaps::CoordinatorConfig probe = out.config;
      probe.job_prefix = "detect-bench-probe/";
      auto d = rdmaps::OpenFailoverDecider(probe);
      if (d.ok()) {
        auto cur = (*d)->Current(0);
        if (cur.status().code() == rdmaps::StatusCode::kNotFound) return out;  // answering
      }
      std::this_thread::sleep_for(milliseconds(50));  // start-up poll, bounded
    }
    if (!exited) {
      Reap(out.etcd);
      Die("etcd did not answer within 30 s:\n" + Tail(log));
    }
    if (Tail(log).find("address already in use") == std::string::npos) {
      Die("etcd exited at start-up:\n" + Tail(log));
    }
  }
  Die("no free ports for etcd after 5 attempts");
}

// One drill: milliseconds from the signal to epoch 2 naming the backup.
double Drill(const Coord& coord, const std::string& dir, int signal, int index) {
  const std::string prefix = "detect-bench/" + coord.name + "-" + std::to_string(signal) + "-" +
                             std::to_string(index) + "/";
  const std::string log = dir + "/servers.log";
  rdmaps::CoordinatorConfig cc = coord.config;
  cc.job_prefix = prefix;
  // The directory coordinator has no key prefix: one directory per drill.
  if (coord.name == "dir") cc.address += "-" + std::to_string(signal) + "-" + std::to_string(index);
  Server backup = StartServer(dir, cc.address, prefix, {"--replica_role=backup"}, log);
  Server primary =
      StartServer(dir, cc.address, prefix, {"--backup_address=" + backup.address}, log);
  auto decider = rdmaps::OpenFailoverDecider(cc);
  if (!decider.ok()) Die("OpenFailoverDecider: " + decider.status().ToString());
  auto before = (*decider)->Current(0);
  if (!before.ok() || before->epoch != 1 || before->primary != primary.address) {
    Die("shard 0 is not at epoch 1 with its primary: " +
        (before.ok() ? before->primary : before.status().ToString()));
  }
  // The backup watches the primary's lease once it is connected; a moment
  // of steady state first, as in a running job (several heartbeats).
  std::this_thread::sleep_for(milliseconds(3 * FLAGS_lease_ttl_ms / 2));
  const auto t0 = Clock::now();
  if (kill(primary.pid, signal) != 0) Die("kill");
  auto after = (*decider)->WaitForEpochAfter(0, 1, t0 + std::chrono::seconds(30));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (!after.ok() || after->primary != backup.address) {
    Die("no promotion of the backup: " +
        (after.ok() ? "primary " + after->primary : after.status().ToString()) + "\n" + Tail(log));
  }
  Reap(primary.pid);
  Reap(backup.pid);
  return ms;
}

struct Stats {
  double p50 = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.back()};
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("detect-bench: primary kill/stop -> backup promoted, p50 and max");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_drills < 1 || FLAGS_drills > 10000) Die("--drills must be 1..10000");
  if (FLAGS_server.empty()) Die("--server: the rdmaps-server binary");
  char tmpl[] = "/tmp/rdmaps-detect-bench-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  const std::string dir = tmpl;
  std::ofstream(dir + "/tables.json") << R"([{"name": "t", "rows": 16, "dim": 4,
      "optimizer": {"kind": "sgd", "learning_rate": 1}}])";

  std::vector<std::string> names;
  std::stringstream list(FLAGS_coordinators);
  for (std::string n; std::getline(list, n, ',');) names.push_back(n);
  struct Row {
    std::string coord, kind;
    Stats s;
  };
  std::vector<Row> rows;
  for (const std::string& name : names) {
    Coord coord;
    if (name == "etcd") {
      coord = StartEtcd(dir);
    } else if (name == "dir") {
      coord.name = "dir";
      coord.config.address = "dir:" + dir + "/coord";
    } else {
      Die("--coordinators: etcd or dir, not '" + name + "'");
    }
    for (auto [signal, kind] : {std::pair{SIGKILL, "kill -9"}, std::pair{SIGSTOP, "SIGSTOP"}}) {
      std::vector<double> ms;
      for (int i = 0; i < FLAGS_drills; ++i) ms.push_back(Drill(coord, dir, signal, i));
      rows.push_back({name, kind, Summarize(ms)});
      if (!FLAGS_json) {
        std::fprintf(stderr, "  %s %s: %d drills done\n", name.c_str(), kind, FLAGS_drills);
      }
    }
    Reap(coord.etcd);
  }
  std::filesystem::remove_all(dir);

  if (FLAGS_json) {
    std::printf("{\"lease_ttl_ms\": %d, \"drills\": %d, \"results\": [", FLAGS_lease_ttl_ms,
                FLAGS_drills);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::printf(
          "%s{\"coordinator\": \"%s\", \"kind\": \"%s\", \"p50_ms\": %.1f, \"max_ms\": %.1f}",
          i ? ", " : "", rows[i].coord.c_str(), rows[i].kind.c_str(), rows[i].s.p50, rows[i].s.max);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf(
      "primary process -> backup promoted in the coordinator, lease_ttl %d ms, %d drills "
      "each (etcd with its default flags)\n",
      FLAGS_lease_ttl_ms, FLAGS_drills);
  std::printf("%-6s %-8s %10s %10s\n", "coord", "signal", "p50 ms", "max ms");
  for (const Row& r : rows) {
    std::printf("%-6s %-8s %10.1f %10.1f\n", r.coord.c_str(), r.kind.c_str(), r.s.p50, r.s.max);
  }
  return 0;
}

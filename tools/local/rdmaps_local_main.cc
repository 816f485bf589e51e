// rdmaps-local: a whole rdmaps job on this machine.
//
//   rdmaps-local --servers 2 --workers 3 -- ./my_worker --epochs=2
//
// 1. Tables: --tables=FILE, or else the worker command is run once with
//    RDMAPS_DESCRIBE_TABLES=PATH and must write its tables there
//    (rdmaps::DescribeTablesIfAsked) and exit 0.
// 2. Servers: N rdmaps-server child processes listening on port 0 of --host;
//    each reports its real address on a pipe (--ready_fd) when ready.
// 3. Workers: M child processes of the worker command, each with its layout
//    in the environment: RDMAPS_ROLE=worker, RDMAPS_TASK_INDEX,
//    RDMAPS_PS_HOSTS, RDMAPS_NUM_WORKERS, RDMAPS_TRANSPORT, RDMAPS_JOB_TOKEN
//    (or, with --layout_env=tf_config, a TF_CONFIG per process).
// 4. Every child's output is streamed with a prefix ("[ps0] ...",
//    "[worker2] ..."). The job ends when every worker has exited: rdmaps-local
//    returns the first non-zero exit code (a signal N counts as 128+N), or 0.
//    A failing worker, a server exiting early, Ctrl-C / SIGTERM (forwarded
//    to every child) or --timeout_s stop everything: SIGTERM, then SIGKILL
//    after --grace_s.
//
// Children get their own process group (so a terminal's Ctrl-C reaches only
// rdmaps-local, which forwards it) and die with rdmaps-local
// (PR_SET_PDEATHSIG), so nothing is left behind.
#include <errno.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/tables_json.h"

DEFINE_int32(servers, 1, "parameter servers to start");
DEFINE_int32(workers, 1, "workers to start (each runs the command after --)");
DEFINE_string(transport, "auto", "tcp, verbs or auto (verbs when a usable device exists)");
DEFINE_string(host, "127.0.0.1",
              "address servers listen on (for verbs/Soft-RoCE: the RDMA netdev's IP)");
DEFINE_string(tables, "", "the job's tables as JSON; default: ask the worker command");
DEFINE_string(layout_env, "rdmaps",
              "how workers get their layout: rdmaps (RDMAPS_* variables) or tf_config");
DEFINE_string(server_binary, "", "rdmaps-server to run (default: next to rdmaps-local)");
DEFINE_string(server_args, "", "extra flags for every rdmaps-server, space-separated");
DEFINE_string(job_token, "", "job token (default: random per run)");
DEFINE_int32(startup_timeout_s, 60, "deadline for servers to be ready and workers to connect");
DEFINE_int32(timeout_s, 0, "deadline for the whole job (exit 124); 0: none");
DEFINE_int32(grace_s, 10, "after SIGTERM, children get this long before SIGKILL");
DEFINE_int32(omit_worker, -1, "fault drill: do not start this worker (its slot stays empty)");
DEFINE_bool(print_layout, false, "print the layout the workers would get and exit");

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExitConfig = 2;
constexpr int kExitTimeout = 124;

void Say(const std::string& line) {
  std::string s = "[rdmaps-local] " + line + "\n";
  fwrite(s.data(), 1, s.size(), stdout);
  fflush(stdout);
}

struct Child {
  std::string name;
  bool server = false;
  pid_t pid = -1;
  int out_fd = -1;    // merged stdout+stderr
  int ready_fd = -1;  // servers: the address line
  std::string out_buf, ready_buf;
  std::optional<int> exit_code;  // 128+N for signal N
  std::string how;               // "exit 3", "killed by SIGKILL"
};

std::vector<Child> g_children;
std::vector<std::string> g_command;

void FlushLines(Child& c, bool all) {
  std::size_t start = 0;
  while (true) {
    auto nl = c.out_buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = "[" + c.name + "] " + c.out_buf.substr(start, nl - start) + "\n";
    fwrite(line.data(), 1, line.size(), stdout);
    start = nl + 1;
  }
  c.out_buf.erase(0, start);
  if (all && !c.out_buf.empty()) {
    std::string line = "[" + c.name + "] " + c.out_buf + "\n";
    fwrite(line.data(), 1, line.size(), stdout);
    c.out_buf.clear();
  }
  fflush(stdout);
}

// Reads what is available on a child's pipes; closes them at EOF.
void Drain(Child& c, int fd) {
  char buf[8192];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
      (fd == c.out_fd ? c.out_buf : c.ready_buf).append(buf, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      close(fd);
      if (fd == c.out_fd) {
        c.out_fd = -1;
      } else {
        c.ready_fd = -1;
      }
    }
    break;
  }
  if (fd == c.out_fd || c.out_fd == -1) FlushLines(c, c.out_fd == -1);
}

std::map<std::string, std::string> BaseEnv() {
  auto env = rdmaps::CurrentEnvironment();
  // A layout inherited from an enclosing launcher must not leak in.
  for (const char* k : {"RDMAPS_ROLE", "RDMAPS_TASK_INDEX", "RDMAPS_PS_HOSTS",
                        "RDMAPS_WORKER_HOSTS", "RDMAPS_NUM_WORKERS", "TF_CONFIG", "DMLC_ROLE",
                        rdmaps::kDescribeTablesEnv}) {
    env.erase(k);
  }
  if (!env.count("GLOG_logtostderr") && !env.count("GLOG_log_dir")) env["GLOG_logtostderr"] = "1";
  return env;
}

// fork+exec with output on a pipe; `ready` makes fd 3 a pipe to us.
rdmaps::Status Spawn(Child& c, const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env, bool ready) {
  int out[2], rdy[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0) return rdmaps::ErrnoError("pipe", errno);
  if (ready && pipe2(rdy, O_CLOEXEC) != 0) return rdmaps::ErrnoError("pipe", errno);
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return rdmaps::ErrnoError("fork", errno);
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], 1);
    dup2(out[1], 2);
    if (ready) dup2(rdy[1], 3);  // dup2 clears O_CLOEXEC on the new fd
    execvpe(args[0], args.data(), envp.data());
    std::string msg = std::string("cannot exec ") + args[0] + ": " + std::strerror(errno) + "\n";
    (void)!write(2, msg.data(), msg.size());
    _exit(127);
  }
  close(out[1]);
  c.pid = pid;
  c.out_fd = out[0];
  fcntl(c.out_fd, F_SETFL, O_NONBLOCK);
  if (ready) {
    close(rdy[1]);
    c.ready_fd = rdy[0];
    fcntl(c.ready_fd, F_SETFL, O_NONBLOCK);
  }
  return rdmaps::Status::OK();
}

std::string ServerBinary() {
  if (!FLAGS_server_binary.empty()) return FLAGS_server_binary;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto candidate : {self.parent_path() / "rdmaps-server",
                           self.parent_path().parent_path() / "server" / "rdmaps-server"}) {
      if (std::filesystem::exists(candidate, ec)) return candidate.string();
    }
  }
  return "rdmaps-server";  // from PATH
}

std::string RandomToken() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by SIG") + (name ? name : std::to_string(WTERMSIG(status)));
  }
  return "status " + std::to_string(status);
}

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

class Job {
 public:
  explicit Job(int sfd) : sfd_(sfd) {}

  // One round of the event loop: children's output, exits, signals. Returns
  // the signal received, if any.
  int Pump(Clock::time_point until) {
    std::vector<pollfd> pfds{{sfd_, POLLIN, 0}};
    std::vector<std::pair<std::size_t, int>> owners;
    for (std::size_t i = 0; i < g_children.size(); ++i) {
      for (int fd : {g_children[i].out_fd, g_children[i].ready_fd}) {
        if (fd >= 0) {
          pfds.push_back({fd, POLLIN, 0});
          owners.push_back({i, fd});
        }
      }
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    int r = poll(pfds.data(), pfds.size(), static_cast<int>(std::clamp<long long>(ms, 0, 500)));
    int sig = 0;
    if (r > 0) {
      for (std::size_t k = 1; k < pfds.size(); ++k) {
        if (pfds[k].revents) Drain(g_children[owners[k - 1].first], owners[k - 1].second);
      }
      if (pfds[0].revents & POLLIN) {
        signalfd_siginfo si;
        while (read(sfd_, &si, sizeof(si)) == sizeof(si)) {
          if (si.ssi_signo != SIGCHLD) sig = static_cast<int>(si.ssi_signo);
        }
      }
    }
    Reap();
    return sig;
  }

  void Reap() {
    // Children that failed together (reaped in one batch, in no particular
    // order): a server's failure is the cause of its workers', so it wins.
    Child* first = nullptr;
    while (true) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (auto& c : g_children) {
        if (c.pid != pid) continue;
        // Collect its last words before reporting the exit.
        if (c.out_fd >= 0) Drain(c, c.out_fd);
        c.exit_code = ExitCodeOf(status);
        c.how = Describe(status);
        Say(c.name + " (pid " + std::to_string(pid) + ") " + c.how);
        if (c.exit_code != 0 && (!first || (c.server && !first->server))) first = &c;
      }
    }
    if (!first || stopping_) return;
    // A server's failure that follows a worker's within kSettle is taken as
    // its cause: the server's connections close before its exit is
    // reported, so its workers may fail and be reaped first.
    bool replace = first_failure_ && first->server && !failure_is_server_ &&
                   Clock::now() < failure_at_ + kSettle;
    if (!first_failure_ || replace) {
      first_failure_ = *first->exit_code;
      failure_what_ = first->name + " " + first->how;
      failure_is_server_ = first->server;
      if (!replace) failure_at_ = Clock::now();
    }
  }

  // How long to wait after the first failure for the one that caused it.
  static constexpr std::chrono::milliseconds kSettle{300};
  Clock::time_point failure_at_;
  bool failure_is_server_ = false;

  // SIGTERM (or `sig`) to every live child, SIGKILL after the grace period.
  void StopAll(int sig = SIGTERM) {
    stopping_ = true;
    for (auto& c : g_children) {
      if (!c.exit_code) kill(c.pid, sig);
    }
    auto kill_at = Clock::now() + std::chrono::seconds(FLAGS_grace_s);
    while (Live() > 0 && Clock::now() < kill_at) Pump(kill_at);
    for (auto& c : g_children) {
      if (!c.exit_code) {
        Say(c.name + " did not exit within " + std::to_string(FLAGS_grace_s) +
            " s of SIGTERM; SIGKILL");
        kill(c.pid, SIGKILL);
      }
    }
    auto give_up = Clock::now() + std::chrono::seconds(5);
    while (Live() > 0 && Clock::now() < give_up) Pump(give_up);
    for (auto& c : g_children) {
      for (int fd : {c.out_fd, c.ready_fd}) {
        if (fd >= 0) Drain(c, fd);
      }
      FlushLines(c, true);
    }
  }

  int Live() const {
    int n = 0;
    for (const auto& c : g_children) n += c.exit_code ? 0 : 1;
    return n;
  }

  std::optional<int> first_failure_;
  std::string failure_what_;
  bool stopping_ = false;

 private:
  int sfd_;
};

std::string JoinHosts(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

std::string TfConfig(const std::vector<std::string>& ps, int workers, const char* type,
                     int index) {
  nlohmann::json cluster;
  cluster["ps"] = ps;
  std::vector<std::string> w(static_cast<std::size_t>(workers), FLAGS_host + ":0");
  cluster["worker"] = w;
  return nlohmann::json({{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}})
      .dump();
}

// The layout environment of one process.
void AddLayoutEnv(std::map<std::string, std::string>& env, bool server, int index,
                  const std::vector<std::string>& ps, const std::string& token) {
  env["RDMAPS_TRANSPORT"] = FLAGS_transport;
  env["RDMAPS_JOB_TOKEN"] = token;
  if (FLAGS_layout_env == "tf_config") {
    env["TF_CONFIG"] = TfConfig(ps, FLAGS_workers, server ? "ps" : "worker", index);
    return;
  }
  env["RDMAPS_ROLE"] = server ? "ps" : "worker";
  env["RDMAPS_TASK_INDEX"] = std::to_string(index);
  env["RDMAPS_PS_HOSTS"] = JoinHosts(ps);
  env["RDMAPS_NUM_WORKERS"] = std::to_string(FLAGS_workers);
}

int Run() {
  if (g_command.empty()) {
    std::cerr << "rdmaps-local: give the worker command after --, e.g.\n"
                 "  rdmaps-local --servers 2 --workers 3 -- ./my_worker --epochs=2\n";
    return kExitConfig;
  }
  if (FLAGS_servers < 1 || FLAGS_workers < 1) {
    std::cerr << "rdmaps-local: --servers and --workers must be at least 1\n";
    return kExitConfig;
  }
  if (FLAGS_layout_env != "rdmaps" && FLAGS_layout_env != "tf_config") {
    std::cerr << "rdmaps-local: --layout_env must be rdmaps or tf_config, not '"
              << FLAGS_layout_env << "'\n";
    return kExitConfig;
  }
  const std::string token = FLAGS_job_token.empty() ? RandomToken() : FLAGS_job_token;
  const auto start = Clock::now();
  const auto startup_deadline = start + std::chrono::seconds(FLAGS_startup_timeout_s);
  const auto job_deadline = FLAGS_timeout_s > 0 ? start + std::chrono::seconds(FLAGS_timeout_s)
                                                : Clock::time_point::max();

  if (FLAGS_print_layout) {
    std::vector<std::string> ps;
    for (int i = 0; i < FLAGS_servers; ++i) ps.push_back(FLAGS_host + ":<port " + std::to_string(i) + ">");
    std::cout << "rdmaps-local layout: " << FLAGS_servers << " servers on " << FLAGS_host
              << " (ports chosen at start-up), " << FLAGS_workers << " workers, transport "
              << FLAGS_transport << ", layout via "
              << (FLAGS_layout_env == "tf_config" ? "TF_CONFIG" : "RDMAPS_* variables") << "\n";
    for (int w = 0; w < FLAGS_workers; ++w) {
      std::cout << "  worker" << w << ": RDMAPS_ROLE=worker RDMAPS_TASK_INDEX=" << w
                << " RDMAPS_PS_HOSTS=" << JoinHosts(ps) << " RDMAPS_NUM_WORKERS=" << FLAGS_workers
                << "\n";
    }
    return 0;
  }

  // A shell starts background jobs (`rdmaps-local ... &`) with SIGINT
  // ignored, and an ignored signal is discarded, blocked or not: take SIGINT
  // and SIGTERM back so that they always reach the signalfd and are
  // forwarded. (SIGHUP stays ignored under nohup.)
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) {
    PLOG(ERROR) << "signalfd";
    return 1;
  }
  Job job(sfd);
  auto stop_for_signal = [&](int sig) {
    Say(std::string("received SIG") + sigabbrev_np(sig) + "; stopping every process");
    job.StopAll(sig == SIGHUP ? SIGTERM : sig);
    return 128 + sig;
  };

  // 1. Tables.
  std::string tables_path = FLAGS_tables;
  char tmpdir_tmpl[] = "/tmp/rdmaps-local-XXXXXX";
  if (!mkdtemp(tmpdir_tmpl)) {
    PLOG(ERROR) << "mkdtemp";
    return 1;
  }
  const std::string tmpdir = tmpdir_tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpdir};
  if (!tables_path.empty()) {
    auto t = rdmaps::ReadTablesFile(tables_path);
    if (!t.ok()) {
      Say(t.status().ToString());
      return kExitConfig;
    }
    tables_path = std::filesystem::absolute(tables_path).string();
  } else {
    tables_path = tmpdir + "/tables.json";
    auto env = BaseEnv();
    env[rdmaps::kDescribeTablesEnv] = tables_path;
    g_children.push_back({});
    g_children.back().name = "describe";
    auto s = Spawn(g_children.back(), g_command, env, false);
    if (!s.ok()) {
      Say(s.ToString());
      return 1;
    }
    while (!g_children.back().exit_code) {
      if (int sig = job.Pump(startup_deadline)) return stop_for_signal(sig);
      if (Clock::now() >= startup_deadline) {
        Say("the worker command did not describe its tables within the start-up deadline");
        job.StopAll();
        return kExitTimeout;
      }
    }
    auto t = rdmaps::ReadTablesFile(tables_path);
    if (*g_children.back().exit_code != 0 || !t.ok()) {
      Say("the worker command did not describe its tables (" + g_children.back().how + ", " +
          t.status().ToString() + "): it must call rdmaps::DescribeTablesIfAsked() when " +
          rdmaps::kDescribeTablesEnv + " is set, or pass --tables=FILE");
      return kExitConfig;
    }
    Say("tables from the worker command: " + std::to_string(t->size()) + " table(s)");
    g_children.clear();
    job.first_failure_.reset();
  }

  // 2. Servers, each reporting its address on fd 3.
  std::vector<std::string> placeholder(static_cast<std::size_t>(FLAGS_servers),
                                       FLAGS_host + ":0");
  const std::string server_bin = ServerBinary();
  for (int i = 0; i < FLAGS_servers; ++i) {
    auto env = BaseEnv();
    AddLayoutEnv(env, true, i, placeholder, token);
    std::vector<std::string> argv = {server_bin, "--tables=" + tables_path, "--ready_fd=3",
                                     "--startup_timeout_s=" + std::to_string(FLAGS_startup_timeout_s)};
    std::string extra = FLAGS_server_args;
    for (std::size_t p = 0; p < extra.size();) {
      auto q = extra.find(' ', p);
      if (q == std::string::npos) q = extra.size();
      if (q > p) argv.push_back(extra.substr(p, q - p));
      p = q + 1;
    }
    g_children.push_back({});
    Child& c = g_children.back();
    c.name = "ps" + std::to_string(i);
    c.server = true;
    auto s = Spawn(c, argv, env, true);
    if (!s.ok()) {
      Say(s.ToString());
      job.StopAll();
      return 1;
    }
    Say(c.name + " pid=" + std::to_string(c.pid) + " started");
  }
  std::vector<std::string> ps(static_cast<std::size_t>(FLAGS_servers));
  while (true) {
    bool all = true;
    for (int i = 0; i < FLAGS_servers; ++i) {
      Child& c = g_children[static_cast<std::size_t>(i)];
      auto nl = c.ready_buf.find('\n');
      if (nl != std::string::npos) {
        ps[static_cast<std::size_t>(i)] = c.ready_buf.substr(0, nl);
      } else {
        all = false;
      }
    }
    if (all) break;
    if (int sig = job.Pump(std::min(startup_deadline, job_deadline))) return stop_for_signal(sig);
    for (const auto& c : g_children) {
      if (c.exit_code) {
        Say(c.name + " exited (" + c.how + ") before it was ready; stopping");
        job.StopAll();
        return *c.exit_code != 0 ? *c.exit_code : 1;
      }
    }
    if (Clock::now() >= startup_deadline) {
      std::string missing;
      for (int i = 0; i < FLAGS_servers; ++i) {
        if (ps[static_cast<std::size_t>(i)].empty()) missing += " ps" + std::to_string(i);
      }
      Say("start-up deadline (" + std::to_string(FLAGS_startup_timeout_s) +
          " s) passed; servers never ready:" + missing);
      job.StopAll();
      return kExitTimeout;
    }
  }
  Say("servers ready: " + JoinHosts(ps));

  // 3. Workers.
  for (int w = 0; w < FLAGS_workers; ++w) {
    if (w == FLAGS_omit_worker) {
      Say("worker" + std::to_string(w) + " not started (--omit_worker)");
      continue;
    }
    auto env = BaseEnv();
    AddLayoutEnv(env, false, w, ps, token);
    g_children.push_back({});
    Child& c = g_children.back();
    c.name = "worker" + std::to_string(w);
    auto s = Spawn(c, g_command, env, false);
    if (!s.ok()) {
      Say(s.ToString());
      job.StopAll();
      return 1;
    }
    Say(c.name + " pid=" + std::to_string(c.pid) + " started");
  }

  // 4. Until every worker has exited, or something fails.
  auto workers_live = [&] {
    int n = 0;
    for (const auto& c : g_children) n += (!c.server && !c.exit_code) ? 1 : 0;
    return n;
  };
  while (workers_live() > 0) {
    if (int sig = job.Pump(job_deadline)) return stop_for_signal(sig);
    if (job.first_failure_) {
      // Collect a server failure that caused this one (see Job::kSettle).
      const auto settle = job.failure_at_ + Job::kSettle;
      while (!job.failure_is_server_ && Clock::now() < settle) {
        if (int sig = job.Pump(settle)) return stop_for_signal(sig);
      }
      Say(job.failure_what_ + "; stopping the job");
      job.StopAll();
      return *job.first_failure_;
    }
    for (const auto& c : g_children) {
      // A server exits 0 only after every worker said goodbye (or on a
      // signal), possibly a moment before the last worker process ends.
      if (c.server && c.exit_code && *c.exit_code != 0 && workers_live() > 0) {
        Say(c.name + " exited (" + c.how + ") while workers were running; stopping the job");
        job.StopAll();
        return *c.exit_code != 0 ? *c.exit_code : 1;
      }
    }
    if (Clock::now() >= job_deadline) {
      Say("job deadline (--timeout_s=" + std::to_string(FLAGS_timeout_s) +
          ") passed; stopping the job");
      job.StopAll();
      return kExitTimeout;
    }
  }
  // 5. Servers exit by themselves once every worker has closed.
  auto servers_by = std::min(job_deadline, Clock::now() + std::chrono::seconds(FLAGS_grace_s));
  while (job.Live() > 0 && Clock::now() < servers_by) {
    if (int sig = job.Pump(servers_by)) return stop_for_signal(sig);
  }
  if (job.Live() > 0) {
    Say("servers still running " + std::to_string(FLAGS_grace_s) +
        " s after the last worker; stopping them");
    job.StopAll();
  }
  if (job.first_failure_) {
    Say("job failed: " + job.failure_what_);
    return *job.first_failure_;
  }
  std::chrono::duration<double> took = Clock::now() - start;
  Say("job done in " + std::to_string(took.count()) + " s");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      for (int j = i + 1; j < argc; ++j) g_command.emplace_back(argv[j]);
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
      "starts a whole rdmaps job on this machine\n"
      "  rdmaps-local --servers N --workers M -- <worker command...>");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  int rc = Run();
  return rc;
}

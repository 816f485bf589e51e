#include "tools/local/launch.h"

#include <glog/logging.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/failover.h"
#include "rdmaps/tables_json.h"
#include "tools/local/job.h"

namespace rdmaps::local {
namespace {

using ChildId = Job::ChildId;
// The exit code of the whole run, once a phase has ended it.
using Outcome = std::optional<int>;

std::map<std::string, std::string> BaseEnv() {
  auto env = CurrentEnvironment();
  // A layout inherited from an enclosing launcher must not leak in.
  for (const char* k :
       {"RDMAPS_ROLE", "RDMAPS_TASK_INDEX", "RDMAPS_PS_HOSTS", "RDMAPS_WORKER_HOSTS",
        "RDMAPS_NUM_WORKERS", "TF_CONFIG", "DMLC_ROLE", kDescribeTablesEnv,
        // So is a secret: this job's is set by AddLayoutEnv.
        "RDMAPS_JOB_SECRET_FILE", "RDMAPS_JOB_SECRET", "RDMAPS_JOB_TOKEN", "RDMAPS_INSECURE"}) {
    env.erase(k);
  }
  if (!env.count("GLOG_logtostderr") && !env.count("GLOG_log_dir")) env["GLOG_logtostderr"] = "1";
  return env;
}

std::string ServerBinary(const LaunchOptions& o) {
  if (!o.server_binary.empty()) return o.server_binary;
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

std::string JoinHosts(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// Worker slots: max_workers in elastic mode, else workers.
int WorkerSlots(const LaunchOptions& o) { return o.max_workers > 0 ? o.max_workers : o.workers; }

std::string TfConfig(const LaunchOptions& o, const std::vector<std::string>& ps, const char* type,
                     int index) {
  nlohmann::json cluster;
  cluster["ps"] = ps;
  std::vector<std::string> w(static_cast<std::size_t>(WorkerSlots(o)), o.host + ":0");
  cluster["worker"] = w;
  return nlohmann::json({{"cluster", cluster}, {"task", {{"type", type}, {"index", index}}}})
      .dump();
}

// The layout environment of one process.
void AddLayoutEnv(const LaunchOptions& o, std::map<std::string, std::string>& env, bool server,
                  int index, const std::vector<std::string>& ps, const std::string& token) {
  env["RDMAPS_TRANSPORT"] = o.transport;
  // The secret travels by environment, never argv (`ps` shows argv).
  if (token.empty()) {
    env["RDMAPS_INSECURE"] = "1";
  } else {
    env["RDMAPS_JOB_SECRET"] = token;
  }
  if (o.layout_env == "tf_config") {
    env["TF_CONFIG"] = TfConfig(o, ps, server ? "ps" : "worker", index);
    return;
  }
  if (o.replicas == 2) env["RDMAPS_REPLICAS"] = "2";
  env["RDMAPS_ROLE"] = server ? "ps" : "worker";
  env["RDMAPS_TASK_INDEX"] = std::to_string(index);
  env["RDMAPS_PS_HOSTS"] = JoinHosts(ps);
  // Servers: the workers that start as members; workers: the slot count.
  env["RDMAPS_NUM_WORKERS"] = std::to_string(server ? o.workers : WorkerSlots(o));
}

// Splits --server_args at spaces.
std::vector<std::string> SplitArgs(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t p = 0; p < text.size();) {
    auto q = text.find(' ', p);
    if (q == std::string::npos) q = text.size();
    if (q > p) out.push_back(text.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

// The options make a job, or the reason why not on stderr.
Outcome CheckOptions(const LaunchOptions& o) {
  if (o.command.empty()) {
    std::cerr << "rdmaps-local: give the worker command after --, e.g.\n"
                 "  rdmaps-local --servers 2 --workers 3 -- ./my_worker --epochs=2\n";
    return kExitConfig;
  }
  if (o.servers < 1 || o.workers < 1) {
    std::cerr << "rdmaps-local: --servers and --workers must be at least 1 (got --servers="
              << o.servers << " --workers=" << o.workers << ")\n";
    return kExitConfig;
  }
  // Each is a process on this machine.
  constexpr int kMaxProcesses = 1024;
  if (o.servers > kMaxProcesses || o.workers > kMaxProcesses) {
    std::cerr << "rdmaps-local: --servers=" << o.servers << " --workers=" << o.workers
              << " exceeds the limit of " << kMaxProcesses << " processes each\n";
    return kExitConfig;
  }
  if (o.startup_timeout.count() < 0 || o.timeout.count() < 0 || o.grace.count() < 0) {
    std::cerr << "rdmaps-local: --startup_timeout_s, --timeout_s and --grace_s must not be "
                 "negative (got "
              << o.startup_timeout.count() << ", " << o.timeout.count() << ", " << o.grace.count()
              << ")\n";
    return kExitConfig;
  }
  if (o.restart_servers > 0 && o.server_args.find("--checkpoint_dir=") == std::string::npos) {
    std::cerr << "rdmaps-local: --restart_servers restarts the servers from their latest "
                 "checkpoint: give one with --server_args=\"--checkpoint_dir=DIR "
                 "--checkpoint_every=N\"\n";
    return kExitConfig;
  }
  if (o.max_workers < 0 || o.join_workers < 0 || o.join_after.count() < 0 ||
      (o.max_workers > 0 && o.max_workers < o.workers + o.join_workers) ||
      (o.join_workers > 0 && o.max_workers == 0)) {
    std::cerr << "rdmaps-local: --max_workers=" << o.max_workers << " must be 0 or at least "
              << "--workers + --join_workers (" << o.workers + o.join_workers
              << "), and --join_workers needs --max_workers (elastic mode)\n";
    return kExitConfig;
  }
  if (o.replicas != 1 && o.replicas != 2) {
    std::cerr << "rdmaps-local: --replicas must be 1 or 2 (got " << o.replicas << ")\n";
    return kExitConfig;
  }
  if (o.max_replacements < 0 || o.max_replacements > kMaxProcesses) {
    std::cerr << "rdmaps-local: --max_replacements must be 0 to " << kMaxProcesses << " (got "
              << o.max_replacements << ")\n";
    return kExitConfig;
  }
  if (o.replicas == 2 && (o.restart_servers > 0 || o.layout_env != "rdmaps")) {
    std::cerr << "rdmaps-local: --replicas=2 works with --layout_env=rdmaps and without "
                 "--restart_servers (a replicated shard fails over instead of restarting)\n";
    return kExitConfig;
  }
  if (o.layout_env != "rdmaps" && o.layout_env != "tf_config") {
    std::cerr << "rdmaps-local: --layout_env must be rdmaps or tf_config, not '" << o.layout_env
              << "'\n";
    return kExitConfig;
  }
  return std::nullopt;
}

void PrintLayout(const LaunchOptions& o) {
  std::vector<std::string> ps;
  for (int i = 0; i < o.servers; ++i) ps.push_back(o.host + ":<port " + std::to_string(i) + ">");
  std::cout << "rdmaps-local layout: " << o.servers << " servers on " << o.host
            << " (ports chosen at start-up), " << o.workers << " workers, transport " << o.transport
            << ", layout via " << (o.layout_env == "tf_config" ? "TF_CONFIG" : "RDMAPS_* variables")
            << "\n";
  for (int w = 0; w < o.workers; ++w) {
    std::cout << "  worker" << w << ": RDMAPS_ROLE=worker RDMAPS_TASK_INDEX=" << w
              << " RDMAPS_PS_HOSTS=" << JoinHosts(ps) << " RDMAPS_NUM_WORKERS=" << WorkerSlots(o)
              << "\n";
  }
}

// The phases of one run, in order; each either ends the run with an exit
// code or leaves the next phase its state.
class Launcher {
 public:
  Launcher(const LaunchOptions& options, Job& job, std::string tmpdir)
      : o_(options),
        job_(job),
        tmpdir_(std::move(tmpdir)),
        token_(o_.insecure            ? std::string()
               : o_.job_token.empty() ? rdmaps::GenerateJobSecret()
                                      : o_.job_token),
        start_(Clock::now()),
        startup_deadline_(start_ + o_.startup_timeout),
        job_deadline_(o_.timeout.count() > 0 ? start_ + o_.timeout : Clock::time_point::max()) {}

  int Run() {
    for (auto phase :
         {&Launcher::ResolveTables, &Launcher::StartServers, &Launcher::WaitForAddresses,
          &Launcher::StartWorkers, &Launcher::Supervise}) {
      if (Outcome rc = (this->*phase)()) return *rc;
    }
    return TearDown();
  }

 private:
  // The job's coordinator (docs/coordination.md): one the user named
  // (RDMAPS_COORDINATOR=etcd://...), else a directory of this run's private
  // temporary directory, shared by every process of the job.
  void AddCoordinatorEnv(std::map<std::string, std::string>& env) const {
    if (env.count("RDMAPS_COORDINATOR")) return;
    env["RDMAPS_COORDINATOR"] = "dir:" + tmpdir_ + "/coord";
    env["RDMAPS_COORDINATOR_PREFIX"] = "rdmaps/local/";
  }

  // --tables, checked, or the tables the worker command describes.
  Outcome ResolveTables() {
    if (!o_.tables.empty()) {
      auto t = ReadTablesFile(o_.tables);
      if (!t.ok()) {
        job_.Say(t.status().ToString());
        return kExitConfig;
      }
      tables_path_ = std::filesystem::absolute(o_.tables).string();
      return std::nullopt;
    }
    tables_path_ = tmpdir_ + "/tables.json";
    auto env = BaseEnv();
    env[kDescribeTablesEnv] = tables_path_;
    auto id = job_.Spawn({.name = "describe", .argv = o_.command, .env = env});
    if (!id.ok()) {
      job_.Say(id.status().ToString());
      return 1;
    }
    auto wake = job_.WaitUntil(startup_deadline_, [&] { return job_.exit_code(*id).has_value(); });
    if (wake.reason == Job::Wake::kSignal) return job_.StopForSignal(wake.signal);
    if (wake.reason == Job::Wake::kDeadline) {
      job_.Say("the worker command did not describe its tables within the start-up deadline");
      job_.StopAll();
      return kExitTimeout;
    }
    auto t = ReadTablesFile(tables_path_);
    if (*job_.exit_code(*id) != 0 || !t.ok()) {
      job_.Say("the worker command did not describe its tables (" + job_.how(*id) + ", " +
               t.status().ToString() + "): it must call rdmaps::DescribeTablesIfAsked() when " +
               kDescribeTablesEnv + " is set, or pass --tables=FILE");
      return kExitConfig;
    }
    job_.Say("tables from the worker command: " + std::to_string(t->size()) + " table(s)");
    return std::nullopt;
  }

  // Servers, each to report its address on fd 3. A restart (ps_ known) of
  // server `only` listens on its address and restores the latest checkpoint.
  Outcome StartServers() {
    if (o_.replicas == 2) {
      if (Outcome rc = StartBackups()) return rc;
      if (Outcome rc = WaitForReady(backups_, "backups")) return rc;
      for (std::size_t i = 0; i < backups_.size(); ++i) {
        backup_addresses_.push_back(*job_.ready_line(backups_[i]));
        copies_.push_back({backups_[i], static_cast<int>(i), backup_addresses_.back()});
      }
      job_.Say("backups ready: " + JoinHosts(backup_addresses_));
    }
    return StartServersOf(-1);
  }

  // A backup of shard `shard` (--replicas=2); with `rejoin_of`, a
  // replacement that copies the shard from that primary.
  ChildSpec BackupSpec(int shard, const std::string& name, const std::string& rejoin_of) const {
    const std::vector<std::string> placeholder(static_cast<std::size_t>(o_.servers),
                                               o_.host + ":0");
    ChildSpec spec{.name = name,
                   .argv = {ServerBinary(o_), "--tables=" + tables_path_, "--ready_fd=3",
                            "--startup_timeout_s=" + std::to_string(o_.startup_timeout.count()),
                            "--replicas=2", "--replica_role=backup"},
                   .env = BaseEnv(),
                   .server = true,
                   .replicated = true,
                   .ready_pipe = true};
    AddLayoutEnv(o_, spec.env, true, shard, placeholder, token_);
    AddCoordinatorEnv(spec.env);
    if (!rejoin_of.empty()) spec.argv.push_back("--rejoin_as_backup_of=" + rejoin_of);
    for (auto& arg : SplitArgs(o_.server_args)) spec.argv.push_back(std::move(arg));
    if (o_.max_workers > 0) spec.argv.push_back("--max_workers=" + std::to_string(o_.max_workers));
    return spec;
  }

  // --replicas=2: the backup of every shard, before its primary.
  Outcome StartBackups() {
    for (int i = 0; i < o_.servers; ++i) {
      const ChildSpec spec = BackupSpec(i, "ps" + std::to_string(i) + "b", "");
      auto id = job_.Spawn(spec);
      if (!id.ok()) {
        job_.Say(id.status().ToString());
        job_.StopAll();
        return 1;
      }
      backups_.push_back(*id);
      job_.Say(spec.name + " pid=" + std::to_string(job_.pid(*id)) + " started (backup of shard " +
               std::to_string(i) + ")");
    }
    return std::nullopt;
  }
  Outcome StartServersOf(int only) {
    const bool restart = !ps_.empty();
    const std::vector<std::string> placeholder(static_cast<std::size_t>(o_.servers),
                                               o_.host + ":0");
    const std::string binary = ServerBinary(o_);
    if (!restart) servers_.assign(static_cast<std::size_t>(o_.servers), ChildId{});
    for (int i = 0; i < o_.servers; ++i) {
      if (restart && i != only) continue;
      ChildSpec spec{.name = "ps" + std::to_string(i),
                     .argv = {binary, "--tables=" + tables_path_, "--ready_fd=3",
                              "--startup_timeout_s=" + std::to_string(o_.startup_timeout.count())},
                     .env = BaseEnv(),
                     .server = true,
                     .replicated = o_.replicas == 2,
                     .ready_pipe = true};
      AddLayoutEnv(o_, spec.env, true, i, placeholder, token_);
      AddCoordinatorEnv(spec.env);
      if (o_.replicas == 2) {
        spec.argv.push_back("--replicas=2");
        spec.argv.push_back("--backup_address=" + backup_addresses_[static_cast<std::size_t>(i)]);
      }
      // Workers reconnect after a server's restart: the others wait for them.
      if (o_.restart_servers > 0) spec.argv.push_back("--rejoin_timeout_s=60");
      for (auto& arg : SplitArgs(o_.server_args)) spec.argv.push_back(std::move(arg));
      if (o_.max_workers > 0)
        spec.argv.push_back("--max_workers=" + std::to_string(o_.max_workers));
      if (restart) {
        spec.argv.push_back("--listen=" + ps_[static_cast<std::size_t>(i)]);
        spec.argv.push_back("--restore=auto");
      }
      auto id = job_.Spawn(spec);
      if (!id.ok()) {
        job_.Say(id.status().ToString());
        job_.StopAll();
        return 1;
      }
      servers_[static_cast<std::size_t>(i)] = *id;
      job_.Say(spec.name + " pid=" + std::to_string(job_.pid(*id)) + " started");
    }
    return std::nullopt;
  }

  Outcome WaitForAddresses() {
    if (Outcome rc = WaitForReady(servers_, "servers")) return rc;
    std::vector<std::string> ps;
    for (ChildId id : servers_) ps.push_back(*job_.ready_line(id));
    if (!ps_.empty() && ps != ps_) {
      job_.Say("restarted servers listen on " + JoinHosts(ps) + ", not " + JoinHosts(ps_) +
               " where the workers look; stopping");
      job_.StopAll();
      return 1;
    }
    if (o_.replicas == 2 && ps_.empty()) {
      for (std::size_t i = 0; i < servers_.size(); ++i) {
        copies_.push_back({servers_[i], static_cast<int>(i), ps[i]});
      }
      shards_.assign(servers_.size(), ShardCare{});
    }
    ps_ = ps;
    job_.Say("servers ready: " + JoinHosts(ps_));
    return std::nullopt;
  }

  // Until every child of `ids` has written its ready line.
  Outcome WaitForReady(const std::vector<ChildId>& ids, const std::string& what) {
    auto all_ready = [&] {
      for (ChildId id : ids) {
        if (!job_.ready_line(id)) return false;
      }
      return true;
    };
    auto one_exited = [&] {
      for (ChildId id : ids) {
        if (job_.exit_code(id)) return true;
      }
      return false;
    };
    // The job deadline (--timeout_s) counts only once the servers are ready.
    auto wake = job_.WaitUntil(startup_deadline_, [&] { return all_ready() || one_exited(); });
    if (wake.reason == Job::Wake::kSignal) return job_.StopForSignal(wake.signal);
    if (!all_ready()) {
      for (ChildId id : ids) {
        if (auto rc = job_.exit_code(id)) {
          job_.Say(job_.name(id) + " exited (" + job_.how(id) + ") before it was ready; stopping");
          job_.StopAll();
          return *rc != 0 ? *rc : 1;
        }
      }
      std::string missing;
      for (ChildId id : ids) {
        if (!job_.ready_line(id)) missing += " " + job_.name(id);
      }
      job_.Say("start-up deadline (" + std::to_string(o_.startup_timeout.count()) + " s) passed; " +
               what + " never ready:" + missing);
      job_.StopAll();
      return kExitTimeout;
    }
    return std::nullopt;
  }

  Outcome StartWorkers() {
    workers_started_ = Clock::now();
    return StartWorkerRange(0, o_.workers);
  }

  Outcome StartWorkerRange(int first, int end) {
    for (int w = first; w < end; ++w) {
      const std::string name = "worker" + std::to_string(w);
      if (w == o_.omit_worker) {
        job_.Say(name + " not started (--omit_worker)");
        continue;
      }
      ChildSpec spec{.name = name, .argv = o_.command, .env = BaseEnv()};
      AddLayoutEnv(o_, spec.env, false, w, ps_, token_);
      AddCoordinatorEnv(spec.env);
      // The worker's rendezvous and connect deadline (ClusterLayout).
      spec.env["RDMAPS_STARTUP_TIMEOUT_S"] = std::to_string(o_.startup_timeout.count());
      auto id = job_.Spawn(spec);
      if (!id.ok()) {
        job_.Say(id.status().ToString());
        job_.StopAll();
        return 1;
      }
      workers_.push_back(*id);
      job_.Say(name + " pid=" + std::to_string(job_.pid(*id)) + " started");
    }
    return std::nullopt;
  }

  // Until every worker has exited, or something fails.
  Outcome Supervise() {
    auto workers_done_or_failure = [&] {
      if (job_.failure()) return true;
      for (ChildId id : workers_) {
        if (!job_.exit_code(id)) return false;
      }
      return true;
    };
    if (!joined_ && o_.join_workers > 0) {
      // Elastic: the joiners start join_after after the first workers,
      // unless the job ends (or fails) first.
      const auto join_at = workers_started_ + o_.join_after;
      auto wake = WaitAndReprotect(std::min(job_deadline_, join_at), workers_done_or_failure);
      if (wake.reason == Job::Wake::kSignal) return job_.StopForSignal(wake.signal);
      if (wake.reason == Job::Wake::kDeadline && Clock::now() >= join_at) {
        joined_ = true;
        job_.Say("starting " + std::to_string(o_.join_workers) +
                 " more workers to join the running job");
        if (Outcome rc = StartWorkerRange(o_.workers, o_.workers + o_.join_workers)) return rc;
      }
    }
    auto wake = WaitAndReprotect(job_deadline_, workers_done_or_failure);
    if (wake.reason == Job::Wake::kSignal) return job_.StopForSignal(wake.signal);
    if (job_.failure() && job_.failure()->server && restarts_ < o_.restart_servers) {
      // Only the dead server restarts, from the latest checkpoint; the
      // workers have the others rewind to it in place.
      ++restarts_;
      int dead = -1;
      for (std::size_t i = 0; i < servers_.size(); ++i) {
        if (job_.exit_code(servers_[i])) dead = static_cast<int>(i);
      }
      if (dead < 0) {
        job_.Say(job_.failure()->what + "; no server has exited: stopping the job");
        job_.StopAll();
        return job_.failure()->exit_code;
      }
      job_.Say(job_.failure()->what + "; restarting ps" + std::to_string(dead) +
               " from the latest checkpoint, the others rewind to it (" +
               std::to_string(restarts_) + " of " + std::to_string(o_.restart_servers) + ")");
      job_.KillAndForget({servers_[static_cast<std::size_t>(dead)]});
      startup_deadline_ = Clock::now() + o_.startup_timeout;
      if (Outcome rc = StartServersOf(dead)) return rc;
      if (Outcome rc = WaitForAddresses()) return rc;
      return Supervise();
    }
    if (job_.failure()) {
      // Collect a likelier cause of this failure (see Job::kSettle).
      wake = job_.WaitUntil(job_.failure()->at + Job::kSettle,
                            [&] { return job_.failure()->cause == Job::Cause::kServerDied; });
      if (wake.reason == Job::Wake::kSignal) return job_.StopForSignal(wake.signal);
      job_.Say(job_.failure()->what + "; stopping the job");
      job_.StopAll();
      return job_.failure()->exit_code;
    }
    if (wake.reason == Job::Wake::kDeadline) {
      job_.Say("job deadline (--timeout_s=" + std::to_string(o_.timeout.count()) +
               ") passed; stopping the job");
      job_.StopAll();
      return kExitTimeout;
    }
    return std::nullopt;
  }

  // Job::WaitUntil, and meanwhile re-protection (--replicas=2): a copy of a
  // shard that died wakes it, and while a shard is being re-protected it
  // looks at the shard map every kReprotectPoll.
  Job::Wake WaitAndReprotect(Clock::time_point deadline, const std::function<bool()>& done) {
    while (true) {
      const bool busy = std::any_of(shards_.begin(), shards_.end(),
                                    [](const ShardCare& s) { return s.lost_copy; });
      const auto until = busy ? std::min(deadline, Clock::now() + kReprotectPoll) : deadline;
      auto wake = job_.WaitUntil(until, [&] { return done() || NoticeDeadCopies(); });
      if (wake.reason == Job::Wake::kSignal || done()) return wake;
      if (wake.reason == Job::Wake::kDeadline && Clock::now() >= deadline) return wake;
      for (std::size_t i = 0; i < shards_.size(); ++i) ReprotectStep(static_cast<int>(i));
    }
  }

  // Marks the shards of copies that died (not exit 0: a promoted copy ends
  // when its workers have closed) since the last call; true if there were.
  bool NoticeDeadCopies() {
    bool any = false;
    for (Copy& c : copies_) {
      const auto rc = job_.exit_code(c.id);
      if (!rc || c.dead) continue;
      c.dead = true;
      if (*rc == 0 || o_.max_replacements == 0) continue;
      ShardCare& s = shards_[static_cast<std::size_t>(c.shard)];
      if (!s.lost_copy) s.lost_at = Clock::now();
      s.lost_copy = true;
      any = true;
    }
    return any;
  }

  // One look at shard `shard` that lost a copy: a replacement that came in
  // sync (the map names it) or died, or the map naming a live survivor
  // alone (then a replacement starts).
  void ReprotectStep(int shard) {
    ShardCare& s = shards_[static_cast<std::size_t>(shard)];
    if (!s.lost_copy) return;
    const std::string what = "shard " + std::to_string(shard);
    if (!decider_) {
      auto d = OpenDecider();
      if (!d.ok()) {
        job_.Say(what + " lost a copy, but the shard map cannot be read (" + d.status().ToString() +
                 "); it is not re-protected");
        s.lost_copy = false;
        return;
      }
      decider_ = std::move(d).value();
    }
    auto entry = decider_->Current(static_cast<std::uint32_t>(shard));
    if (s.replacement) {
      const ChildId r = *s.replacement;
      const auto ready = job_.ready_line(r);
      if (job_.exit_code(r)) {
        job_.Say(job_.name(r) + " ended (" + job_.how(r) + ") before it was in sync; " + what +
                 " still has one copy");
        s.replacement.reset();
        s.not_before = Clock::now() + kRetryAfter;
      } else if (ready && entry.ok() && entry->backup == *ready) {
        job_.Say(what + " is protected again: " + job_.name(r) + " (" + *ready +
                 ") is the backup of " + entry->primary + " at epoch " +
                 std::to_string(entry->epoch));
        copies_.push_back({r, shard, *ready});
        s.replacement.reset();
        s.lost_copy = false;
      } else if (Clock::now() >= s.give_up) {
        job_.Say(job_.name(r) + " is not in sync " + std::to_string(o_.startup_timeout.count()) +
                 " s after it started; killing it");
        job_.Signal(r, SIGKILL);
        s.give_up = Clock::time_point::max();  // (its exit is handled above)
      }
      return;
    }
    if (Clock::now() < s.not_before) return;
    // The survivor's decision: the shard map names it as the only copy.
    const Copy* survivor = nullptr;
    if (entry.ok() && entry->backup.empty()) {
      for (const Copy& c : copies_) {
        if (c.address == entry->primary && !job_.exit_code(c.id)) survivor = &c;
      }
    }
    if (!survivor) {
      const bool decided = entry.ok() && entry->backup.empty();
      if (decided || Clock::now() >= s.lost_at + o_.startup_timeout) {
        job_.Say(what + " has no live copy the shard map names alone (" +
                 (entry.ok() ? "primary " + entry->primary + ", backup " +
                                   (entry->backup.empty() ? "none" : entry->backup)
                             : entry.status().ToString()) +
                 "); it is not re-protected");
        s.lost_copy = false;
      }
      return;  // (else the survivor has not reported the loss yet)
    }
    if (replacements_.size() >= static_cast<std::size_t>(o_.max_replacements)) {
      job_.Say(what + " runs with one copy: the " + std::to_string(o_.max_replacements) +
               " replacements of --max_replacements are used up");
      s.lost_copy = false;
      return;
    }
    const std::string name = "ps" + std::to_string(shard) + "r" + std::to_string(++s.started);
    auto id = job_.Spawn(BackupSpec(shard, name, survivor->address));
    if (!id.ok()) {
      job_.Say("starting " + name + ": " + id.status().ToString() + "; " + what +
               " is not re-protected");
      s.lost_copy = false;
      return;
    }
    replacements_.push_back(*id);
    s.replacement = *id;
    s.give_up = Clock::now() + o_.startup_timeout;
    job_.Say(name + " pid=" + std::to_string(job_.pid(*id)) + " started (replacement backup of " +
             what + ", copying it from " + survivor->address + ")");
  }

  // The shard map the servers keep, in the coordinator they were given
  // (rdmaps-server resolves it from the same environment).
  Result<std::shared_ptr<FailoverDecider>> OpenDecider() const {
    auto env = BaseEnv();
    const std::vector<std::string> placeholder(static_cast<std::size_t>(o_.servers),
                                               o_.host + ":0");
    AddLayoutEnv(o_, env, true, 0, placeholder, token_);
    AddCoordinatorEnv(env);
    RDMAPS_ASSIGN_OR_RETURN(auto layout, ResolveCluster(ClusterOptions{}, env));
    CoordinatorConfig coordinator = layout.coordinator;
    if (coordinator.job_prefix.empty()) coordinator.job_prefix = "rdmaps/job/";
    return OpenFailoverDecider(coordinator);
  }

  // Servers exit by themselves once every worker has closed.
  int TearDown() {
    // A backup that was never promoted has no workers to wait for, and a
    // promoted one may wait for workers that finished before it served.
    for (ChildId id : backups_) job_.Signal(id, SIGTERM);
    for (ChildId id : replacements_) job_.Signal(id, SIGTERM);
    const auto servers_by = std::min(job_deadline_, Clock::now() + o_.grace);
    auto wake = job_.WaitUntil(servers_by, [&] { return job_.Live() == 0; });
    if (wake.reason == Job::Wake::kSignal) return job_.StopForSignal(wake.signal);
    if (job_.Live() > 0) {
      job_.Say("servers still running " + std::to_string(o_.grace.count()) +
               " s after the last worker; stopping them");
      job_.StopAll();
    }
    if (job_.failure()) {
      job_.Say("job failed: " + job_.failure()->what);
      return job_.failure()->exit_code;
    }
    std::chrono::duration<double> took = Clock::now() - start_;
    job_.Say("job done in " + std::to_string(took.count()) + " s");
    return 0;
  }

  // Constant after construction.
  const LaunchOptions& o_;
  Job& job_;
  const std::string tmpdir_;
  const std::string token_;
  const Clock::time_point start_;
  Clock::time_point startup_deadline_;  // moved on by a restart of the servers
  const Clock::time_point job_deadline_;

  // Set by the phases, in order.
  std::string tables_path_;
  std::vector<ChildId> servers_;
  std::vector<std::string> ps_;   // the servers' addresses
  std::vector<ChildId> backups_;  // --replicas=2: shard i's backup
  std::vector<std::string> backup_addresses_;
  std::vector<ChildId> workers_;
  Clock::time_point workers_started_;
  int restarts_ = 0;
  bool joined_ = false;  // the join_workers were started

  // Re-protection (--replicas=2).
  struct Copy {
    ChildId id;
    int shard;
    std::string address;
    bool dead = false;  // seen by NoticeDeadCopies
  };
  struct ShardCare {
    bool lost_copy = false;  // a copy died; not yet re-protected (or given up)
    Clock::time_point lost_at;
    std::optional<ChildId> replacement;  // started, not yet named by the map
    Clock::time_point give_up;           // for the replacement to be in sync
    Clock::time_point not_before;        // the next replacement after one failed
    int started = 0;                     // replacements of this shard, for names
  };
  static constexpr std::chrono::milliseconds kReprotectPoll{100};
  static constexpr std::chrono::milliseconds kRetryAfter{500};
  std::vector<Copy> copies_;  // every copy of a shard that served or was in sync
  std::vector<ShardCare> shards_;
  std::vector<ChildId> replacements_;  // every replacement started
  std::shared_ptr<FailoverDecider> decider_;
};

}  // namespace

int Launch(const LaunchOptions& options) {
  if (Outcome rc = CheckOptions(options)) return *rc;
  if (options.print_layout) {
    PrintLayout(options);
    return 0;
  }
  JobOptions job_options;
  job_options.grace = options.grace;
  auto job = Job::Create(std::move(job_options));
  if (!job.ok()) {
    LOG(ERROR) << job.status().ToString();
    return 1;
  }
  char tmpdir[] = "/tmp/rdmaps-local-XXXXXX";
  if (!mkdtemp(tmpdir)) {
    PLOG(ERROR) << "mkdtemp";
    return 1;
  }
  int rc = Launcher(options, **job, tmpdir).Run();
  std::error_code ec;
  std::filesystem::remove_all(tmpdir, ec);
  return rc;
}

}  // namespace rdmaps::local

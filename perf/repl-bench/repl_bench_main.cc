// repl-bench: the cost of replicated shards, measured against unreplicated
// ones in the same run (docs/ps.md, "Replication and failover").
//
//   push     one worker pushes --push_bytes_list sizes (4 MiB and 1 KiB by
//            default; from a registered buffer, zero-copy, or with
//            --noregistered a plain one, copied) to one shard with
//            replicas = 1 and with replicas = 2 (primary and backup in this
//            process, over --transport), runs alternating, --repeat times;
//            median pushes/s of each and the ratio replicated /
//            unreplicated. Each run ends with a Flush, so every push counted
//            is acknowledged. Per push (of the run of median throughput):
//            process CPU, the worker thread's part, and the primary's slots,
//            log records, log WRITEs, credit READs and both apply loops'
//            notification batches.
//   catchup  --catchup_repeat times: a replicated shard of an Adam table of
//            --catchup_mib MiB of rows loses its primary; the promoted
//            backup serves alone while a worker keeps pushing; a
//            replacement backup (ServerOptions::rejoin_as_backup_of) is
//            started and timed until the shard map names it (copied and
//            caught up). Reported: bytes of shard state copied (rows,
//            optimizer state, worker words) per second until in sync, and
//            a memcpy of the same bytes measured in the same run; pushes
//            acknowledged during the catch-up.
//   failover --drills times: a replicated shard and a worker pushing 1 KiB;
//            the primary Server is destroyed (its connections close, as
//            when its process dies); the time from then until the worker's
//            first Push + Flush acknowledged by the promoted backup. p50
//            and max.
//            With --backup_cpus the backup's threads run on those CPUs and
//            the worker's and the primary's on the others, in both kinds of
//            run: a model of a cluster, where the backup is another
//            machine's CPU (the ratio then is what replication costs the
//            primary and the worker; on tcp loopback the primary also pays
//            the kernel's copy of every log byte, which a NIC does).
// Output: a table, or one JSON object (--json).
#include <gflags/gflags.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/failover.h"
#include "rdmaps/server.h"
#include "tools/common/flags.h"

DEFINE_string(transport, "tcp", "tcp (loopback) or fake");
DEFINE_string(push_bytes_list, "4194304,1024", "push sizes to measure, in bytes (multiples of 4)");
DEFINE_double(seconds, 1.0, "target duration of each push run");
DEFINE_int32(repeat, 3, "push runs of each kind (median reported)");
DEFINE_int32(drills, 20, "failover drills");
DEFINE_int32(catchup_mib, 64, "catch-up: MiB of table rows (Adam: the state doubles it); 0 skips");
DEFINE_int32(catchup_repeat, 3, "catch-up runs (median reported)");
DEFINE_int32(server_busy_poll_us, -1,
             "completion waits' spin (TransportOptions::busy_poll) of the servers; -1: the "
             "library's default");
DEFINE_int32(worker_busy_poll_us, -1, "the same for the worker");
DEFINE_int32(log_busy_poll_us, -1,
             "ServerOptions::log_busy_poll of the primary; -1: the library's default");
DEFINE_bool(registered, true,
            "push from a registered buffer (zero-copy); false: a plain one (copied)");
DEFINE_string(backup_cpus, "",
              "comma-separated CPUs for the backup's threads; the worker and the primary run on "
              "the others (both kinds of run). Empty: no pinning");
DEFINE_string(primary_host, "127.0.0.1",
              "tcp: the address the primary listens on (perf/repl-bench/links.sh gives it a "
              "shaped link of its own)");
DEFINE_string(backup_host, "127.0.0.1", "tcp: the address the backup listens on");
DEFINE_bool(json, false, "print one JSON object instead of a table");

namespace {

using Clock = std::chrono::steady_clock;
using rdmaps::Client;
using rdmaps::ClientOptions;
using rdmaps::Server;
using rdmaps::ServerOptions;

[[noreturn]] void Die(const std::string& what, const rdmaps::Status& st) {
  std::fprintf(stderr, "repl-bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Must(rdmaps::Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.status());
  return std::move(r).value();
}

std::string Listen(const std::string& host) {
  return FLAGS_transport == "fake" ? "fake:0" : host + ":0";
}

rdmaps::TableOptions Table(std::uint64_t floats) {
  rdmaps::TableOptions t;
  t.id = 1;
  t.name = "t";
  t.dim = static_cast<std::uint32_t>(std::min<std::uint64_t>(floats, 1024));
  t.rows = (floats + t.dim - 1) / t.dim;
  t.layout = rdmaps::RowLayout::kDense;
  t.optimizer = rdmaps::OptimizerOptions::Sgd(0.01f);
  return t;
}

struct Shard {
  std::shared_ptr<rdmaps::FailoverDecider> decider;
  std::unique_ptr<Server> backup, primary;
  std::unique_ptr<Client> client;
};

// --backup_cpus, and the CPUs left for the worker and the primary (empty
// sets: no pinning).
cpu_set_t backup_cpus, other_cpus;
bool pinned = false;

// Runs the calling thread (and the threads it starts from now on) on `set`.
void PinTo(const cpu_set_t& set) {
  if (!pinned) return;
  if (int e = ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set); e != 0) {
    std::fprintf(stderr, "repl-bench: pthread_setaffinity_np: %s\n", std::strerror(e));
    std::exit(1);
  }
}

Shard StartShard(const rdmaps::TableOptions& table, bool replicated) {
  Shard s;
  ServerOptions o;
  o.transport.transport = FLAGS_transport;
  o.transport.job_token = "repl-bench";
  if (FLAGS_server_busy_poll_us >= 0) {
    o.transport.busy_poll = std::chrono::microseconds(FLAGS_server_busy_poll_us);
  }
  o.listen_address = Listen(FLAGS_primary_host);
  o.tables = {table};
  o.exit_when_workers_done = false;
  if (replicated) {
    s.decider = rdmaps::NewEmbeddedFailoverDecider();
    ServerOptions b = o;
    b.replicas = 2;
    b.replica_role = rdmaps::ReplicaRole::kBackup;
    b.listen_address = Listen(FLAGS_backup_host);
    b.failover = s.decider;
    PinTo(backup_cpus);  // (its threads inherit it)
    s.backup = Must(Server::Start(b), "starting the backup");
    PinTo(other_cpus);
    o.replicas = 2;
    if (FLAGS_log_busy_poll_us >= 0) {
      o.log_busy_poll = std::chrono::microseconds(FLAGS_log_busy_poll_us);
    }
    o.backup_address = s.backup->address();
    o.failover = s.decider;
  }
  s.primary = Must(Server::Start(o), "starting the primary");
  ClientOptions c;
  c.transport = o.transport;
  if (FLAGS_worker_busy_poll_us >= 0) {
    c.transport.busy_poll = std::chrono::microseconds(FLAGS_worker_busy_poll_us);
  }
  c.servers = {s.primary->address()};
  c.failover = s.decider;
  c.wait_timeout = std::chrono::seconds(30);
  s.client = Must(Client::Connect(c), "connecting the worker");
  return s;
}

// CPU time (user + sys) in seconds of `who`: RUSAGE_SELF, the process
// (every thread: worker, servers, progress threads), or RUSAGE_THREAD, the
// calling thread (the worker).
double CpuSeconds(int who = RUSAGE_SELF) {
  rusage u{};
  ::getrusage(who, &u);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

struct PushRun {
  double per_s = 0;
  double cpu_us = 0;         // process CPU per push
  double worker_cpu_us = 0;  // of it, the worker's thread (the rest: the servers')
  // Per push: slots the primary applied, log records and WRITEs it sent,
  // credit READs, notification batches of the primary's and the backup's
  // apply loop.
  double slots = 0, records = 0, writes = 0, reads = 0, primary_batches = 0, backup_batches = 0;
};

// Pushes of `floats` for about FLAGS_seconds.
PushRun PushRate(std::uint64_t floats, bool replicated) {
  const rdmaps::TableOptions t = Table(floats);
  Shard s = StartShard(t, replicated);
  std::vector<float> grads(t.rows * t.dim, 1e-3f);
  if (FLAGS_registered) {
    if (auto st = s.client->RegisterBuffer(grads); !st.ok()) Die("RegisterBuffer", st);
  }
  const std::span<const float> g(grads.data(), floats);
  const rdmaps::RowRange range{0, floats / t.dim};
  // Warm-up, then timed batches until the target duration.
  for (int i = 0; i < 3; ++i) {
    if (auto st = s.client->Push(1, range, g); !st.ok()) Die("Push", st);
  }
  if (auto st = s.client->Flush(); !st.ok()) Die("Flush", st);
  std::uint64_t n = 0;
  const rdmaps::ServerStats p0 = s.primary->stats();
  const rdmaps::ServerStats b0 = replicated ? s.backup->stats() : rdmaps::ServerStats{};
  const double cpu0 = CpuSeconds();
  const double worker0 = CpuSeconds(RUSAGE_THREAD);
  const auto t0 = Clock::now();
  const auto until = t0 + std::chrono::duration<double>(FLAGS_seconds);
  while (Clock::now() < until) {
    for (int i = 0; i < 16; ++i, ++n) {
      if (auto st = s.client->Push(1, range, g); !st.ok()) Die("Push", st);
    }
  }
  if (auto st = s.client->Flush(); !st.ok()) Die("Flush", st);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  const double worker_cpu = CpuSeconds(RUSAGE_THREAD) - worker0;
  const rdmaps::ServerStats p1 = s.primary->stats();
  const rdmaps::ServerStats b1 = replicated ? s.backup->stats() : rdmaps::ServerStats{};
  (void)s.client->Close();
  const auto per = [&](std::uint64_t a, std::uint64_t b) {
    return static_cast<double>(b - a) / static_cast<double>(n);
  };
  PushRun run;
  run.per_s = static_cast<double>(n) / secs;
  run.cpu_us = cpu * 1e6 / static_cast<double>(n);
  run.worker_cpu_us = worker_cpu * 1e6 / static_cast<double>(n);
  run.slots = per(p0.pushes_applied, p1.pushes_applied);
  run.records = per(p0.log_records, p1.log_records);
  run.writes = per(p0.log_writes, p1.log_writes);
  run.reads = per(p0.log_credit_reads, p1.log_credit_reads);
  run.primary_batches = per(p0.apply_batches, p1.apply_batches);
  run.backup_batches = per(b0.apply_batches, b1.apply_batches);
  return run;
}

// The run of median throughput.
PushRun MedianRun(std::vector<PushRun> v) {
  std::sort(v.begin(), v.end(),
            [](const PushRun& a, const PushRun& b) { return a.per_s < b.per_s; });
  return v[v.size() / 2];
}

// Kill -> first acknowledged push at the new primary, in ms.
double Drill() {
  const rdmaps::TableOptions t = Table(256);
  Shard s = StartShard(t, true);
  const std::vector<float> g(256, 1e-3f);
  for (int i = 0; i < 20; ++i) {
    if (auto st = s.client->Push(1, {0, 1}, g); !st.ok()) Die("Push", st);
  }
  if (auto st = s.client->Flush(); !st.ok()) Die("Flush", st);
  const auto t0 = Clock::now();
  s.primary.reset();  // every connection of the primary closes
  if (auto st = s.client->Push(1, {0, 1}, g); !st.ok()) Die("Push after the kill", st);
  if (auto st = s.client->Flush(); !st.ok()) Die("Flush after the kill", st);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (s.client->stats().failovers != 1) {
    Die("drill", rdmaps::InternalError("the worker did not fail over"));
  }
  (void)s.client->Close();
  return ms;
}

struct Catchup {
  // seconds: from Server::Start of the replacement (its own tables
  // allocated and initialised first) until the shard map names it;
  // sync_seconds: from its connect to the primary until it was in sync.
  double bytes = 0, seconds = 0, sync_seconds = 0, memcpy_bytes_per_s = 0;
  std::uint64_t pushes_during = 0;
};

// Bytes per second of memcpy of `bytes` (both buffers faulted in first), best of 3.
double MemcpyRate(std::size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) / secs);
    src[i] = dst[bytes - 1 - i];  // (keeps the copies observable)
  }
  return best;
}

// Primary lost, a replacement copies the shard while a worker pushes.
Catchup CatchupRun() {
  rdmaps::TableOptions t;
  t.id = 1;
  t.name = "t";
  t.dim = 256;
  t.rows = std::uint64_t(FLAGS_catchup_mib) * (1 << 20) / (t.dim * 4);
  t.layout = rdmaps::RowLayout::kDense;
  t.optimizer = rdmaps::OptimizerOptions::Adam(0.001f);
  Shard s = StartShard(t, true);
  const std::vector<float> g(16 * 256, 1e-3f);
  for (int i = 0; i < 4; ++i) {
    if (auto st = s.client->Push(1, {0, 16}, g); !st.ok()) Die("Push", st);
  }
  if (auto st = s.client->Flush(); !st.ok()) Die("Flush", st);
  s.primary.reset();  // the backup takes over; the shard has one copy
  if (auto st = s.client->Push(1, {0, 16}, g); !st.ok()) Die("Push after the kill", st);
  if (auto st = s.client->Flush(); !st.ok()) Die("Flush after the kill", st);
  const std::string primary = Must(s.decider->Current(0), "reading the shard map").primary;
  // Training goes on: 16 KiB pushes over the rows, Flush every 16.
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> acked{0};
  std::thread worker([&] {
    for (std::uint64_t i = 0; !stop.load(); ++i) {
      const std::uint64_t first = (i * 16) % (t.rows - 16);
      if (auto st = s.client->Push(1, {first, 16}, g); !st.ok()) Die("Push during catch-up", st);
      if (i % 16 == 15) {
        if (auto st = s.client->Flush(); !st.ok()) Die("Flush during catch-up", st);
        acked.store(i + 1);
      }
    }
  });
  ServerOptions r;
  r.transport.transport = FLAGS_transport;
  r.transport.job_token = "repl-bench";
  r.listen_address = Listen(FLAGS_backup_host);
  r.tables = {t};
  r.exit_when_workers_done = false;
  r.replicas = 2;
  r.replica_role = rdmaps::ReplicaRole::kBackup;
  r.failover = s.decider;
  r.rejoin_as_backup_of = primary;
  const std::uint64_t acked0 = acked.load();
  const auto t0 = Clock::now();
  auto replacement = Must(Server::Start(r), "starting the replacement");
  while (Must(s.decider->Current(0), "reading the shard map").backup != replacement->address()) {
    if (Clock::now() - t0 > std::chrono::seconds(120)) {
      Die("catch-up", rdmaps::TimedOutError("the replacement was not in sync within 120 s"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  Catchup c;
  c.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  c.pushes_during = acked.load() - acked0;
  stop.store(true);
  worker.join();
  c.bytes = static_cast<double>(replacement->stats().catchup_bytes);
  c.sync_seconds = replacement->stats().catchup_seconds;
  c.memcpy_bytes_per_s = MemcpyRate(replacement->stats().catchup_bytes);
  (void)s.client->Close();
  return c;
}

// Calls take(n) for each comma-separated unsigned number of `text`; false
// (after saying why on stderr, quoting the item and `what` it must be) at
// the first item that is not a number or that take refuses.
template <typename Take>
bool ForEachNumber(const std::string& text, const char* flag, const char* what, Take&& take) {
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc() || end != item.data() + item.size() || !take(n)) {
      std::fprintf(stderr, "repl-bench: %s: '%s' is not %s\n", flag, item.c_str(), what);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "replicated vs unreplicated push throughput and failover time, in one run");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  std::vector<std::uint64_t> sizes;
  if (!ForEachNumber(FLAGS_push_bytes_list, "--push_bytes_list",
                     "a byte count that is a multiple of 4, from 4 to 1 GiB", [&](std::uint64_t b) {
                       if (b < 4 || b % 4 != 0 || b > (std::uint64_t{1} << 30)) return false;
                       sizes.push_back(b);
                       return true;
                     })) {
    return 2;
  }
  if (!FLAGS_backup_cpus.empty()) {
    CPU_ZERO(&backup_cpus);
    if (::sched_getaffinity(0, sizeof(other_cpus), &other_cpus) != 0) {
      std::perror("repl-bench: sched_getaffinity");
      return 1;
    }
    if (!ForEachNumber(FLAGS_backup_cpus, "--backup_cpus", "a CPU this process may run on",
                       [&](std::uint64_t cpu) {
                         if (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &other_cpus)) return false;
                         CPU_SET(cpu, &backup_cpus);
                         CPU_CLR(cpu, &other_cpus);
                         return true;
                       })) {
      return 2;
    }
    if (CPU_COUNT(&other_cpus) == 0) {
      std::fprintf(stderr,
                   "repl-bench: --backup_cpus leaves no CPU for the worker and the primary\n");
      return 2;
    }
    pinned = true;
    PinTo(other_cpus);
  }
  struct Row {
    std::uint64_t bytes;
    PushRun plain, replicated;
  };
  std::vector<Row> rows;
  for (std::uint64_t b : sizes) {
    std::vector<PushRun> plain, repl;
    for (int r = 0; r < FLAGS_repeat; ++r) {
      plain.push_back(PushRate(b / 4, false));
      repl.push_back(PushRate(b / 4, true));
    }
    rows.push_back({b, MedianRun(plain), MedianRun(repl)});
  }
  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) < 1) load[0] = -1;
  std::vector<Catchup> catchups;
  for (int i = 0; FLAGS_catchup_mib > 0 && i < FLAGS_catchup_repeat; ++i) {
    catchups.push_back(CatchupRun());
  }
  std::sort(catchups.begin(), catchups.end(), [](const Catchup& a, const Catchup& b) {
    return a.bytes / a.seconds < b.bytes / b.seconds;
  });
  const Catchup cu = catchups.empty() ? Catchup{} : catchups[catchups.size() / 2];
  const double cu_rate = cu.seconds > 0 ? cu.bytes / cu.seconds : 0;
  const double cu_ratio = cu.memcpy_bytes_per_s > 0 ? cu_rate / cu.memcpy_bytes_per_s : 0;
  const double sync_rate = cu.sync_seconds > 0 ? cu.bytes / cu.sync_seconds : 0;
  const double sync_ratio = cu.memcpy_bytes_per_s > 0 ? sync_rate / cu.memcpy_bytes_per_s : 0;
  std::vector<double> drills;
  for (int i = 0; i < FLAGS_drills; ++i) drills.push_back(Drill());
  std::sort(drills.begin(), drills.end());
  const double p50 = drills.empty() ? 0 : drills[drills.size() / 2];
  const double max = drills.empty() ? 0 : drills.back();
  if (FLAGS_json) {
    std::printf(
        "{\"transport\":\"%s\",\"registered\":%s,\"backup_cpus\":\"%s\",\"primary_host\":"
        "\"%s\",\"backup_host\":\"%s\",\"load_average\":%.2f,\"push\":[",
        FLAGS_transport.c_str(), FLAGS_registered ? "true" : "false", FLAGS_backup_cpus.c_str(),
        FLAGS_primary_host.c_str(), FLAGS_backup_host.c_str(), load[0]);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const PushRun& p = rows[i].plain;
      const PushRun& r = rows[i].replicated;
      std::printf(
          "%s{\"bytes\":%llu,\"unreplicated_per_s\":%.1f,\"replicated_per_s\":%.1f,"
          "\"ratio\":%.3f,\"unreplicated_cpu_us\":%.2f,\"replicated_cpu_us\":%.2f,"
          "\"cpu_ratio\":%.3f,\"unreplicated_worker_cpu_us\":%.2f,"
          "\"replicated_worker_cpu_us\":%.2f,\"slots_per_push\":%.2f,\"records_per_push\":%.2f,"
          "\"writes_per_push\":%.3f,\"credit_reads_per_push\":%.3f,"
          "\"unreplicated_batches_per_push\":%.3f,\"primary_batches_per_push\":%.3f,"
          "\"backup_batches_per_push\":%.3f}",
          i ? "," : "", static_cast<unsigned long long>(rows[i].bytes), p.per_s, r.per_s,
          r.per_s / p.per_s, p.cpu_us, r.cpu_us, r.cpu_us / p.cpu_us, p.worker_cpu_us,
          r.worker_cpu_us, r.slots, r.records, r.writes, r.reads, p.primary_batches,
          r.primary_batches, r.backup_batches);
    }
    std::printf(
        "],\"catchup\":{\"runs\":%zu,\"bytes\":%.0f,\"seconds\":%.4f,\"bytes_per_s\":%.0f,"
        "\"sync_seconds\":%.4f,\"sync_bytes_per_s\":%.0f,\"sync_ratio\":%.4f,"
        "\"memcpy_bytes_per_s\":%.0f,\"ratio\":%.4f,\"pushes_during\":%llu}",
        catchups.size(), cu.bytes, cu.seconds, cu_rate, cu.sync_seconds, sync_rate, sync_ratio,
        cu.memcpy_bytes_per_s, cu_ratio, static_cast<unsigned long long>(cu.pushes_during));
    std::printf(",\"failover\":{\"drills\":%zu,\"p50_ms\":%.2f,\"max_ms\":%.2f}}\n", drills.size(),
                p50, max);
    return 0;
  }
  std::printf(
      "transport %s (primary on %s, backup on %s), one shard, one worker, %s buffer, %s, medians "
      "of %d runs, load average %.2f\n",
      FLAGS_transport.c_str(), FLAGS_primary_host.c_str(), FLAGS_backup_host.c_str(),
      FLAGS_registered ? "registered" : "plain",
      pinned ? ("backup on CPUs " + FLAGS_backup_cpus + ", the rest on the others").c_str()
             : "no pinning",
      FLAGS_repeat, load[0]);
  std::printf("%12s %18s %18s %8s %12s %12s %9s\n", "push bytes", "replicas=1 push/s",
              "replicas=2 push/s", "ratio", "cpu us r=1", "cpu us r=2", "cpu ratio");
  for (const Row& r : rows) {
    std::printf("%12llu %18.1f %18.1f %8.3f %12.2f %12.2f %9.3f\n",
                static_cast<unsigned long long>(r.bytes), r.plain.per_s, r.replicated.per_s,
                r.replicated.per_s / r.plain.per_s, r.plain.cpu_us, r.replicated.cpu_us,
                r.replicated.cpu_us / r.plain.cpu_us);
  }
  std::printf("%12s %18s %18s %12s %12s %9s\n", "cpu us/push", "worker r=1", "worker r=2",
              "servers r=1", "servers r=2", "ratio");
  for (const Row& r : rows) {
    const double s1 = r.plain.cpu_us - r.plain.worker_cpu_us;
    const double s2 = r.replicated.cpu_us - r.replicated.worker_cpu_us;
    std::printf("%12llu %18.2f %18.2f %12.2f %12.2f %9.3f\n",
                static_cast<unsigned long long>(r.bytes), r.plain.worker_cpu_us,
                r.replicated.worker_cpu_us, s1, s2, s2 / s1);
  }
  std::printf("%12s %9s %9s %9s %9s %12s %12s %12s\n", "per push", "slots", "records", "writes",
              "reads", "batches r=1", "primary r=2", "backup r=2");
  for (const Row& r : rows) {
    const PushRun& x = r.replicated;
    std::printf("%12llu %9.2f %9.2f %9.3f %9.3f %12.3f %12.3f %12.3f\n",
                static_cast<unsigned long long>(r.bytes), x.slots, x.records, x.writes, x.reads,
                r.plain.primary_batches, x.primary_batches, x.backup_batches);
  }
  if (!catchups.empty()) {
    std::printf(
        "catch-up of a replacement backup (median of %zu): %.1f MiB of shard state; memcpy of "
        "the same bytes %.2f GB/s\n"
        "  Start -> in the shard map %.3f s = %.3f GB/s (ratio %.3f); connect -> in sync %.3f s "
        "= %.3f GB/s (ratio %.3f); %llu pushes acknowledged meanwhile\n",
        catchups.size(), cu.bytes / (1 << 20), cu.memcpy_bytes_per_s / 1e9, cu.seconds,
        cu_rate / 1e9, cu_ratio, cu.sync_seconds, sync_rate / 1e9, sync_ratio,
        static_cast<unsigned long long>(cu.pushes_during));
  }
  std::printf(
      "failover (kill -> first acknowledged push at the new primary), %zu drills: "
      "p50 %.2f ms, max %.2f ms\n",
      drills.size(), p50, max);
  return 0;
}

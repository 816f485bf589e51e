// The fault matrix of replicated shards (issue 17; docs/ps.md, "The fault
// matrix"): kill -9 (TEST_Kill: from that instant the server forwards,
// applies and acknowledges nothing, then its connections close) of a
// primary at a random point during pushes and during checkpoints, of a
// backup, of both (then the checkpoint path: restore and resume), a primary
// cut off from its backup but alive (fake's DropConnection), and workers
// killed, stopped and added while replication is on. Servers are in-process
// (the decider is the embedded one); each cell is seeded.
//
// After each cell a counting table shows that the state equals the sum of
// every acknowledged push (a push applied twice, or lost, shows as a wrong
// count), and every call returned within its deadline.
//
// The table: 8 rows of 2 floats over 2 servers (rows 0-3 on server 0, 4-7
// on server 1), SGD with lr 1. A worker's "push" is two calls: a range push
// of -1 over all 8 rows (every row counts every push), then a row push of -1
// on rows w and 4 + w (row w and 4 + w count worker w's pushes once more).
// So row r (and 4 + r) holds T + P[r], T the sum of all P.
//
// Seeds: RDMAPS_FAULT_SEEDS ("1,2,7" or "10-40"; default "1,2"); each cell
// prints one "FAULT-MATRIX ..." line, which scripts/fault-soak.sh collects.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/failover.h"
#include "rdmaps/server.h"
#include "src/ps/replication.h"
#include "src/ps/test_hooks.h"
#include "tests/ps/eventually.h"
#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"
#include "transport/fake/fake_transport.h"

namespace rdmaps::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

constexpr std::uint32_t kServers = 2;
constexpr std::uint32_t kSlots = 4;  // worker slots (max_workers in the elastic cells)
constexpr std::uint32_t kTable = 1;
constexpr std::uint32_t kRows = 2 * kSlots;
constexpr std::uint32_t kDim = 2;

// One cell: a backend and a seed.
struct FaultCase {
  PsBackend backend;
  std::uint64_t seed = 1;
};
void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.backend.name << "/" << c.seed; }

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

using rdmaps::testing::Eventually;

// What one worker thread did.
struct WorkerLog {
  std::uint64_t pushes = 0;     // acknowledged (both calls returned OK)
  std::uint64_t in_flight = 0;  // 1 when its last push failed part way (may be applied)
  std::vector<std::uint64_t> at_clock = {0};  // pushes made before its c-th Clock()
  double max_call_ms = 0;
  Status status;
  // Start and completion times of each acknowledged push.
  std::vector<SteadyClock::time_point> begun_at, done_at;
};

struct Job {
  std::string transport;
  std::shared_ptr<FailoverDecider> decider = NewEmbeddedFailoverDecider();
  std::vector<std::unique_ptr<Server>> primaries, backups;
  std::vector<std::string> addresses;
  std::uint32_t num_workers = 2;
  std::uint32_t max_workers = 0;
  std::uint32_t staleness = kAsp;
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  std::string restore;
  milliseconds checkpoint_timeout = seconds(600);
  bool replicated = true;
  milliseconds wait_timeout = seconds(10);

  std::vector<TableOptions> Tables() const {
    return {MakeTable(kTable, "count", kRows, kDim, staleness)};
  }
  ServerOptions Options(std::uint32_t i) const {
    ServerOptions o = MakeServerOptions(transport, i, kServers, num_workers, Tables());
    o.max_workers = max_workers;
    o.exit_when_workers_done = false;
    o.checkpoint_dir = checkpoint_dir;
    o.checkpoint_every = checkpoint_every;
    o.restore = restore;
    o.checkpoint_timeout = checkpoint_timeout;
    if (replicated) {
      o.replicas = 2;
      o.failover = decider;
    }
    return o;
  }
  // Per shard a backup, then its primary.
  void Start() {
    for (std::uint32_t i = 0; i < kServers; ++i) {
      std::unique_ptr<Server> backup;
      ServerOptions p = Options(i);
      if (replicated) {
        ServerOptions b = Options(i);
        b.replica_role = ReplicaRole::kBackup;
        auto s = Server::Start(b);
        ASSERT_TRUE(s.ok()) << s.status();
        backup = std::move(s).value();
        p.backup_address = backup->address();
      }
      auto s = Server::Start(p);
      ASSERT_TRUE(s.ok()) << s.status();
      addresses.push_back((*s)->address());
      backups.push_back(std::move(backup));
      primaries.push_back(std::move(s).value());
    }
  }
  ClientOptions ClientOpts(std::uint32_t w) const {
    ClientOptions o = MakeClientOptions(transport, w, num_workers, addresses);
    o.max_workers = max_workers;
    if (replicated) o.failover = decider;
    o.wait_timeout = wait_timeout;
    return o;
  }
  Result<std::unique_ptr<Client>> Connect(std::uint32_t w) const {
    return Client::Connect(ClientOpts(w));
  }
  // The server that serves shard i now (the shard map's primary).
  Server* Serving(std::uint32_t i) const {
    if (!replicated) return primaries[i].get();
    auto a = decider->Current(i);
    if (!a.ok()) return nullptr;
    if (backups[i] && a->primary == backups[i]->address()) return backups[i].get();
    return primaries[i].get();
  }
};

// One worker's loop: `iters` pushes, Clock() every `clock_every`, Flush
// every 16; `before(it)` runs before each (a stop, a kill: false ends the
// loop without Flush).
template <typename Before>
void RunWorker(Client& cl, int iters, int clock_every, WorkerLog* log, Before before,
               bool close = false) {
  const std::uint32_t w = cl.worker_id();
  const std::vector<float> all(kRows * kDim, -1.0f);
  const std::vector<std::uint64_t> mine = {w, kSlots + w};
  const std::vector<float> two(2 * kDim, -1.0f);
  auto timed = [&](auto&& call) {
    const auto t0 = SteadyClock::now();
    Status st = call();
    log->max_call_ms = std::max(log->max_call_ms, Ms(SteadyClock::now() - t0));
    return st;
  };
  for (int it = 0; it < iters; ++it) {
    if (!before(it)) return;
    log->in_flight = 1;
    const auto begun = SteadyClock::now();
    log->status = timed([&] { return cl.Push(kTable, RowRange{0, kRows}, all); });
    if (log->status.ok()) log->status = timed([&] { return cl.Push(kTable, mine, two); });
    if (!log->status.ok()) return;
    log->in_flight = 0;
    ++log->pushes;
    log->begun_at.push_back(begun);
    log->done_at.push_back(SteadyClock::now());
    if (it % clock_every == clock_every - 1) {
      log->status = timed([&] { return cl.Clock().status(); });
      if (!log->status.ok()) return;
      log->at_clock.push_back(log->pushes);
    }
    if (it % 16 == 15) {
      log->status = timed([&] { return cl.Flush(); });
      if (!log->status.ok()) return;
    }
  }
  log->status = timed([&] { return cl.Flush(); });
  // A member that is done leaves (elastic: the others then no longer wait
  // for it).
  if (log->status.ok() && close) log->status = timed([&] { return cl.Close(); });
}

// The counting table through `reader` (a Pull of a live client, which
// reads the shards' current primaries), against the logs: row r and
// kSlots + r hold T + P[r]; a worker whose last push failed part way may
// have had it applied (at most once).
void CheckCounts(const std::vector<float>& rows, const std::vector<WorkerLog>& logs,
                 const std::string& what) {
  ASSERT_EQ(rows.size(), std::size_t{kRows} * kDim);
  std::uint64_t total = 0, slack = 0;
  for (const WorkerLog& l : logs) {
    total += l.pushes;
    slack += l.in_flight;
  }
  for (std::uint32_t r = 0; r < kRows; ++r) {
    const std::uint32_t w = r % kSlots;
    const std::uint64_t lo = total + (w < logs.size() ? logs[w].pushes : 0);
    const std::uint64_t hi = lo + slack + (w < logs.size() ? logs[w].in_flight : 0);
    for (std::uint32_t d = 0; d < kDim; ++d) {
      const float v = rows[r * kDim + d];
      EXPECT_TRUE(v >= float(lo) && v <= float(hi))
          << what << ": row " << r << " is " << v << ", the acknowledged pushes make " << lo
          << (hi > lo ? " (up to " + std::to_string(hi) + " with pushes in flight)" : "")
          << (v > float(hi) ? ": a push applied twice" : ": an acknowledged push lost");
    }
  }
}

void ExpectCounts(Client& reader, const std::vector<WorkerLog>& logs, const std::string& what) {
  std::vector<float> rows(kRows * kDim);
  const Status st = reader.Pull(kTable, RowRange{0, kRows}, rows);
  ASSERT_TRUE(st.ok()) << what << ": " << st;
  CheckCounts(rows, logs, what);
}

// The same, read from the servers that serve each shard now.
void ExpectCounts(const Job& job, const std::vector<WorkerLog>& logs, const std::string& what) {
  std::vector<float> rows, part;
  for (std::uint32_t i = 0; i < kServers; ++i) {
    Server* s = job.Serving(i);
    ASSERT_NE(s, nullptr);
    ASSERT_TRUE(s->ReadLocal(kTable, RowRange{i * kSlots, kSlots}, &part).ok());
    rows.insert(rows.end(), part.begin(), part.end());
  }
  CheckCounts(rows, logs, what);
}

// The failover time: from `kill` to the first acknowledged push begun
// after it (every push reaches both shards, so it was acknowledged by the
// new primary); -1: none (the workers were done before the kill).
double FailoverMs(const std::vector<WorkerLog>& logs, SteadyClock::time_point kill) {
  double best = -1;
  for (const WorkerLog& l : logs) {
    for (std::size_t i = 0; i < l.begun_at.size(); ++i) {
      if (l.begun_at[i] > kill) {
        const double ms = Ms(l.done_at[i] - kill);
        if (best < 0 || ms < best) best = ms;
        break;
      }
    }
  }
  return best;
}

double MaxCallMs(const std::vector<WorkerLog>& logs) {
  double m = 0;
  for (const WorkerLog& l : logs) m = std::max(m, l.max_call_ms);
  return m;
}

void Report(const std::string& cell, const std::string& transport, std::uint64_t seed,
            const std::string& detail) {
  std::printf("FAULT-MATRIX cell=%s transport=%s seed=%llu %s\n", cell.c_str(), transport.c_str(),
              static_cast<unsigned long long>(seed), detail.c_str());
  std::fflush(stdout);
}

std::vector<std::uint64_t> FaultSeeds() {
  const char* env = std::getenv("RDMAPS_FAULT_SEEDS");
  std::string s = env && *env ? env : "1,2";
  std::vector<std::uint64_t> seeds;
  std::size_t pos = 0;
  while (pos < s.size()) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(pos, end - pos);
    const std::size_t dash = item.find('-');
    char* stop = nullptr;
    if (dash == std::string::npos) {
      seeds.push_back(std::strtoull(item.c_str(), &stop, 10));
    } else {
      const std::uint64_t lo = std::strtoull(item.substr(0, dash).c_str(), &stop, 10);
      const std::uint64_t hi = std::strtoull(item.substr(dash + 1).c_str(), &stop, 10);
      for (std::uint64_t x = lo; x <= hi && seeds.size() < 100000; ++x) seeds.push_back(x);
    }
    pos = end + 1;
  }
  if (seeds.empty()) seeds.push_back(1);
  return seeds;
}

std::vector<FaultCase> FaultCases(const std::vector<PsBackend>& backends) {
  std::vector<FaultCase> v;
  for (const PsBackend& b : backends) {
    for (std::uint64_t s : FaultSeeds()) v.push_back({b, s});
  }
  return v;
}

std::string FaultCaseName(const ::testing::TestParamInfo<FaultCase>& info) {
  return info.param.backend.name + "_seed" + std::to_string(info.param.seed);
}

class FaultMatrixTest : public ::testing::TestWithParam<FaultCase> {
 protected:
  void SetUp() override {
    if (const std::string why = SkipReason(GetParam().backend); !why.empty()) GTEST_SKIP() << why;
    rng_.seed(static_cast<std::uint32_t>(GetParam().seed * 7919 + 17));
    job_.transport = GetParam().backend.transport;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::uint64_t Uniform(std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng_);
  }
  std::string TempDir() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = (std::filesystem::temp_directory_path() /
            ("rdmaps-fault-" + std::to_string(::getpid()) + "-" + name))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    return dir_;
  }
  // Waits until `victim` applied `n` slots (false: the run ended first).
  bool AwaitApplied(Server& victim, std::uint64_t n, const std::atomic<int>& running) {
    return Eventually([&] { return victim.stats().pushes_applied >= n || running.load() == 0; }) &&
           victim.stats().pushes_applied >= n;
  }

  std::mt19937 rng_;
  Job job_;
  std::string dir_;
};

// A primary killed at a random point of a run of pushes (2 workers, both
// shards): every call succeeds, failing over, and the table is exact.
TEST_P(FaultMatrixTest, KillPrimaryDuringPushes) {
  const std::uint64_t seed = GetParam().seed;
  job_.Start();
  ASSERT_FALSE(HasFatalFailure());
  constexpr int kIters = 80;
  const std::uint32_t victim = static_cast<std::uint32_t>(Uniform(0, kServers - 1));
  // Each push is 2 slots per server; Clocks and Flushes add a few.
  const std::uint64_t kill_after = Uniform(0, 2 * 2 * kIters);
  std::vector<std::unique_ptr<Client>> clients;
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = job_.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(c).value());
  }
  std::vector<WorkerLog> logs(2);
  std::atomic<int> running{2};
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      RunWorker(*clients[w], kIters, 8, &logs[w], [](int) { return true; });
      --running;
    });
  }
  AwaitApplied(*job_.primaries[victim], kill_after, running);
  const auto kill = SteadyClock::now();
  internal::TEST_Kill(*job_.primaries[victim]);
  for (auto& t : threads) t.join();
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(logs[w].status.ok()) << "worker " << w << ": " << logs[w].status;
    EXPECT_LT(logs[w].max_call_ms, Ms(job_.wait_timeout)) << "worker " << w;
  }
  ExpectCounts(*clients[0], logs, "after the kill");
  auto a = job_.decider->Current(victim);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->epoch, 2u);
  EXPECT_EQ(a->primary, job_.backups[victim]->address());
  Report("kill_primary", job_.transport, seed,
         "kill_after=" + std::to_string(kill_after) +
             " failover_ms=" + std::to_string(FailoverMs(logs, kill)) +
             " max_call_ms=" + std::to_string(MaxCallMs(logs)));
}

// A backup killed at a random point: its primary goes on alone (epoch 2,
// one copy), no worker fails over, the table is exact.
TEST_P(FaultMatrixTest, KillBackup) {
  const std::uint64_t seed = GetParam().seed;
  job_.Start();
  ASSERT_FALSE(HasFatalFailure());
  constexpr int kIters = 60;
  const std::uint32_t victim = static_cast<std::uint32_t>(Uniform(0, kServers - 1));
  const std::uint64_t kill_after = Uniform(0, 2 * 2 * kIters);
  std::vector<std::unique_ptr<Client>> clients;
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = job_.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(c).value());
  }
  std::vector<WorkerLog> logs(2);
  std::atomic<int> running{2};
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      RunWorker(*clients[w], kIters, 8, &logs[w], [](int) { return true; });
      --running;
    });
  }
  AwaitApplied(*job_.backups[victim], kill_after, running);
  internal::TEST_Kill(*job_.backups[victim]);
  for (auto& t : threads) t.join();
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(logs[w].status.ok()) << "worker " << w << ": " << logs[w].status;
    EXPECT_LT(logs[w].max_call_ms, Ms(job_.wait_timeout)) << "worker " << w;
  }
  // One more push: the primary must notice the lost backup by now.
  WorkerLog extra;
  RunWorker(*clients[0], 1, 1, &extra, [](int) { return true; });
  ASSERT_TRUE(extra.status.ok()) << extra.status;
  logs[0].pushes += extra.pushes;
  ExpectCounts(*clients[1], logs, "after the backup's kill");
  auto a = job_.decider->Current(victim);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->epoch, 2u);
  EXPECT_EQ(a->primary, job_.primaries[victim]->address()) << "the primary must go on";
  EXPECT_TRUE(a->backup.empty());
  EXPECT_EQ(clients[0]->stats().failovers + clients[1]->stats().failovers, 0u);
  Report("kill_backup", job_.transport, seed,
         "kill_after=" + std::to_string(kill_after) +
             " max_call_ms=" + std::to_string(MaxCallMs(logs)));
}

// A primary killed at a random point while checkpoints are taken every 2
// clocks (primaries and backups given the same checkpoint_dir, as
// rdmaps-server would be): the pushes fail over and the table is exact;
// the newest complete checkpoint, restored into a fresh unreplicated job,
// holds exactly the pushes made before its clock.
TEST_P(FaultMatrixTest, KillPrimaryDuringCheckpoints) {
  const std::uint64_t seed = GetParam().seed;
  job_.checkpoint_dir = TempDir();
  job_.checkpoint_every = 2;
  // No cut may wait across the failover: checkpoint_timeout stays at its
  // 600 s, so a cut held there (the backup that passed cuts once per batch
  // of log records, docs/ps.md "The fault matrix") fails the workers' calls
  // at their 10 s wait_timeout.
  job_.Start();
  ASSERT_FALSE(HasFatalFailure());
  constexpr int kIters = 48;
  const std::uint32_t victim = static_cast<std::uint32_t>(Uniform(0, kServers - 1));
  const std::uint64_t kill_after = Uniform(0, 2 * 2 * kIters);
  std::vector<std::unique_ptr<Client>> clients;
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = job_.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(c).value());
  }
  std::vector<WorkerLog> logs(2);
  std::atomic<int> running{2};
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      RunWorker(*clients[w], kIters, 2, &logs[w], [](int) { return true; });
      --running;
    });
  }
  AwaitApplied(*job_.primaries[victim], kill_after, running);
  const auto kill = SteadyClock::now();
  internal::TEST_Kill(*job_.primaries[victim]);
  for (auto& t : threads) t.join();
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(logs[w].status.ok()) << "worker " << w << ": " << logs[w].status;
    EXPECT_LT(logs[w].max_call_ms, Ms(job_.wait_timeout)) << "worker " << w;
  }
  ExpectCounts(*clients[0], logs, "after the kill");
  clients.clear();
  for (auto& s : job_.primaries) s->Stop();
  for (auto& s : job_.backups) s->Stop();

  // The checkpoint path from whatever is complete on disk.
  Job restored;
  restored.transport = job_.transport;
  restored.replicated = false;
  restored.checkpoint_dir = job_.checkpoint_dir;
  restored.restore = "latest";
  restored.Start();
  ASSERT_FALSE(HasFatalFailure());
  auto reader = restored.Connect(0);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const std::uint64_t c = (*reader)->clock();
  std::vector<WorkerLog> at(2);
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_LT(c, logs[w].at_clock.size())
        << "a checkpoint at clock " << c << " that worker " << w << " never reached";
    at[w].pushes = logs[w].at_clock[c];
  }
  ExpectCounts(**reader, at, "checkpoint at clock " + std::to_string(c));
  Report("kill_primary_checkpoint", job_.transport, seed,
         "kill_after=" + std::to_string(kill_after) + " checkpoint_clock=" + std::to_string(c) +
             " failover_ms=" + std::to_string(FailoverMs(logs, kill)));
}

// Both copies of a shard killed at a random point: the workers' calls fail
// (Unavailable or TimedOut) within their deadline, never hang; the job then
// takes the checkpoint path: restarted (replicated again) from the newest
// complete checkpoint, it holds exactly the pushes made before its clock,
// and new workers resume from there with an exact table.
TEST_P(FaultMatrixTest, KillBothThenRestoreAndResume) {
  const std::uint64_t seed = GetParam().seed;
  job_.checkpoint_dir = TempDir();
  job_.checkpoint_every = 2;
  job_.wait_timeout = seconds(3);
  job_.Start();
  ASSERT_FALSE(HasFatalFailure());
  constexpr int kIters = 400;  // the kill comes first
  const std::uint32_t victim = static_cast<std::uint32_t>(Uniform(0, kServers - 1));
  const std::uint64_t kill_after = Uniform(20, 160);
  std::vector<std::unique_ptr<Client>> clients;
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = job_.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(c).value());
  }
  std::vector<WorkerLog> logs(2);
  std::atomic<int> running{2};
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      RunWorker(*clients[w], kIters, 2, &logs[w], [](int) { return true; });
      --running;
    });
  }
  const bool reached = AwaitApplied(*job_.primaries[victim], kill_after, running);
  const auto kill = SteadyClock::now();
  internal::TEST_Kill(*job_.primaries[victim]);
  internal::TEST_Kill(*job_.backups[victim]);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(reached) << "the workers stopped before the kill point: " << logs[0].status << "; "
                       << logs[1].status;
  const double failed_after = Ms(SteadyClock::now() - kill);
  for (std::uint32_t w = 0; w < 2; ++w) {
    EXPECT_FALSE(logs[w].status.ok())
        << "worker " << w << " went on with no copy of shard " << victim;
    // One call's deadline (and the failover's wait inside it), plus slack
    // for a loaded machine.
    EXPECT_LT(logs[w].max_call_ms, 2 * Ms(job_.wait_timeout) + 2000) << "worker " << w;
  }
  clients.clear();
  for (auto& s : job_.primaries) s->Stop();
  for (auto& s : job_.backups) s->Stop();

  Job again;
  again.transport = job_.transport;
  again.checkpoint_dir = job_.checkpoint_dir;
  again.checkpoint_every = 2;
  again.restore = "latest";
  again.Start();
  ASSERT_FALSE(HasFatalFailure());
  std::vector<std::unique_ptr<Client>> resumed;
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = again.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    resumed.push_back(std::move(c).value());
  }
  const std::uint64_t c = resumed[0]->clock();
  EXPECT_EQ(resumed[1]->clock(), c);
  std::vector<WorkerLog> after(2);
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_LT(c, logs[w].at_clock.size());
    after[w].pushes = logs[w].at_clock[c];
  }
  ExpectCounts(*resumed[0], after, "restored at clock " + std::to_string(c));
  std::vector<std::thread> more;
  std::vector<WorkerLog> extra(2);
  for (std::uint32_t w = 0; w < 2; ++w) {
    more.emplace_back(
        [&, w] { RunWorker(*resumed[w], 20, 2, &extra[w], [](int) { return true; }); });
  }
  for (auto& t : more) t.join();
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(extra[w].status.ok()) << "worker " << w << ": " << extra[w].status;
    after[w].pushes += extra[w].pushes;
  }
  ExpectCounts(*resumed[0], after, "resumed");
  Report("kill_both_restore", job_.transport, seed,
         "kill_after=" + std::to_string(kill_after) + " restored_clock=" + std::to_string(c) +
             " workers_failed_ms=" + std::to_string(failed_after));
}

// Workers killed, stopped and added while replication is on (elastic, 4
// slots, SSP 1): worker 2 joins at a random point, worker 3 joins and is
// killed (TEST_Abandon) at a random point, worker 1 stops calling for a
// while (shorter than the others' deadline) around the kill of a primary,
// then resumes and must fail over itself. Every surviving call succeeds and
// the table is exact (the killed worker's last push at most once).
TEST_P(FaultMatrixTest, WorkersKilledStoppedAddedWithReplication) {
  const std::uint64_t seed = GetParam().seed;
  job_.max_workers = kSlots;
  job_.staleness = 1;
  job_.Start();
  ASSERT_FALSE(HasFatalFailure());
  constexpr int kIters = 40;
  const std::uint32_t victim = static_cast<std::uint32_t>(Uniform(0, kServers - 1));
  const int join2_at = static_cast<int>(Uniform(0, 20));
  const int join3_at = static_cast<int>(Uniform(0, 10));
  const int die3_at = static_cast<int>(Uniform(1, 15));
  const int stop1_at = static_cast<int>(Uniform(5, 25));
  const std::uint64_t stop_ms = Uniform(50, 400);
  std::vector<std::unique_ptr<Client>> clients(kSlots);
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = job_.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    clients[w] = std::move(c).value();
  }
  std::vector<WorkerLog> logs(kSlots);
  std::atomic<int> progress0{0};  // worker 0's iterations: the joiners' cue
  std::atomic<bool> stopped{false}, killed{false}, rejoined{false};
  std::atomic<int> running{4};
  SteadyClock::time_point kill{};
  std::array<std::thread, 4> threads;
  threads[0] = std::thread([&] {
    RunWorker(
        *clients[0], kIters, 1, &logs[0],
        [&](int it) {
          progress0.store(it);
          return true;
        },
        true);
    progress0.store(kIters);
    --running;
  });
  threads[1] = std::thread([&] {
    RunWorker(
        *clients[1], kIters, 1, &logs[1],
        [&](int it) {
          if (it == stop1_at) {
            // "SIGSTOP": no call for a while; the primary dies meanwhile.
            stopped.store(true);
            Eventually([&] { return killed.load(); }, seconds(1));
            std::this_thread::sleep_for(milliseconds(stop_ms));
          }
          return true;
        },
        true);
    --running;
  });
  auto joiner = [&](std::uint32_t w, int join_at, int die_at) {
    Eventually([&] { return progress0.load() >= join_at; });
    // A Connect does not fail over: one that meets a primary's death fails
    // (at its connect_timeout) and is tried again, as a launcher would.
    ClientOptions o = job_.ClientOpts(w);
    o.connect_timeout = seconds(3);
    Result<std::unique_ptr<Client>> c = Client::Connect(o);
    for (int attempt = 1; !c.ok() && attempt < 5; ++attempt) c = Client::Connect(o);
    if (!c.ok()) {
      logs[w].status = c.status();
      --running;
      return;
    }
    clients[w] = std::move(c).value();
    logs[w].at_clock.clear();
    RunWorker(
        *clients[w], kIters, 1, &logs[w],
        [&](int it) {
          if (it == die_at) {
            internal::TEST_Abandon(*clients[w]);  // kill -9 of the worker
            return false;
          }
          return true;
        },
        true);
    if (die_at >= 0 && logs[w].status.ok()) {
      // A fresh worker in the dead one's slot, once the servers serving
      // now saw it leave (before or after the primary's kill: the backup
      // must have reset the slot as the primary did, or it refuses the new
      // worker's pushes and loses them at the failover).
      Eventually([&] {
        for (std::uint32_t i = 0; i < kServers; ++i) {
          Server* s = job_.Serving(i);
          if (s == nullptr) return false;
          const auto dead = s->stats().dead_workers;
          if (std::find(dead.begin(), dead.end(), w) == dead.end()) return false;
        }
        return true;
      });
      Result<std::unique_ptr<Client>> again = Client::Connect(o);
      for (int attempt = 1; !again.ok() && attempt < 5; ++attempt) again = Client::Connect(o);
      if (!again.ok()) {
        logs[w].status = again.status();
      } else {
        clients[w] = std::move(again).value();
        rejoined.store(true);
        RunWorker(
            *clients[w], kIters / 2, 1, &logs[w], [](int) { return true; }, true);
      }
    }
    --running;
  };
  threads[2] = std::thread([&] { joiner(2, join2_at, -1); });
  threads[3] = std::thread([&] { joiner(3, join3_at, die3_at); });
  // The primary dies once worker 1 stopped and worker 3's death reached
  // the victim's backup: a worker that dies while its primary dies is
  // never seen to leave by the promoted backup (a known gap, docs/ps.md).
  Eventually([&] { return stopped.load() || running.load() == 0; });
  Eventually(
      [&] {
        const auto dead = job_.backups[victim]->stats().dead_workers;
        return std::find(dead.begin(), dead.end(), 3u) != dead.end() || running.load() == 0;
      },
      seconds(15));
  kill = SteadyClock::now();
  internal::TEST_Kill(*job_.primaries[victim]);
  killed.store(true);
  for (auto& t : threads) t.join();
  for (std::uint32_t w = 0; w < kSlots; ++w) {
    ASSERT_TRUE(logs[w].status.ok()) << "worker " << w << ": " << logs[w].status;
    EXPECT_LT(logs[w].max_call_ms, Ms(job_.wait_timeout)) << "worker " << w;
  }
  ASSERT_TRUE(rejoined.load());
  ExpectCounts(job_, logs, "after the kills");
  EXPECT_EQ(logs[3].pushes, std::uint64_t(die3_at + kIters / 2))
      << "slot 3's acknowledged pushes (the dead worker's, then the fresh one's)";
  Report("workers_with_replication", job_.transport, seed,
         "join2_at=" + std::to_string(join2_at) + " die3_at=" + std::to_string(die3_at) +
             " stop1_at=" + std::to_string(stop1_at) + " stop_ms=" + std::to_string(stop_ms) +
             " failover_ms=" + std::to_string(FailoverMs(logs, kill)) +
             " max_call_ms=" + std::to_string(MaxCallMs(logs)));
}

// A primary cut off from its backup but alive (fake's DropConnection on
// the primary-backup link) at a random point while 2 workers push: exactly
// one of the two goes on; the other never acknowledges again (its applied
// count and its rows stay as they were through the rest of the run); the
// table is exact.
TEST_P(FaultMatrixTest, PrimaryCutOffFromBackup) {
  if (job_.transport != "fake") GTEST_SKIP() << "needs the fake backend's DropConnection";
  const std::uint64_t seed = GetParam().seed;
  job_.Start();
  ASSERT_FALSE(HasFatalFailure());
  constexpr int kIters = 80;
  const std::uint32_t victim = static_cast<std::uint32_t>(Uniform(0, kServers - 1));
  const std::uint64_t cut_after = Uniform(0, 2 * 2 * kIters / 2);
  std::vector<std::unique_ptr<Client>> clients;
  for (std::uint32_t w = 0; w < 2; ++w) {
    auto c = job_.Connect(w);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(c).value());
  }
  std::vector<WorkerLog> logs(2);
  std::atomic<int> running{2};
  std::atomic<bool> decided{false};
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      // Half the run before the decision, half after it.
      RunWorker(*clients[w], kIters, 8, &logs[w], [&](int it) {
        if (it == kIters / 2) Eventually([&] { return decided.load(); });
        return true;
      });
      --running;
    });
  }
  AwaitApplied(*job_.primaries[victim], cut_after, running);
  // (Checked after the workers are joined: they wait for `decided`.)
  std::string trouble;
  bool backup_won = false;
  std::uint64_t loser_applied = 0;
  std::vector<float> loser_rows;
  Server* loser = nullptr;
  [&] {
    const Status dropped =
        transport::fake::DropConnection(*internal::TEST_ServerEndpoint(*job_.primaries[victim]),
                                        internal::kBackupPeerBase + victim);
    if (!dropped.ok()) return void(trouble = "DropConnection: " + dropped.ToString());
    // The decision comes at the primary's next forward or its backup's
    // disconnect notice.
    if (!Eventually([&] {
          auto a = job_.decider->Current(victim);
          return a.ok() && a->epoch == 2;
        })) {
      return void(trouble = "no decision after the cut");
    }
    backup_won = job_.decider->Current(victim)->primary == job_.backups[victim]->address();
    loser = backup_won ? job_.primaries[victim].get() : job_.backups[victim].get();
    // The loser may finish the slot it was forwarding when the link went:
    // never acknowledged (a primary applies only after the forward completed).
    Eventually([&] {
      const auto before = loser->stats().pushes_applied;
      std::this_thread::sleep_for(milliseconds(20));
      return loser->stats().pushes_applied == before;
    });
    loser_applied = loser->stats().pushes_applied;
    if (!loser->ReadLocal(kTable, RowRange{victim * kSlots, kSlots}, &loser_rows).ok()) {
      trouble = "ReadLocal of the loser failed";
    }
  }();
  decided.store(true);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(trouble.empty()) << trouble;
  for (std::uint32_t w = 0; w < 2; ++w) {
    ASSERT_TRUE(logs[w].status.ok()) << "worker " << w << ": " << logs[w].status;
  }
  ExpectCounts(*clients[0], logs, "after the cut");
  EXPECT_EQ(loser->stats().pushes_applied, loser_applied) << "the fenced one applied again";
  std::vector<float> now;
  ASSERT_TRUE(loser->ReadLocal(kTable, RowRange{victim * kSlots, kSlots}, &now).ok());
  EXPECT_EQ(now, loser_rows) << "the fenced one's rows changed";
  Report(
      "primary_cut_off", job_.transport, seed,
      "cut_after=" + std::to_string(cut_after) + " winner=" + (backup_won ? "backup" : "primary"));
}

#ifdef RDMAPS_FAULT_MATRIX_VERBS
INSTANTIATE_TEST_SUITE_P(Verbs, FaultMatrixTest, ::testing::ValuesIn(FaultCases({VerbsBackend()})),
                         FaultCaseName);
#else
INSTANTIATE_TEST_SUITE_P(Backends, FaultMatrixTest,
                         ::testing::ValuesIn(FaultCases({FakeBackend(), TcpBackend()})),
                         FaultCaseName);
#endif

}  // namespace
}  // namespace rdmaps::testing

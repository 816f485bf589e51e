// A real cluster on the tcp backend (or verbs: this file also builds
// ps_verbs_test with PS_TEST_VERBS, run inside the Soft-RoCE VM,
// listening on $RDMAPS_TEST_VERBS_ADDR): 2 server processes and 3 worker
// processes (fork), ports picked by the kernel (port 0) and passed back
// through pipes, every wait bounded. The workers train linear regression with
// a known solution under BSP, SSP and ASP and push a counter table whose
// final value proves that no update was lost or applied twice.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <random>
#include <thread>

#include "src/ps/test_hooks.h"
#include "tests/ps/ps_test_util.h"

// Distinct suite names per transport, so ctest names do not collide.
#ifdef PS_TEST_VERBS
#define PS_TEST_TRANSPORT "verbs"
#define PS_CLUSTER_SUITE PsVerbsClusterTest
#define PS_STRESS_SUITE PsVerbsStressTest
#else
#define PS_TEST_TRANSPORT "tcp"
#define PS_CLUSTER_SUITE PsTcpClusterTest
#define PS_STRESS_SUITE PsTcpStressTest
#endif

namespace rdmaps {
namespace {

const char* const kTransport = PS_TEST_TRANSPORT;

// verbs needs an RDMA device's address; elsewhere skip with the reason.
#define PS_SKIP_WITHOUT_TRANSPORT()                                                      \
  do {                                                                                   \
    if (std::string(kTransport) == "verbs" && std::getenv("RDMAPS_TEST_VERBS_ADDR") == nullptr) { \
      GTEST_SKIP() << "RDMAPS_TEST_VERBS_ADDR is not set (no RDMA device; run in the VM)"; \
    }                                                                                    \
  } while (false)

constexpr int kServers = 2, kWorkers = 3, kFeatures = 8, kSamples = 64, kIters = 60;
constexpr int kCounterRows = 5;
constexpr float kLr = 0.2f;
const float kTrueW[kFeatures] = {1.0f, -2.0f, 3.0f, 0.5f, -1.0f, 2.5f, 0.0f, -0.75f};

std::vector<TableOptions> Tables(std::uint32_t staleness) {
  return {testing::MakeTable(1, "w", kFeatures, 1, staleness, Initializer::Zeros(),
                             OptimizerOptions::Sgd(kLr)),
          testing::MakeTable(2, "counter", kCounterRows, 3, staleness)};
}

void Sample(int worker, std::vector<float>* x, std::vector<float>* y) {
  std::mt19937 rng(100 + worker);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int i = 0; i < kSamples; ++i) {
    float t = 0;
    for (int f = 0; f < kFeatures; ++f) {
      x->push_back(nd(rng));
      t += x->back() * kTrueW[f];
    }
    y->push_back(t);
  }
}

std::vector<float> Grad(const std::vector<float>& x, const std::vector<float>& y,
                        const std::vector<float>& w) {
  std::vector<float> g(kFeatures, 0.0f);
  for (int i = 0; i < kSamples; ++i) {
    float err = -y[i];
    for (int f = 0; f < kFeatures; ++f) err += x[i * kFeatures + f] * w[f];
    for (int f = 0; f < kFeatures; ++f) g[f] += err * x[i * kFeatures + f] / (kWorkers * kSamples);
  }
  return g;
}

bool WriteAll(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = write(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// Reads exactly n bytes by the deadline.
bool ReadAll(int fd, void* p, std::size_t n, std::chrono::steady_clock::time_point deadline) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

struct ServerReport {
  std::uint64_t pushes_applied, protocol_errors, dead, clocks;
  int run_ok;
  int counter_rows_wrong;  // counter rows here whose value is not kWorkers * kIters
};

[[noreturn]] void ServerChild(int index, std::uint32_t staleness, int fd) {
  auto o = testing::MakeServerOptions(kTransport, index, kServers, kWorkers, Tables(staleness));
  auto server = Server::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "server %d: %s\n", index, server.status().ToString().c_str());
    _exit(2);
  }
  char addr[64] = {};
  std::snprintf(addr, sizeof(addr), "%s", (*server)->address().c_str());
  if (!WriteAll(fd, addr, sizeof(addr))) _exit(3);
  Status s = (*server)->RunUntil(std::chrono::steady_clock::now() + std::chrono::seconds(60));
  if (!s.ok()) std::fprintf(stderr, "server %d: %s\n", index, s.ToString().c_str());
  const ServerStats st = (*server)->stats();
  ServerReport r{st.pushes_applied, st.protocol_errors, st.dead_workers.size(),
                 st.clocks_applied, s.ok() ? 1 : 0, 0};
  // Rows of the counter table this server owns: [b, e) of the range partition.
  const std::uint64_t base = kCounterRows / kServers, extra = kCounterRows % kServers;
  const std::uint64_t b = index * base + std::min<std::uint64_t>(index, extra);
  const std::uint64_t n = base + (static_cast<std::uint64_t>(index) < extra ? 1 : 0);
  std::vector<float> counter;
  if (!(*server)->ReadLocal(2, RowRange{b, n}, &counter).ok() || counter.size() != n * 3) {
    r.counter_rows_wrong = -1;
  } else {
    for (float v : counter) r.counter_rows_wrong += v != float{kWorkers * kIters};
  }
  (void)WriteAll(fd, &r, sizeof(r));
  (*server)->Stop();
  _exit(s.ok() ? 0 : 4);
}

struct WorkerReport {
  float w[kFeatures];
  std::uint64_t torn_retries, pull_waits, staleness_max;
};

[[noreturn]] void WorkerChild(int worker, std::uint32_t staleness,
                              const std::vector<std::string>& addresses, int fd) {
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "worker %d: %s\n", worker, s.ToString().c_str());
    _exit(2);
  };
  auto client = Client::Connect(testing::MakeClientOptions(kTransport, worker, kWorkers, addresses));
  if (!client.ok()) fail(client.status());
  Client& cl = **client;
  std::vector<float> x, y;
  Sample(worker, &x, &y);
  std::vector<float> w(kFeatures), ones(kCounterRows * 3, -1.0f);
  for (int it = 0; it < kIters; ++it) {
    Status s = cl.Pull(1, RowRange{0, kFeatures}, w);
    if (!s.ok()) fail(s);
    // BSP as synchronous SGD: everyone reads iteration it before anyone pushes.
    if (staleness == kBsp && !(s = cl.Barrier()).ok()) fail(s);
    if (!(s = cl.Push(1, RowRange{0, kFeatures}, Grad(x, y, w))).ok()) fail(s);
    if (!(s = cl.Push(2, RowRange{0, kCounterRows}, ones)).ok()) fail(s);
    auto c = cl.Clock();
    if (!c.ok()) fail(c.status());
  }
  Status s = cl.Barrier();  // everyone's pushes are sent
  if (!s.ok()) fail(s);
  WorkerReport r{};
  std::vector<float> final_w(kFeatures);
  if (!(s = cl.Pull(1, RowRange{0, kFeatures}, final_w)).ok()) fail(s);
  std::memcpy(r.w, final_w.data(), sizeof(r.w));
  r.torn_retries = cl.stats().torn_retries;
  r.pull_waits = cl.stats().pull_waits;
  r.staleness_max = cl.stats().staleness_max;
  if (!(s = cl.Close()).ok()) fail(s);
  if (!WriteAll(fd, &r, sizeof(r))) _exit(3);
  _exit(0);
}

// Waits for every pid by the deadline; kills the rest after it.
std::vector<int> WaitAll(const std::vector<pid_t>& pids,
                         std::chrono::steady_clock::time_point deadline) {
  std::vector<int> status(pids.size(), -1);
  std::size_t left = pids.size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (left > 0) usleep(10000);  // polling a deadline, not synchronising
  }
  for (std::size_t i = 0; i < pids.size(); ++i) {
    if (status[i] == -1) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], nullptr, 0);
    }
  }
  return status;
}

void RunCluster(std::uint32_t staleness, float tolerance) {
  PS_SKIP_WITHOUT_TRANSPORT();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  std::vector<pid_t> pids;
  std::vector<int> server_fds, worker_fds;
  std::vector<std::string> addresses;
  for (int i = 0; i < kServers; ++i) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(p[0]);
      ServerChild(i, staleness, p[1]);
    }
    close(p[1]);
    pids.push_back(pid);
    server_fds.push_back(p[0]);
    char addr[64];
    ASSERT_TRUE(ReadAll(p[0], addr, sizeof(addr), deadline)) << "server " << i << " did not start";
    addresses.emplace_back(addr);
  }
  for (int w = 0; w < kWorkers; ++w) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(p[0]);
      WorkerChild(w, staleness, addresses, p[1]);
    }
    close(p[1]);
    pids.push_back(pid);
    worker_fds.push_back(p[0]);
  }
  std::vector<WorkerReport> wr(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(ReadAll(worker_fds[w], &wr[w], sizeof(wr[w]), deadline)) << "worker " << w;
  }
  std::vector<ServerReport> sr(kServers);
  for (int i = 0; i < kServers; ++i) {
    EXPECT_TRUE(ReadAll(server_fds[i], &sr[i], sizeof(sr[i]), deadline)) << "server " << i;
  }
  const auto codes = WaitAll(pids, deadline);
  for (std::size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i;
  for (int fd : server_fds) close(fd);
  for (int fd : worker_fds) close(fd);

  // Sum check: every push applied exactly once. Each worker sent, per
  // iteration, one w push and one counter push to each server, one clock
  // marker per server, and one goodbye.
  for (int i = 0; i < kServers; ++i) {
    EXPECT_EQ(sr[i].pushes_applied, std::uint64_t{kWorkers} * kIters * 2) << "server " << i;
    EXPECT_EQ(sr[i].clocks, std::uint64_t{kWorkers} * kIters) << "server " << i;
    EXPECT_EQ(sr[i].protocol_errors, 0u);
    EXPECT_EQ(sr[i].dead, 0u);
    EXPECT_EQ(sr[i].run_ok, 1);
    EXPECT_EQ(sr[i].counter_rows_wrong, 0) << "server " << i << ": a counter push was lost";
  }
  // Convergence to the known solution.
  for (int w = 0; w < kWorkers; ++w) {
    for (int f = 0; f < kFeatures; ++f) {
      EXPECT_NEAR(wr[w].w[f], kTrueW[f], tolerance) << "worker " << w << " feature " << f;
    }
    if (staleness != kAsp) {
      EXPECT_LE(wr[w].staleness_max, staleness);
    }
  }
}

TEST(PS_CLUSTER_SUITE, LinearRegressionBsp) { RunCluster(kBsp, 0.05f); }
TEST(PS_CLUSTER_SUITE, LinearRegressionSsp) { RunCluster(2, 0.05f); }
TEST(PS_CLUSTER_SUITE, LinearRegressionAsp) { RunCluster(kAsp, 0.05f); }

// Last in the file on purpose: on verbs, a process that has used libibverbs
// cannot fork children that use it too, so the fork()ing cluster tests run
// first when the whole binary runs (ctest runs each test in its own process).
//
// A writer thread rewrites rows (every float of a row holds the same value,
// so any tear is visible) while a client pulls them over tcp. No pull may
// return a torn row; the retries it needed are counted and printed.
// zero_copy: the pull destination is registered, so torn rows land in the
// caller's buffer and are re-read in place.
// Inline rows land zero-copy by scattered READs, which carry 8 rows on verbs
// (16 SGEs): those pulls are 8 rows.
// small_rows: 64 rows of 256 bytes, checked in blocks of 8, pulled as rows
// [3, 61): the blocks at either end are wanted only in part (and staged).
void RunTornReadStress(bool zero_copy, RowLayout layout = RowLayout::kDense,
                       bool small_rows = false) {
  const std::uint32_t kDim = small_rows ? 64 : 1024;
  const std::uint32_t kTableRows = small_rows                                  ? 64
                                   : zero_copy && layout == RowLayout::kInline ? 8
                                                                               : 16;
  const RowRange range = small_rows ? RowRange{3, 58} : RowRange{0, kTableRows};
  const auto kRowsN = static_cast<std::uint32_t>(range.count);
  TableOptions table =
      testing::MakeTable(1, "big", kTableRows, kDim, kAsp, Initializer::Constant(0.0f));
  table.layout = layout;
  auto c = testing::StartCluster(kTransport, 1, 1, {table});
  ASSERT_EQ(c.clients.size(), 1u);
  // The writer does a bounded amount of work (a writer that never stops can
  // starve an optimistic reader of one row; the apply thread writes a row
  // once per push). The reader pulls until the writer is done.
  std::atomic<bool> writer_done{false};
  std::thread writer([&] {
    for (int round = 1; round <= 2000; ++round) {
      for (std::uint64_t r = 0; r < kTableRows; ++r) {
        ASSERT_TRUE(internal::TEST_SetRow(*c.servers[0], 1, r, static_cast<float>(round)).ok());
      }
    }
    writer_done.store(true);
  });
  std::vector<float> out(kRowsN * kDim);
  if (zero_copy) {
    ASSERT_TRUE(c.clients[0]->RegisterBuffer(out).ok());
  }
  std::uint64_t torn_rows = 0;
  int pulls = 0;
  for (; pulls < 100 || !writer_done.load(); ++pulls) {
    Status s = c.clients[0]->Pull(1, range, out);
    if (!s.ok()) {
      ADD_FAILURE() << s;
      break;
    }
    for (std::uint32_t r = 0; r < kRowsN; ++r) {
      for (std::uint32_t k = 1; k < kDim; ++k) {
        if (out[r * kDim + k] != out[r * kDim]) {
          ++torn_rows;
          break;
        }
      }
    }
  }
  writer.join();
  EXPECT_EQ(torn_rows, 0u);
  const ClientStats st = c.clients[0]->stats();
  if (small_rows) {
    // Partly wanted blocks are staged; the others land in place.
    EXPECT_GT(st.bytes_staged, 0u);
    EXPECT_EQ(st.zero_copy_calls > 0, zero_copy && layout == RowLayout::kDense);
  } else {
    EXPECT_EQ(st.bytes_staged == 0, zero_copy);
  }
  std::printf("torn-read retries over %d pulls of %u rows (%s, %s): %llu\n", pulls, kRowsN,
              RowLayoutName(layout), zero_copy ? "zero-copy" : "staged",
              static_cast<unsigned long long>(st.torn_retries));
}

TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornRows) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/false);
}

TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornRowsInARegisteredBuffer) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/true);
}

TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornInlineRows) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/false, RowLayout::kInline);
}

// Inline rows into a registered buffer: each READ scatters headers to
// staging and rows into the caller's buffer.
TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornInlineRowsInARegisteredBuffer) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/true, RowLayout::kInline);
}

// Rows of 256 bytes, checked 8 to a block; the range wants the blocks at its
// ends in part.
TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornRowsInBlocks) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/false, RowLayout::kDense, /*small_rows=*/true);
}

TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornRowsInBlocksInARegisteredBuffer) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/true, RowLayout::kDense, /*small_rows=*/true);
}

TEST(PS_STRESS_SUITE, ConcurrentRewritesNeverYieldTornInlineRowsInBlocks) {
  PS_SKIP_WITHOUT_TRANSPORT();
  RunTornReadStress(/*zero_copy=*/true, RowLayout::kInline, /*small_rows=*/true);
}

#ifdef PS_TEST_VERBS
// With two RDMA devices (the VM has rxe0 and rxe1), a server listening on the
// second device's address and a worker connecting to it must both pick that
// device from the address (with the first device they would fail to listen
// or to reach it).
TEST(PS_STRESS_SUITE, ServerAndWorkerPickTheDeviceOfTheirAddress) {
  const char* addr2 = std::getenv("RDMAPS_TEST_VERBS_ADDR2");
  if (addr2 == nullptr) GTEST_SKIP() << "RDMAPS_TEST_VERBS_ADDR2 is not set (one RDMA device)";
  auto so = testing::MakeServerOptions(kTransport, 0, 1, 1,
                                       {testing::MakeTable(1, "w", 8, 4, kAsp,
                                                           Initializer::Constant(3.0f))});
  so.listen_address = std::string(addr2) + ":0";
  auto server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = Client::Connect(
      testing::MakeClientOptions(kTransport, 0, 1, {(*server)->address()}));
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> out(8 * 4);
  ASSERT_TRUE((*client)->Pull(1, RowRange{0, 8}, out).ok());
  for (float v : out) EXPECT_EQ(v, 3.0f);
}
#endif

}  // namespace
}  // namespace rdmaps

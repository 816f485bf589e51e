// The multi-process suite (see ps_suite.h): a real cluster of 2 server
// processes and 3 worker processes (fork), ports picked by the kernel (port
// 0) and passed back through pipes, every wait bounded. The workers train
// linear regression with a known solution under BSP, SSP and ASP and push a
// counter table whose final value proves that no update was lost or applied
// twice. Runs on tcp and verbs; the fake backend's endpoints live in one
// process.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/base/fd.h"
#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

constexpr int kServers = 2, kWorkers = 3, kFeatures = 8, kSamples = 64, kIters = 60;
constexpr int kCounterRows = 5;
constexpr float kLr = 0.2f;
const float kTrueW[kFeatures] = {1.0f, -2.0f, 3.0f, 0.5f, -1.0f, 2.5f, 0.0f, -0.75f};

std::vector<TableOptions> Tables(std::uint32_t staleness) {
  return {
      MakeTable(1, "w", kFeatures, 1, staleness, Initializer::Zeros(), OptimizerOptions::Sgd(kLr)),
      MakeTable(2, "counter", kCounterRows, 3, staleness)};
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

[[noreturn]] void ServerChild(const std::string& transport, int index, std::uint32_t staleness,
                              int fd) {
  auto o = MakeServerOptions(transport, index, kServers, kWorkers, Tables(staleness));
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
                 st.clocks_applied, s.ok() ? 1 : 0,     0};
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

[[noreturn]] void WorkerChild(const std::string& transport, int worker, std::uint32_t staleness,
                              const std::vector<std::string>& addresses, int fd) {
  auto fail = [&](const Status& s) {
    std::fprintf(stderr, "worker %d: %s\n", worker, s.ToString().c_str());
    _exit(2);
  };
  auto client = Client::Connect(MakeClientOptions(transport, worker, kWorkers, addresses));
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

// Forks a child that runs `child(write_fd)`, which never returns (it
// _exits), and keeps the read end of the pipe it reports through.
template <typename Child>
Fd ForkReporter(std::vector<pid_t>& pids, Child&& child) {
  int p[2];
  if (pipe(p) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return Fd();
  }
  const pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    close(p[0]);
    close(p[1]);
    return Fd();
  }
  if (pid == 0) {
    close(p[0]);
    child(p[1]);
  }
  close(p[1]);
  pids.push_back(pid);
  return Fd(p[0]);
}

void RunCluster(const std::string& transport, std::uint32_t staleness, float tolerance) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  std::vector<pid_t> pids;
  std::vector<Fd> server_fds, worker_fds;
  std::vector<std::string> addresses;
  for (int i = 0; i < kServers; ++i) {
    server_fds.push_back(
        ForkReporter(pids, [&](int fd) { ServerChild(transport, i, staleness, fd); }));
    ASSERT_TRUE(server_fds.back().valid());
    char addr[64];
    ASSERT_TRUE(ReadAll(server_fds.back().get(), addr, sizeof(addr), deadline))
        << "server " << i << " did not start";
    addresses.emplace_back(addr);
  }
  for (int w = 0; w < kWorkers; ++w) {
    worker_fds.push_back(
        ForkReporter(pids, [&](int fd) { WorkerChild(transport, w, staleness, addresses, fd); }));
    ASSERT_TRUE(worker_fds.back().valid());
  }
  std::vector<WorkerReport> wr(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(ReadAll(worker_fds[w].get(), &wr[w], sizeof(wr[w]), deadline)) << "worker " << w;
  }
  std::vector<ServerReport> sr(kServers);
  for (int i = 0; i < kServers; ++i) {
    EXPECT_TRUE(ReadAll(server_fds[i].get(), &sr[i], sizeof(sr[i]), deadline)) << "server " << i;
  }
  const auto codes = WaitAll(pids, deadline);
  for (std::size_t i = 0; i < codes.size(); ++i) EXPECT_EQ(codes[i], 0) << "process " << i;

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

TEST_P(PsMultiProcessTest, LinearRegressionBsp) { RunCluster(transport(), kBsp, 0.05f); }
TEST_P(PsMultiProcessTest, LinearRegressionSsp) { RunCluster(transport(), 2, 0.05f); }
TEST_P(PsMultiProcessTest, LinearRegressionAsp) { RunCluster(transport(), kAsp, 0.05f); }

}  // namespace
}  // namespace rdmaps::testing

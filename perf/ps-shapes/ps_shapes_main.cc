// ps-shapes: what a user of rdmaps sees for the shapes of issue 15, with the
// server and the worker in separate processes (the public API only), as
// perf/ps_vs_stream.sh runs them against a plain TCP stream:
//
//   ps-shapes --role=server [--transport=tcp] [--host=127.0.0.1]
//       prints "address HOST:PORT" on stdout, serves one worker, exits when
//       it closed.
//   ps-shapes --role=worker --server=HOST:PORT [--only=NAME,...]
//       prints one line per shape: name, payload bytes, bytes moved (both
//       directions), iterations, median and p90 microseconds, and the
//       payload and moved rates in MB/s (10^6 bytes per second).
//
// Every buffer is registered (Client::RegisterBuffer), the tables are ASP
// (pulls never wait for other workers) and SGD, one server and one worker.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "tools/common/flags.h"

DEFINE_string(role, "worker", "server or worker");
DEFINE_string(transport, "tcp", "tcp or verbs");
DEFINE_string(host, "127.0.0.1", "address the server listens on");
DEFINE_string(server, "", "worker: the server's HOST:PORT as it printed it");
DEFINE_string(only, "", "worker: comma-separated shape names to run (default: all)");
DEFINE_double(seconds, 0.4, "worker: time per shape (at least --min_iters iterations)");
DEFINE_int32(min_iters, 5, "worker: fewest iterations per shape");
DEFINE_int32(max_iters, 20000, "worker: most iterations per shape");
DEFINE_uint32(push_slot_bytes, 0, "server: ServerOptions::push_slot_bytes (0: the default)");
DEFINE_uint32(push_slots, 0, "server: ServerOptions::push_slots (0: the default)");
DEFINE_bool(print_stats, false,
            "worker: after each shape, print to stderr the ClientStats it moved (rows pulled "
            "by a pipelined PushPull, torn retries, control READs)");
DEFINE_int32(busy_poll_us, -1, "TransportOptions::busy_poll in microseconds (-1: the default)");

namespace rdmaps {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr std::uint32_t kDense = 0, kTiny = 1, kOneK = 2, kR64 = 3, kR256 = 4, kEmb = 5;
constexpr std::uint64_t kTinyRows = 1000000;

std::vector<TableOptions> Tables() {
  auto table = [](std::uint32_t id, const char* name, std::uint64_t rows, std::uint32_t dim) {
    TableOptions t;
    t.id = id;
    t.name = name;
    t.rows = rows;
    t.dim = dim;
    t.optimizer = OptimizerOptions::Sgd(1e-6f);
    t.staleness = kAsp;
    return t;
  };
  return {table(kDense, "dense4m", 256, 4096), table(kTiny, "tiny", kTinyRows, 1),
          table(kOneK, "one_kib", 1, 256),     table(kR64, "r64", 64, 64),
          table(kR256, "r256", 256, 256),      table(kEmb, "emb", 65536, 64)};
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "ps-shapes: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// The job secret both processes prove: RDMAPS_JOB_SECRET (perf/ps_vs_stream.sh
// exports a random one), else a fixed one, as rdmaps-perf's default token:
// a benchmark on loopback, not a job to protect.
std::string JobSecret() {
  const char* s = std::getenv("RDMAPS_JOB_SECRET");
  return s != nullptr && *s != '\0' ? s : "ps-shapes";
}

int RunServer() {
  ServerOptions so;
  so.transport.transport = FLAGS_transport;
  so.transport.job_token = JobSecret();
  if (FLAGS_busy_poll_us >= 0)
    so.transport.busy_poll = std::chrono::microseconds(FLAGS_busy_poll_us);
  so.listen_address = FLAGS_host + ":0";
  so.tables = Tables();
  if (FLAGS_push_slot_bytes != 0) so.push_slot_bytes = FLAGS_push_slot_bytes;
  if (FLAGS_push_slots != 0) so.push_slots = FLAGS_push_slots;
  auto server = Server::Start(so);
  Check(server.status(), "starting the server");
  std::printf("address %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  Check((*server)->RunUntil(SteadyClock::now() + std::chrono::minutes(10)), "serving");
  return 0;
}

struct Shape {
  std::string name;
  double payload;  // bytes the caller asked for (one direction)
  double moved;    // payload bytes crossing the wire, both directions
  std::function<Status()> op;
};

// Waits until the server applied this worker's pushes.
Status WaitApplied(Client& cl) { return cl.Flush(); }

int RunWorker() {
  if (FLAGS_server.empty()) {
    std::fprintf(stderr, "ps-shapes: --server=HOST:PORT is required with --role=worker\n");
    return 2;
  }
  ClientOptions co;
  co.transport.transport = FLAGS_transport;
  co.transport.job_token = JobSecret();
  if (FLAGS_busy_poll_us >= 0)
    co.transport.busy_poll = std::chrono::microseconds(FLAGS_busy_poll_us);
  co.servers = {FLAGS_server};
  auto client = Client::Connect(co);
  Check(client.status(), "connecting");
  Client& cl = **client;

  // One registered buffer per use.
  std::vector<float> dense(256 * 4096, 0.001f), dense_out(256 * 4096);
  std::vector<float> tiny(kTinyRows), tiny_out(kTinyRows);
  std::vector<float> small(256, 0.001f), r64(64 * 64), r256(256 * 256), emb(32 * 64);
  for (std::vector<float>* b : {&dense, &dense_out, &tiny, &tiny_out, &small, &r64, &r256, &emb}) {
    Check(cl.RegisterBuffer(*b), "RegisterBuffer");
  }
  std::vector<std::uint64_t> shuffled(kTinyRows);
  std::iota(shuffled.begin(), shuffled.end(), 0);
  std::mt19937_64 rng(15);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  std::vector<std::uint64_t> emb_ids(32);
  // 4096 distinct ids spread over the 65536-row table: sparse in their span
  // (17.8 MB of blocks), so the pull goes row by row (4096 READs of one
  // 272-byte inline block each): its time per id is the cost model's op
  // cost plus 272 bytes' worth (perf/ps_vs_stream.sh derives PullCosts).
  std::vector<std::uint64_t> sparse_ids(65536);
  std::iota(sparse_ids.begin(), sparse_ids.end(), 0);
  std::shuffle(sparse_ids.begin(), sparse_ids.end(), rng);
  sparse_ids.resize(4096);
  std::vector<float> sparse_out(4096 * 64);
  Check(cl.RegisterBuffer(sparse_out), "RegisterBuffer");

  const double mib4 = 4 << 20;
  std::vector<Shape> shapes = {
      {"push_4m_applied", mib4, mib4,
       [&] {
         RDMAPS_RETURN_IF_ERROR(cl.Push(kDense, RowRange{0, 256}, dense));
         return WaitApplied(cl);
       }},
      {"pushpull_4m", mib4, 2 * mib4,
       [&] {
         return cl.PushPull(kDense, RowRange{0, 256}, dense, dense_out);
       }},
      // The pipelined PushPull against Push then Pull (what PushPull was,
      // read-my-writes included) at one 16 KiB row and at 256 KiB (4 slots).
      {"pushpull_16k", 16384, 2 * 16384,
       [&] {
         return cl.PushPull(kDense, RowRange{0, 1}, {dense.data(), 4096}, {dense_out.data(), 4096});
       }},
      {"push_pull_16k", 16384, 2 * 16384,
       [&] {
         RDMAPS_RETURN_IF_ERROR(cl.Push(kDense, RowRange{0, 1}, {dense.data(), 4096}));
         return cl.Pull(kDense, RowRange{0, 1}, {dense_out.data(), 4096});
       }},
      {"pushpull_256k", 256 * 1024, 2 * 256 * 1024,
       [&] {
         return cl.PushPull(kDense, RowRange{0, 16}, {dense.data(), 16 * 4096},
                            {dense_out.data(), 16 * 4096});
       }},
      {"push_pull_256k", 256 * 1024, 2 * 256 * 1024,
       [&] {
         RDMAPS_RETURN_IF_ERROR(cl.Push(kDense, RowRange{0, 16}, {dense.data(), 16 * 4096}));
         return cl.Pull(kDense, RowRange{0, 16}, {dense_out.data(), 16 * 4096});
       }},
      {"pull_4m", mib4, mib4,
       [&] {
         return cl.Pull(kDense, RowRange{0, 256}, dense_out);
       }},
      {"pull_1m_x1", 4.0 * kTinyRows, 4.0 * kTinyRows,
       [&] {
         return cl.Pull(kTiny, RowRange{0, kTinyRows}, tiny_out);
       }},
      {"scatter_1m_x1", 4.0 * kTinyRows, 4.0 * kTinyRows,
       [&] { return cl.Pull(kTiny, shuffled, tiny_out); }},
      {"pull_1k", 1024, 1024,
       [&] {
         return cl.Pull(kOneK, RowRange{0, 1}, small);
       }},
      {"push_1k", 1024, 1024,
       [&] {
         return cl.Push(kOneK, RowRange{0, 1}, small);
       }},
      {"pull_64x64", 64 * 64 * 4, 64 * 64 * 4,
       [&] {
         return cl.Pull(kR64, RowRange{0, 64}, r64);
       }},
      {"pull_256x256", 256 * 256 * 4, 256 * 256 * 4,
       [&] {
         return cl.Pull(kR256, RowRange{0, 256}, r256);
       }},
      {"scatter_4096x64", 4096 * 64 * 4, 4096 * 64 * 4,
       [&] { return cl.Pull(kEmb, sparse_ids, sparse_out); }},
      {"scatter_32x64", 32 * 64 * 4, 32 * 64 * 4,
       [&] {
         for (auto& id : emb_ids) id = rng() % 65536;
         return cl.Pull(kEmb, emb_ids, emb);
       }},
  };
  std::vector<std::string> only;
  {
    std::stringstream ss(FLAGS_only);
    for (std::string s; std::getline(ss, s, ',');) {
      if (!s.empty()) only.push_back(s);
    }
  }
  std::printf("%-16s %10s %10s %6s %10s %10s %10s %10s\n", "shape", "payload_B", "moved_B", "iters",
              "p50_us", "p90_us", "pay_MB/s", "moved_MB/s");
  for (const Shape& sh : shapes) {
    if (!only.empty() && std::find(only.begin(), only.end(), sh.name) == only.end()) continue;
    Check(sh.op(), sh.name.c_str());  // warm-up
    const ClientStats before = cl.stats();
    std::vector<double> us;
    const auto until = SteadyClock::now() + std::chrono::duration<double>(FLAGS_seconds);
    while ((static_cast<int>(us.size()) < FLAGS_min_iters || SteadyClock::now() < until) &&
           static_cast<int>(us.size()) < FLAGS_max_iters) {
      const auto t0 = SteadyClock::now();
      Check(sh.op(), sh.name.c_str());
      us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    const double p50 = us[us.size() / 2], p90 = us[us.size() * 9 / 10];
    std::printf("%-16s %10.0f %10.0f %6zu %10.1f %10.1f %10.1f %10.1f\n", sh.name.c_str(),
                sh.payload, sh.moved, us.size(), p50, p90, sh.payload / p50, sh.moved / p50);
    std::fflush(stdout);
    if (FLAGS_print_stats) {
      const ClientStats after = cl.stats();
      std::fprintf(stderr,
                   "%s: per call: rows pulled %.1f, of them pipelined %.1f; torn retries %.2f; "
                   "control READs %.1f; pull waits %.2f\n",
                   sh.name.c_str(), double(after.rows_pulled - before.rows_pulled) / us.size(),
                   double(after.rows_pulled_pipelined - before.rows_pulled_pipelined) / us.size(),
                   double(after.torn_retries - before.torn_retries) / us.size(),
                   double(after.clock_reads - before.clock_reads) / us.size(),
                   double(after.pull_waits - before.pull_waits) / us.size());
    }
  }
  Check(cl.Close(), "closing");
  return 0;
}

}  // namespace
}  // namespace rdmaps

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps-shapes: issue 15's shapes, server and worker in separate processes");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  if (FLAGS_role == "server") return rdmaps::RunServer();
  if (FLAGS_role == "worker") return rdmaps::RunWorker();
  std::fprintf(stderr, "ps-shapes: --role must be server or worker\n");
  return 2;
}

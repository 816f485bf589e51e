// ps-bench: what the parameter-server protocol costs on top of the transport.
//
// Workloads (one process; a ps Server and Client plus a raw endpoint pair on
// the same transport, loopback):
//   pull  range R rows x D floats   vs  one raw READ of R*D*4 bytes
//   pull  scattered R random rows   vs  R raw READs of D*4 bytes, one batch
//   push  range R rows x D floats   vs  one raw WRITE_WITH_IMM of R*D*4 bytes
//   apply  optimizer + row seal over a large table  vs  memcpy (stream copy)
// Each latency row reports the median and p99 of both and their ratio; the
// ratio is the figure of merit (the target: pull/push <= 1.25x raw,
// apply >= 0.5x memory bandwidth). Measured back to back in the same run, in
// alternating blocks so drift hits both sides alike.
//
//   ps-bench --transport=tcp --iters=2000
#include <gflags/gflags.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "src/base/secret.h"
#include "src/ps/memory.h"
#include "src/ps/optimizer.h"
#include "src/ps/wire.h"
#include "tools/common/exit.h"
#include "tools/common/flags.h"
#include "transport/transport.h"

DEFINE_string(transport, "tcp", "tcp, fake or verbs");
DEFINE_int32(iters, 2000, "iterations per latency measurement");
DEFINE_int32(apply_mib, 64, "table size for the optimizer apply measurement, MiB");
DEFINE_bool(zero_copy, true,
            "register each shape's buffer with Client::RegisterBuffer (pulls land in it, "
            "pushes are sent from it); --nozero_copy measures the staged path");
DEFINE_string(host, "127.0.0.1",
              "address the ps server and the raw target listen on (verbs: an IP of the RDMA "
              "device's netdev, e.g. inside the Soft-RoCE VM)");
DEFINE_string(scatter_layout, "auto",
              "row layout of the tables the scattered shapes use: dense (a row READ and a "
              "header READ per row), inline (one READ per row) or auto (the default "
              "TableOptions::layout; dense for these 65536-row tables)");
DEFINE_string(range_layout, "auto",
              "row layout of the tables the range shapes use: dense, inline or auto (the "
              "default TableOptions::layout: inline up to 64 KiB per shard, else dense)");
DEFINE_string(only, "", "run only the shapes whose name contains this (e.g. \"range 256\")");
DEFINE_bool(raw_consumer, true,
            "a thread on the raw server endpoint consumes notifications, as the ps apply "
            "thread does: a push is only done when its server has taken it, so the raw "
            "baseline pays that wake-up too (--noraw_consumer: WRITE_WITH_IMMs nobody "
            "takes, collected between iterations)");
DEFINE_int32(push_slots, 32, "push ring slots per worker");

namespace rdmaps {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Op;

struct Shape {
  const char* name;
  std::uint64_t rows;
  std::uint32_t dim;
  bool scattered;
};

struct Stats {
  double median_us, p99_us;
};

Stats Summarise(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "ps-bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(tools::ExitCodeOf(s));  // 2 for a configuration error
  }
}

// Raw baseline: a server endpoint with a registered region, a client
// connection and a local registered buffer.
struct Raw {
  std::unique_ptr<transport::Endpoint> server, client;
  std::unique_ptr<transport::Connection> conn;
  internal::AlignedBuffer remote_mem, local_mem;
  std::unique_ptr<transport::MemoryRegion> remote_mr, local_mr;
  std::size_t bytes = 0;

  void Init(std::size_t n) {
    bytes = n;
    transport::EndpointOptions o;
    o.transport = FLAGS_transport;
    o.job_token = RandomSecretHex();
    o.peer_id = 1000;
    auto s = transport::Endpoint::Create(o);
    Check(s.status(), "raw server endpoint");
    server = std::move(s).value();
    o.peer_id = 1001;
    auto c = transport::Endpoint::Create(o);
    Check(c.status(), "raw client endpoint");
    client = std::move(c).value();
    remote_mem = internal::AllocateRegionMemory(n);
    local_mem = internal::AllocateRegionMemory(n);
    auto r = server->Register(remote_mem.get(), n, transport::kRemoteAll);
    Check(r.status(), "register");
    remote_mr = std::move(r).value();
    auto l = client->Register(local_mem.get(), n, transport::kAccessNone);
    Check(l.status(), "register");
    local_mr = std::move(l).value();
    auto addr = server->Listen(FLAGS_transport == "fake" ? "fake:0" : FLAGS_host + ":0");
    Check(addr.status(), "listen");
    auto cn = client->Connect(*addr, {}, transport::DeadlineAfter(std::chrono::seconds(10)));
    Check(cn.status(), "connect");
    conn = std::move(cn).value();
  }
  // Posts ops and waits for all completions.
  void Run(const std::vector<Op>& ops) {
    Check(conn->Post(ops), "raw post");
    transport::Completion c[64];
    std::size_t left = ops.size();
    while (left > 0) {
      auto r = conn->Wait({c, std::min<std::size_t>(left, 64)},
                          transport::DeadlineAfter(std::chrono::seconds(10)));
      Check(r.status(), "raw wait");
      for (std::size_t i = 0; i < *r; ++i) Check(c[i].status, "raw op");
      left -= *r;
    }
  }
};

void Drain(transport::Endpoint& ep) {
  transport::Notification n[64];
  while (true) {
    auto r = ep.WaitNotifications(n, Clock::now());
    if (!r.ok() || *r == 0) return;
  }
}

template <typename F>
double TimeUs(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

int Main() {
  const std::vector<Shape> shapes = {
      {"range 1x64", 1, 64, false},       {"range 1x1024", 1, 1024, false},
      {"range 64x64", 64, 64, false},     {"range 64x256", 64, 256, false},
      {"range 256x256", 256, 256, false}, {"range 4096x256", 4096, 256, false},
      {"scatter 32x64", 32, 64, true},    {"scatter 128x16", 128, 16, true},
  };
  std::vector<TableOptions> tables;
  for (std::uint32_t i = 0; i < shapes.size(); ++i) {
    TableOptions t;
    t.id = i;
    t.name = "t" + std::to_string(i);
    t.rows = shapes[i].scattered ? 65536 : shapes[i].rows;
    t.dim = shapes[i].dim;
    t.optimizer = OptimizerOptions::Sgd(0.001f);
    const std::string& layout = shapes[i].scattered ? FLAGS_scatter_layout : FLAGS_range_layout;
    t.layout = layout == "inline"  ? RowLayout::kInline
               : layout == "dense" ? RowLayout::kDense
                                   : RowLayout::kAuto;
    tables.push_back(t);
  }
  const std::string secret = RandomSecretHex();
  ServerOptions so;
  so.transport.transport = FLAGS_transport;
  so.transport.job_token = secret;
  so.listen_address = FLAGS_transport == "fake" ? "fake:0" : FLAGS_host + ":0";
  so.tables = tables;
  so.push_slot_bytes = 8 << 20;
  so.push_slots = static_cast<std::uint32_t>(FLAGS_push_slots);  // default as ServerOptions
  so.exit_when_workers_done = false;
  auto server = Server::Start(so);
  Check(server.status(), "server");
  ClientOptions co;
  co.transport.transport = FLAGS_transport;
  co.transport.job_token = secret;
  co.servers = {(*server)->address()};
  co.staging_bytes = 8 << 20;
  auto client = Client::Connect(co);
  Check(client.status(), "client");
  Client& cl = **client;

  Raw raw;
  raw.Init(8 << 20);
  std::atomic<bool> consumer_stop{false};
  std::thread consumer;
  if (FLAGS_raw_consumer) {
    consumer = std::thread([&] {
      transport::Notification n[64];
      while (!consumer_stop.load()) {
        (void)raw.server->WaitNotifications(
            n, transport::DeadlineAfter(std::chrono::milliseconds(50)));
      }
    });
  }
  std::mt19937_64 rng(1);

  std::printf(
      "transport %s, %d iterations per row; latencies in microseconds; checks by the %s "
      "XXH3\n",
      FLAGS_transport.c_str(), FLAGS_iters, internal::BlockHashBuild());
  std::printf("%-6s %-16s %10s %10s %10s %10s %8s %8s %12s %12s\n", "op", "shape", "ps_p50",
              "ps_p99", "raw_p50", "raw_p99", "p50x", "p99x", "ps_MiB/s", "raw_MiB/s");
  for (int kind = 0; kind < 2; ++kind) {  // 0 pull, 1 push
    for (std::uint32_t i = 0; i < shapes.size(); ++i) {
      const Shape& sh = shapes[i];
      if (kind == 1 && sh.scattered && sh.rows > 64) continue;
      if (std::string_view(sh.name).find(FLAGS_only) == std::string_view::npos) continue;
      const std::size_t payload = sh.rows * sh.dim * sizeof(float);
      std::vector<float> buf(sh.rows * sh.dim, 0.0f);
      if (FLAGS_zero_copy) Check(cl.RegisterBuffer(buf), "RegisterBuffer");
      std::vector<std::uint64_t> ids(sh.rows);
      std::vector<double> ps_us, raw_us;
      const int iters = std::max(10, payload >= (1 << 20) ? FLAGS_iters / 10 : FLAGS_iters);
      for (int it = 0; it < iters; ++it) {
        if (sh.scattered) {
          for (auto& id : ids) id = rng() % 65536;
        }
        // ps op
        ps_us.push_back(TimeUs([&] {
          Status s;
          if (kind == 0) {
            s = sh.scattered ? cl.Pull(i, ids, buf) : cl.Pull(i, RowRange{0, sh.rows}, buf);
          } else {
            s = sh.scattered ? cl.Push(i, ids, buf) : cl.Push(i, RowRange{0, sh.rows}, buf);
          }
          Check(s, "ps op");
        }));
        // raw op(s) of the same payload bytes
        std::vector<Op> ops;
        if (sh.scattered) {
          const std::size_t row = sh.dim * sizeof(float);
          for (std::uint64_t k = 0; k < sh.rows; ++k) {
            const std::uint64_t off = (ids[k] * row) % (raw.bytes - row);
            ops.push_back(
                kind == 0 ? Op::Read(raw.local_mem.get() + k * row, raw.local_mr.get(), row,
                                     raw.remote_mr->remote().addr + off, raw.remote_mr->rkey())
                          : Op::Write(raw.local_mem.get() + k * row, raw.local_mr.get(), row,
                                      raw.remote_mr->remote().addr + off, raw.remote_mr->rkey()));
          }
          if (kind == 1) ops.back().type = transport::OpType::kWriteWithImm;
        } else {
          ops.push_back(kind == 0 ? Op::Read(raw.local_mem.get(), raw.local_mr.get(), payload,
                                             raw.remote_mr->remote().addr, raw.remote_mr->rkey())
                                  : Op::WriteWithImm(raw.local_mem.get(), raw.local_mr.get(),
                                                     payload, raw.remote_mr->remote().addr,
                                                     raw.remote_mr->rkey(), 1));
        }
        raw_us.push_back(TimeUs([&] { raw.Run(ops); }));
        if (kind == 1 && it % 64 == 0 && !FLAGS_raw_consumer) Drain(*raw.server);
      }
      if (!FLAGS_raw_consumer) Drain(*raw.server);
      if (FLAGS_zero_copy) Check(cl.UnregisterBuffer(buf), "UnregisterBuffer");
      const Stats p = Summarise(ps_us), r = Summarise(raw_us);
      const double mib = payload / 1048576.0;
      std::printf("%-6s %-16s %10.1f %10.1f %10.1f %10.1f %8.2f %8.2f %12.1f %12.1f\n",
                  kind == 0 ? "pull" : "push", sh.name, p.median_us, p.p99_us, r.median_us,
                  r.p99_us, p.median_us / r.median_us, p.p99_us / r.p99_us,
                  mib / (p.median_us * 1e-6), mib / (r.median_us * 1e-6));
    }
  }
  const ClientStats st = cl.stats();
  std::printf(
      "client: %llu torn retries, %llu credit waits, %llu bytes staged, %llu zero-copy "
      "calls\n",
      static_cast<unsigned long long>(st.torn_retries),
      static_cast<unsigned long long>(st.credit_waits),
      static_cast<unsigned long long>(st.bytes_staged),
      static_cast<unsigned long long>(st.zero_copy_calls));

  // Optimizer apply rate vs memcpy bandwidth, on one core.
  {
    const std::uint32_t dim = 256;
    // A shard as the server keeps it: dense rows, then a header per checked
    // block of rows.
    const std::size_t row_bytes = internal::RowBytes(dim);
    const std::size_t rows = (static_cast<std::size_t>(FLAGS_apply_mib) << 20) / row_bytes;
    const internal::ShardGeometry geo =
        internal::GeometryOf(internal::kLayoutDense, rows, dim,
                             internal::RowsPerBlock(internal::kLayoutDense, rows, dim, 1));
    const std::size_t shard_bytes = geo.bytes;
    auto table = internal::AllocateRegionMemory(shard_bytes);
    auto copy = internal::AllocateRegionMemory(shard_bytes);
    auto* headers = reinterpret_cast<internal::BlockHeader*>(table.get() + geo.header(0));
    std::vector<float> grad(rows * dim, 0.001f);
    std::printf("\napply over %zu rows x %u floats (%d MiB), one core\n", rows, dim,
                FLAGS_apply_mib);
    std::vector<double> memcpy_s;
    for (int rep = 0; rep < 5; ++rep) {
      memcpy_s.push_back(TimeUs([&] { std::memcpy(copy.get(), table.get(), shard_bytes); }));
    }
    std::sort(memcpy_s.begin(), memcpy_s.end());
    // memcpy moves 2 bytes of traffic (read + write) per byte copied.
    const double mem_gbs = 2.0 * shard_bytes / (memcpy_s[2] * 1e3);
    std::printf("%-10s %10s %14s %10s\n", "optimizer", "GB/s", "rows/s", "x memcpy");
    std::printf("%-10s %10.2f %14s %10s\n", "memcpy", mem_gbs, "-", "1.00");
    for (auto o : {OptimizerOptions::Sgd(0.01f), OptimizerOptions::Momentum(0.01f),
                   OptimizerOptions::Adagrad(0.01f), OptimizerOptions::Adam(0.01f)}) {
      internal::Optimizer opt(o, dim);
      std::vector<float> state(rows * opt.state_floats(), 0.0f);
      std::vector<double> t;
      for (int rep = 0; rep < 3; ++rep) {
        t.push_back(TimeUs([&] {
          for (std::uint64_t b = 0; b < geo.blocks(); ++b) {
            for (std::uint64_t r = geo.first_row(b); r < geo.end_row(b); ++r) {
              auto* row = reinterpret_cast<float*>(table.get() + geo.row(r));
              opt.Apply(row, state.empty() ? nullptr : state.data() + r * opt.state_floats(),
                        grad.data() + r * dim);
            }
            internal::SealRow(&headers[b], 1, table.get() + geo.row(geo.first_row(b)),
                              geo.block_rows(b) * row_bytes);
          }
        }));
      }
      std::sort(t.begin(), t.end());
      // Traffic: params read + written, gradient read, state read + written.
      const double bytes = rows * (3.0 * dim * 4 + 2.0 * opt.state_floats() * 4);
      const double gbs = bytes / (t[1] * 1e3);
      std::printf("%-10s %10.2f %14.3g %10.2f\n", OptimizerKindName(o.kind), gbs,
                  rows / (t[1] * 1e-6), gbs / mem_gbs);
    }
  }
  // Block checks (what a pull does per checked block it READs: a row of 1 KiB
  // or more, or 2 KiB of smaller rows) against memcpy of the same bytes, on
  // one core, 256 KiB at a time as a pull piece: a pull cannot go faster than
  // this, however fast the NIC. The sizes under 1 KiB are what checking
  // such rows one by one would cost.
  {
    constexpr std::size_t kPiece = 256 * 1024;
    auto rows_mem = internal::AllocateRegionMemory(kPiece);
    auto copy = internal::AllocateRegionMemory(kPiece);
    std::memset(rows_mem.get(), 1, kPiece);
    std::printf(
        "\nblock check (XXH3 per block, the %s build) over %zu KiB, one core; the "
        "other builds' ns/block for comparison (avx2: 0 where the CPU has none)\n",
        internal::BlockHashBuild(), kPiece / 1024);
    std::printf("%-10s %10s %12s %10s %16s %16s %16s\n", "bytes", "GB/s", "ns/block", "x memcpy",
                "libxxhash_ns", "scalar_ns", "avx2_ns");
    for (std::size_t row : {64, 256, 1024, 2048, 4096}) {
      const std::size_t n = kPiece / row;
      std::vector<internal::BlockHeader> headers(n);
      for (std::size_t r = 0; r < n; ++r) {
        internal::SealRow(&headers[r], r + 1, rows_mem.get() + r * row, row);
      }
      std::vector<double> check_us, copy_us, lib_us, scalar_us, avx2_us;
      std::size_t bad = 0;
      std::uint64_t sink = 0;
      for (int rep = 0; rep < 50; ++rep) {
        check_us.push_back(TimeUs([&] {
          for (std::size_t r = 0; r < n; ++r) {
            bad += !internal::VerifyRow(headers[r], rows_mem.get() + r * row, row);
          }
        }));
        copy_us.push_back(TimeUs([&] { std::memcpy(copy.get(), rows_mem.get(), kPiece); }));
        lib_us.push_back(TimeUs([&] {
          for (std::size_t r = 0; r < n; ++r) {
            sink += internal::Xxh3LibraryWithSeed(rows_mem.get() + r * row, row, r);
          }
        }));
        scalar_us.push_back(TimeUs([&] {
          for (std::size_t r = 0; r < n; ++r) {
            sink -= internal::Xxh3ScalarWithSeed(rows_mem.get() + r * row, row, r);
          }
        }));
        if (internal::Xxh3Avx2Available()) {
          std::uint64_t lib_sink = 0, avx2_sink = 0;
          for (std::size_t r = 0; r < n; ++r) {
            lib_sink += internal::Xxh3LibraryWithSeed(rows_mem.get() + r * row, row, r);
          }
          avx2_us.push_back(TimeUs([&] {
            for (std::size_t r = 0; r < n; ++r) {
              avx2_sink += internal::Xxh3Avx2WithSeed(rows_mem.get() + r * row, row, r);
            }
          }));
          if (avx2_sink != lib_sink) sink = 1;
        }
      }
      if (sink != 0) std::fprintf(stderr, "ps-bench: the XXH3 builds disagree\n");
      if (bad != 0) std::fprintf(stderr, "ps-bench: %zu blocks failed their check\n", bad);
      const Stats c = Summarise(check_us), m = Summarise(copy_us);
      std::printf("%-10zu %10.2f %12.1f %10.2f %16.1f %16.1f %16.1f\n", row,
                  kPiece / (c.median_us * 1e3), c.median_us * 1e3 / n, m.median_us / c.median_us,
                  Summarise(lib_us).median_us * 1e3 / n, Summarise(scalar_us).median_us * 1e3 / n,
                  avx2_us.empty() ? 0.0 : Summarise(avx2_us).median_us * 1e3 / n);
    }
  }
  consumer_stop.store(true);
  if (consumer.joinable()) consumer.join();
  (void)cl.Close();
  (*server)->Stop();
  return 0;
}

}  // namespace
}  // namespace rdmaps

int main(int argc, char** argv) {
  gflags::SetUsageMessage("ps-bench: parameter-server pull/push vs raw transport ops");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  return rdmaps::tools::GuardedMain("ps-bench", [] { return rdmaps::Main(); });
}

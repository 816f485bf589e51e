// The rdmaps-perf benchmark: one-sided READ, WRITE, WRITE_WITH_IMM and
// atomic latency and bandwidth over any transport backend, perftest style.
//
// Workloads (one op type per run, each size in turn, latency then bandwidth):
//   lat  one op in flight: post, wait for its completion, repeat. Every op is
//        a full round trip -- READ and atomics by nature; WRITE and
//        WRITE_WITH_IMM too, because the initiator's completion arrives only
//        after the target has the data (unlike perftest's ib_write_lat,
//        which halves a ping-pong of two WRITEs; a one-sided WRITE has no
//        echo without a CPU on the other side).
//   bw   up to tx_depth ops in flight, posted in lists of post_list ops.
// After each size the client verifies the data: READs the server's pattern
// back, or WRITEs its own pattern and READs it back, or checks every
// atomic's returned value and the final counter.
//
// PerfServer serves one client; RunClient is that client; RunLoopback runs
// both in one process (the server on a thread). See perf_protocol.h for how
// the client learns the server's buffer.
//
// Thread safety: a PerfServer's Serve() runs on one thread; Stop() may be
// called from any thread. RunClient uses only its own objects.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "perf/rdmaps-perf/perf_report.h"
#include "rdmaps/status.h"
#include "transport/transport.h"

namespace rdmaps::perf {

enum class PerfOp { kRead, kWrite, kWriteImm, kFetchAdd, kCompareSwap };
Result<PerfOp> ParsePerfOp(std::string_view op, std::string_view atomic);
std::string_view PerfOpName(PerfOp op);

struct PerfOptions {
  transport::EndpointOptions endpoint;  // transport, verbs device, busy_poll...
  PerfOp op = PerfOp::kRead;
  bool latency = true;
  bool bandwidth = true;
  std::vector<std::uint64_t> sizes;  // Message sizes, each run in turn.
  std::uint64_t lat_iters = 1000;    // Timed iterations per size (latency).
  std::uint64_t bw_iters = 5000;     // Timed iterations per size (bandwidth).
  std::chrono::duration<double> duration{0};  // > 0: run each size this long instead.
  std::uint64_t warmup = 16;                  // Untimed ops before each size.
  std::uint32_t tx_depth = 128;               // Ops in flight (bandwidth).
  std::uint32_t post_list = 1;                // Ops per Post() call (bandwidth).
  // Bounds every wait: connecting, the descriptor, each op, the server's
  // wait for a client and for the client's next step.
  std::chrono::milliseconds timeout{30000};
};

// Serves one rdmaps-perf client: Listen(), then Serve() until the client is
// done.
class PerfServer {
 public:
  explicit PerfServer(PerfOptions options);
  ~PerfServer();

  // Creates the endpoint and listens on `address` ("host:port"; port 0 picks
  // one). Returns the address clients should connect to.
  Result<std::string> Listen(const std::string& address);
  // Accepts one client, hands it the buffer, waits until it is done or gone.
  Status Serve();
  // Makes Serve() return Cancelled soon; any thread.
  void Stop();

  // The server's transport kind ("tcp", ...); valid after Listen().
  std::string kind() const;
  // WRITE_WITH_IMM benchmark notifications received (valid after Serve()).
  std::uint64_t bench_imms() const { return bench_imms_; }

 private:
  const PerfOptions options_;
  std::unique_ptr<transport::Endpoint> endpoint_;
  std::atomic<bool> stop_{false};
  std::uint64_t bench_imms_ = 0;
};

// Connects to a PerfServer at `address` and runs every size, reporting each
// result to `reporter` as it completes.
// `write_imms_sent`, when given, receives how many benchmark WRITE_WITH_IMMs
// were posted.
Status RunClient(const PerfOptions& options, const std::string& address, Reporter& reporter,
                 std::uint64_t* write_imms_sent = nullptr);

// Server and client in one process: the server listens on `listen_address`.
Status RunLoopback(const PerfOptions& options, const std::string& listen_address,
                   Reporter& reporter);

// The configuration lines the report starts with.
nlohmann::json DescribeRun(const PerfOptions& options, std::string_view kind);

}  // namespace rdmaps::perf

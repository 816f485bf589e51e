// rdmaps-perf: one-sided READ / WRITE / WRITE_WITH_IMM / atomic latency and
// bandwidth over an rdmaps transport, with perftest's conventions.
//
//   server:   rdmaps-perf --transport=tcp [-p PORT] [--bind ADDR]
//             (prints "listening on HOST:PORT"; -p 0, the default, picks a
//             free port)
//   client:   rdmaps-perf --transport=tcp [options] HOST[:PORT]
//   loopback: rdmaps-perf --transport=tcp --loopback [options]
//
// Workloads: --op=read|write|write_imm|atomic (--atomic=fetch_add|cmp_swap),
// --mode=lat|bw|both, sizes -s N or -a (2..2^23), -n iterations or -D
// seconds per size, -t ops in flight and -l ops per post for bandwidth.
// See perf_runner.h for what is measured and docs/perf.md for how to read it.
#include <gflags/gflags.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "perf/rdmaps-perf/perf_cli.h"
#include "perf/rdmaps-perf/perf_report.h"
#include "perf/rdmaps-perf/perf_runner.h"
#include "rdmaps/cluster.h"
#include "src/base/host_port.h"
#include "src/cluster/secret.h"
#include "tools/common/exit.h"

DEFINE_string(transport, "tcp", "Transport backend: tcp, fake, verbs or auto");
DEFINE_string(op, "read", "Operation: read, write, write_imm or atomic");
DEFINE_string(atomic, "fetch_add", "With --op=atomic: fetch_add or cmp_swap");
DEFINE_string(mode, "both", "lat (one op in flight), bw (-t in flight) or both");
DEFINE_string(size, "",
              "-s: message size in bytes, or a list: -s 64,4K,1M (default: 2 for lat, 65536 "
              "for bw)");
DEFINE_bool(all, false, "-a: run every size 2, 4, ..., 2^23");
DEFINE_uint64(iters, 0, "-n: timed iterations per size (default: 1000 lat, 5000 bw)");
DEFINE_double(duration, 0, "-D: run each size this many seconds instead of -n iterations");
DEFINE_uint32(tx_depth, 128, "-t: operations in flight in bw mode");
DEFINE_uint32(post_list, 1, "-l: operations per Post() call in bw mode");
DEFINE_uint64(warmup, 16, "Untimed operations before each size");
DEFINE_string(output, "table", "table, csv or json (results on stdout)");
DEFINE_int32(port, 0, "-p: server port; 0 lets the server pick a free one (it prints it)");
DEFINE_string(bind, "", "Server address to listen on (default 0.0.0.0; 127.0.0.1 with --loopback)");
DEFINE_bool(loopback, false, "Run server and client in this process (server on a thread)");
DEFINE_double(timeout, 30, "Seconds any single wait may take (connect, an op, an idle client)");
DEFINE_uint32(busy_poll_us, 50, "Microseconds a completion wait spins before sleeping");
DEFINE_bool(insecure, false,
            "run without a job secret (also RDMAPS_INSECURE=1): anyone who reaches the port can "
            "read and write the benchmark buffer");
DEFINE_string(secret_file, "",
              "a server started with no RDMAPS_JOB_SECRET[_FILE] writes its generated job secret "
              "here, mode 0600 (default: $XDG_RUNTIME_DIR/rdmaps/job-secret-PID); start the "
              "client with RDMAPS_JOB_SECRET_FILE=PATH");
DEFINE_string(ib_dev, "", "-d: verbs device (default: the one owning the address)");
DEFINE_int32(ib_port, 1, "-i: verbs device port");
DEFINE_int32(gid_index, -1, "-x: verbs GID index (-1: rdma_cm chooses)");

namespace {

using rdmaps::perf::ParseFlags;
using rdmaps::perf::PerfOptions;
using rdmaps::perf::WithPort;

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

int Usage(const std::string& message) {
  std::fprintf(stderr, "rdmaps-perf: %s (see --help)\n", message.c_str());
  return kExitUsage;
}

}  // namespace

int RealMain(int argc, char** argv) {
  gflags::SetUsageMessage(
      "one-sided transport benchmark, perftest style.\n"
      "  server:   rdmaps-perf --transport=tcp [-p PORT]\n"
      "  client:   rdmaps-perf --transport=tcp [options] HOST[:PORT]\n"
      "  loopback: rdmaps-perf --transport=tcp --loopback [options]\n"
      "Short flags: -s size, -a all sizes, -n iters, -D duration, -t tx depth, -l post list,\n"
      "-p port, -d ib device, -i ib port, -x gid index.");
  const std::vector<std::string> positional = ParseFlags(argc, argv);

  if (positional.size() > 1) return Usage("expected at most one positional argument, HOST[:PORT]");
  if (FLAGS_loopback && !positional.empty()) {
    return Usage("--loopback runs its own server; drop the address " + positional[0]);
  }

  PerfOptions o;
  o.endpoint.transport = FLAGS_transport;
  // The job secret as every tool resolves it (docs/security.md): never a
  // flag; the loopback run and a server started by hand make one.
  const rdmaps::Environment env = rdmaps::CurrentEnvironment();
  auto secret = rdmaps::internal::ResolveJobSecret(
      [] {
        rdmaps::ClusterOptions co;
        co.insecure = FLAGS_insecure;
        return co;
      }(),
      env, rdmaps::ClusterLayout{});
  if (!secret.ok()) {
    std::fprintf(stderr, "rdmaps-perf: %s\n", secret.status().ToString().c_str());
    return rdmaps::tools::kExitConfig;
  }
  o.endpoint.job_token = secret->value;
  o.endpoint.insecure = secret->insecure;
  struct SecretFile {
    std::string path;
    ~SecretFile() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } secret_file;
  if (o.endpoint.job_token.empty() && !o.endpoint.insecure) {
    o.endpoint.job_token = rdmaps::GenerateJobSecret();
    if (!FLAGS_loopback && positional.empty()) {
      const std::string path = !FLAGS_secret_file.empty()
                                   ? FLAGS_secret_file
                                   : rdmaps::DefaultJobSecretFile(env, static_cast<int>(getpid()));
      if (path.empty()) {
        return Usage(
            "no job secret and nowhere to write one (no HOME): pass --secret_file=PATH, "
            "set RDMAPS_JOB_SECRET_FILE, or --insecure");
      }
      if (rdmaps::Status s = rdmaps::WriteJobSecretFile(path, o.endpoint.job_token); !s.ok()) {
        std::fprintf(stderr, "rdmaps-perf: cannot write the job secret: %s\n",
                     s.ToString().c_str());
        return kExitError;
      }
      secret_file.path = path;
      std::printf("job secret written to %s; start the client with RDMAPS_JOB_SECRET_FILE=%s\n",
                  path.c_str(), path.c_str());
    } else if (!FLAGS_loopback) {
      o.endpoint.job_token.clear();  // a client: Endpoint::Create names the sources
    }
  }
  o.endpoint.busy_poll = std::chrono::microseconds(FLAGS_busy_poll_us);
  o.endpoint.ib_dev = FLAGS_ib_dev;
  o.endpoint.ib_port = FLAGS_ib_port;
  o.endpoint.gid_index = FLAGS_gid_index;
  if (!(FLAGS_timeout > 0)) return Usage("--timeout must be positive");
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(FLAGS_timeout * 1000));

  auto op = rdmaps::perf::ParsePerfOp(FLAGS_op, FLAGS_atomic);
  if (!op.ok()) return Usage(op.status().message());
  o.op = *op;
  auto format = rdmaps::perf::ParseOutputFormat(FLAGS_output);
  if (!format.ok()) return Usage(format.status().message());

  if (FLAGS_mode == "lat" || FLAGS_mode == "bw" || FLAGS_mode == "both") {
    o.latency = FLAGS_mode != "bw";
    o.bandwidth = FLAGS_mode != "lat";
  } else {
    return Usage("unknown --mode='" + FLAGS_mode + "'; use lat, bw or both");
  }

  const bool atomic =
      o.op == rdmaps::perf::PerfOp::kFetchAdd || o.op == rdmaps::perf::PerfOp::kCompareSwap;
  if (atomic) {
    if (FLAGS_all || (!FLAGS_size.empty() && FLAGS_size != "8")) {
      std::fprintf(stderr, "rdmaps-perf: atomics are always 8 bytes; ignoring -s/-a\n");
    }
    o.sizes = {8};
  } else if (FLAGS_all) {
    for (std::uint64_t s = 2; s <= (1u << 23); s *= 2) o.sizes.push_back(s);
  } else if (!FLAGS_size.empty()) {
    auto sizes = rdmaps::perf::ParseSizes(FLAGS_size);
    if (!sizes.ok()) return Usage(sizes.status().message());
    o.sizes = *sizes;
  } else {
    // perftest's defaults: 2 bytes for latency, 64 KiB for bandwidth; with
    // --mode=both both sizes run in both modes.
    if (o.latency) o.sizes.push_back(2);
    if (o.bandwidth) o.sizes.push_back(65536);
  }

  if (FLAGS_duration < 0) return Usage("-D must not be negative");
  if (FLAGS_duration > 0 && FLAGS_iters != 0) return Usage("pass either -n or -D, not both");
  o.duration = std::chrono::duration<double>(FLAGS_duration);
  if (FLAGS_iters != 0) {
    o.lat_iters = o.bw_iters = FLAGS_iters;
  }
  o.warmup = FLAGS_warmup;
  if (FLAGS_tx_depth == 0) return Usage("-t must be at least 1");
  if (FLAGS_post_list == 0 || FLAGS_post_list > FLAGS_tx_depth) {
    return Usage("-l must be between 1 and -t (" + std::to_string(FLAGS_tx_depth) + ")");
  }
  o.tx_depth = FLAGS_tx_depth;
  o.post_list = FLAGS_post_list;
  if (FLAGS_port < 0 || FLAGS_port > 65535) return Usage("-p must be a port number, 0..65535");

  rdmaps::perf::Reporter reporter(*format, stdout, "rdmaps-perf",
                                  rdmaps::perf::DescribeRun(o, FLAGS_transport));

  std::string bind = FLAGS_bind;
  if (bind.empty()) bind = FLAGS_loopback ? "127.0.0.1" : "0.0.0.0";
  std::string listen_address;
  if (!WithPort(bind, FLAGS_port, &listen_address)) listen_address = rdmaps::JoinHostPort(bind, 0);

  rdmaps::Status status;
  if (FLAGS_loopback) {
    status = rdmaps::perf::RunLoopback(o, listen_address, reporter);
  } else if (positional.empty()) {
    rdmaps::perf::PerfServer server(o);
    auto address = server.Listen(listen_address);
    if (!address.ok()) {
      std::fprintf(stderr, "rdmaps-perf: %s\n", address.status().ToString().c_str());
      return kExitError;
    }
    std::printf("listening on %s (transport %s)\n", address->c_str(), server.kind().c_str());
    std::fflush(stdout);
    status = server.Serve();
    if (status.ok()) {
      std::fprintf(stderr, "rdmaps-perf: client done (%llu WRITE_WITH_IMM notifications)\n",
                   static_cast<unsigned long long>(server.bench_imms()));
    }
    if (!status.ok()) {
      std::fprintf(stderr, "rdmaps-perf: %s\n", status.ToString().c_str());
      return kExitError;
    }
    return 0;
  } else {
    std::string address;
    if (!WithPort(positional[0], FLAGS_port, &address)) {
      return Usage("the server address '" + positional[0] +
                   "' has no port; pass HOST:PORT (as the server printed it) or -p PORT");
    }
    status = rdmaps::perf::RunClient(o, address, reporter);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "rdmaps-perf: %s\n", status.ToString().c_str());
    return kExitError;
  }
  reporter.Finish();
  return 0;
}

int main(int argc, char** argv) {
  // No exception reaches std::terminate (tools/common/exit.h).
  return rdmaps::tools::GuardedMain("rdmaps-perf", [&] { return RealMain(argc, argv); });
}

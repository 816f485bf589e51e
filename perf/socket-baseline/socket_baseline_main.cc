// socket-baseline: what plain TCP does on this machine, to hold the rdmaps
// tcp backend against. Blocking sockets, TCP_NODELAY, one thread per side,
// same flags and same tables as rdmaps-perf (perf/rdmaps-perf/perf_report.h).
//
//   server:   socket-baseline [-p PORT] [--bind ADDR]   (prints "listening on")
//   client:   socket-baseline [options] HOST[:PORT]
//   loopback: socket-baseline --loopback [options]
//
// Workloads, per size N (-s N or -a):
//   lat  ping-pong: the client sends a 64-byte request, the server answers
//        with N bytes; one round trip per iteration, like a READ of N bytes.
//   bw   stream: one 64-byte request, then the server send()s N-byte
//        messages back to back (one send() per message, as an application
//        would) and the client recv()s into a large buffer; the run ends when
//        the last byte arrives. Data flows server -> client, like READ bw.
// After each size one ping-pong's N bytes are checked against the server's
// pattern, so the rows say "verified" like rdmaps-perf's.
//
// Wire protocol (client -> server, 64 bytes, little endian):
//   u32 magic "SBLN", u32 kind (1 ping, 2 stream, 3 done), u64 size,
//   u64 count (stream messages), 40 bytes zero.
// Every socket wait is bounded by --timeout (SO_RCVTIMEO / SO_SNDTIMEO).
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <gflags/gflags.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "perf/rdmaps-perf/perf_cli.h"
#include "perf/rdmaps-perf/perf_protocol.h"
#include "src/base/fd.h"
#include "src/base/host_port.h"
#include "perf/rdmaps-perf/perf_report.h"
#include "tools/common/exit.h"

DEFINE_string(mode, "both", "lat (ping-pong), bw (stream) or both");
DEFINE_string(size, "",
              "-s: message size in bytes, or a list: -s 64,4K,1M (default: 2 for lat, 65536 "
              "for bw)");
DEFINE_bool(all, false, "-a: run every size 2, 4, ..., 2^23");
DEFINE_uint64(iters, 0, "-n: timed iterations per size (default: 1000 lat, 5000 bw)");
DEFINE_double(duration, 0, "-D: run each size this many seconds instead of -n iterations");
DEFINE_uint64(warmup, 16, "Untimed ping-pongs before each size");
DEFINE_string(output, "table", "table, csv or json (results on stdout)");
DEFINE_int32(port, 0, "-p: server port; 0 lets the server pick a free one (it prints it)");
DEFINE_string(bind, "",
              "Server address to listen on (default 0.0.0.0; 127.0.0.1 with --loopback)");
DEFINE_bool(loopback, false, "Run server and client in this process (server on a thread)");
DEFINE_double(timeout, 30, "Seconds any single socket wait may take");

namespace rdmaps::perf {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x4E4C4253;  // "SBLN"
enum Kind : std::uint32_t { kPing = 1, kStream = 2, kDone = 3 };

struct Request {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint64_t size;
  std::uint64_t count;
  std::uint8_t pad[40];
};
static_assert(std::is_trivially_copyable_v<Request>);
static_assert(sizeof(Request) == 64);

struct Config {
  bool latency = true;
  bool bandwidth = true;
  std::vector<std::uint64_t> sizes;
  std::uint64_t lat_iters = 1000;
  std::uint64_t bw_iters = 5000;
  double duration = 0;
  std::uint64_t warmup = 16;
  std::chrono::milliseconds timeout{30000};
};

Status SetTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoError("setsockopt", errno);
  }
  return Status::OK();
}

Status SendAll(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return TimedOutError("send() blocked longer than --timeout; the peer stopped reading");
      }
      return ErrnoError("send", errno);
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return Status::OK();
}

// Receives up to `n` bytes (at least 1); 0 means the peer closed.
Result<std::size_t> RecvSome(int fd, void* data, std::size_t n) {
  for (;;) {
    const ssize_t k = ::recv(fd, data, n, 0);
    if (k >= 0) return static_cast<std::size_t>(k);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return TimedOutError("recv() waited longer than --timeout; the peer stalled");
    }
    return ErrnoError("recv", errno);
  }
}

Status RecvAll(int fd, void* data, std::size_t n) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    RDMAPS_ASSIGN_OR_RETURN(std::size_t k, RecvSome(fd, p, n));
    if (k == 0) return UnavailableError("the peer closed the connection mid-message");
    p += k;
    n -= k;
  }
  return Status::OK();
}

Result<sockaddr_storage> Resolve(const std::string& address, socklen_t* len, bool passive) {
  RDMAPS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(address, "socket-baseline address"));
  RDMAPS_ASSIGN_OR_RETURN(
      AddrInfoList ai, ResolveHostPort(hp, passive ? AddressUse::kListen : AddressUse::kConnect));
  sockaddr_storage ss{};
  std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
  *len = ai->ai_addrlen;
  return ss;
}

// ---------------------------------------------------------------- server

class Server {
 public:
  explicit Server(const Config& config) : config_(config) {}

  Result<std::string> Listen(const std::string& address) {
    socklen_t len = 0;
    RDMAPS_ASSIGN_OR_RETURN(sockaddr_storage ss, Resolve(address, &len, true));
    listen_ = Fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listen_.get() < 0) return ErrnoError("socket", errno);
    int one = 1;
    ::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      return ErrnoError("bind " + address + " (pick another -p or --bind)", errno);
    }
    if (::listen(listen_.get(), 4) != 0) return ErrnoError("listen", errno);
    sockaddr_storage bound{};
    socklen_t blen = sizeof(bound);
    ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&bound), &blen);
    return SockaddrToString(reinterpret_cast<const sockaddr*>(&bound));
  }

  Status Serve() {
    pollfd pfd{listen_.get(), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, static_cast<int>(config_.timeout.count()));
    if (rc < 0) return ErrnoError("poll", errno);
    if (rc == 0) return TimedOutError("no client connected within --timeout");
    Fd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.get() < 0) return ErrnoError("accept", errno);
    RDMAPS_RETURN_IF_ERROR(SetTimeouts(conn.get(), config_.timeout));
    for (;;) {
      Request req;
      RDMAPS_ASSIGN_OR_RETURN(std::size_t k, RecvSome(conn.get(), &req, sizeof(req)));
      if (k == 0) return UnavailableError("the client disconnected before it finished");
      if (k < sizeof(req)) {
        RDMAPS_RETURN_IF_ERROR(
            RecvAll(conn.get(), reinterpret_cast<std::byte*>(&req) + k, sizeof(req) - k));
      }
      if (le32toh(req.magic) != kMagic) {
        return InvalidArgumentError("the client is not socket-baseline; connect with it");
      }
      const std::uint64_t size = le64toh(req.size);
      const std::uint64_t count = le64toh(req.count);
      switch (le32toh(req.kind)) {
        case kPing:
          RDMAPS_RETURN_IF_ERROR(Grow(size));
          RDMAPS_RETURN_IF_ERROR(SendAll(conn.get(), buffer_.data(), size));
          break;
        case kStream:
          RDMAPS_RETURN_IF_ERROR(Grow(size));
          for (std::uint64_t i = 0; i < count; ++i) {
            RDMAPS_RETURN_IF_ERROR(SendAll(conn.get(), buffer_.data(), size));
          }
          break;
        case kDone:
          return Status::OK();
        default:
          return InvalidArgumentError("unknown request kind from the client");
      }
    }
  }

 private:
  Status Grow(std::uint64_t size) {
    if (size > kMaxServerBuffer) {
      return ResourceExhaustedError("the client asks for " + std::to_string(size) +
                                    "-byte messages; the limit is " +
                                    std::to_string(kMaxServerBuffer));
    }
    if (buffer_.size() < size) {
      buffer_.resize(size);
      FillPattern(buffer_, kServerSeed);
    }
    return Status::OK();
  }

  const Config& config_;
  Fd listen_;
  std::vector<std::byte> buffer_;
};

// ---------------------------------------------------------------- client

class Client {
 public:
  Client(const Config& config, Reporter& reporter) : config_(config), reporter_(reporter) {}

  Status Run(const std::string& address) {
    RDMAPS_RETURN_IF_ERROR(Connect(address));
    const std::uint64_t max_size = *std::max_element(config_.sizes.begin(), config_.sizes.end());
    buffer_.resize(std::max<std::uint64_t>(max_size, 4u << 20));
    if (config_.latency) {
      for (std::uint64_t size : config_.sizes) RDMAPS_RETURN_IF_ERROR(RunLatency(size));
    }
    if (config_.bandwidth) {
      for (std::uint64_t size : config_.sizes) RDMAPS_RETURN_IF_ERROR(RunBandwidth(size));
    }
    return Send(kDone, 0, 0);
  }

 private:
  Status Connect(const std::string& address) {
    socklen_t len = 0;
    RDMAPS_ASSIGN_OR_RETURN(sockaddr_storage ss, Resolve(address, &len, false));
    fd_ = Fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd_.get() < 0) return ErrnoError("socket", errno);
    if (::connect(fd_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      if (errno != EINPROGRESS) {
        return UnavailableError("connect to " + address + " failed: " + std::strerror(errno) +
                                "; is socket-baseline listening there?");
      }
      pollfd pfd{fd_.get(), POLLOUT, 0};
      const int rc = ::poll(&pfd, 1, static_cast<int>(config_.timeout.count()));
      if (rc == 0) return TimedOutError("connect to " + address + " timed out");
      int err = 0;
      socklen_t elen = sizeof(err);
      ::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &elen);
      if (rc < 0 || err != 0) {
        return UnavailableError("connect to " + address + " failed: " +
                                std::strerror(rc < 0 ? errno : err) +
                                "; is socket-baseline listening there?");
      }
    }
    const int flags = ::fcntl(fd_.get(), F_GETFL);
    ::fcntl(fd_.get(), F_SETFL, flags & ~O_NONBLOCK);
    return SetTimeouts(fd_.get(), config_.timeout);
  }

  Status Send(Kind kind, std::uint64_t size, std::uint64_t count) {
    Request req{};
    req.magic = htole32(kMagic);
    req.kind = htole32(kind);
    req.size = htole64(size);
    req.count = htole64(count);
    return SendAll(fd_.get(), &req, sizeof(req));
  }

  Status Ping(std::uint64_t size) {
    RDMAPS_RETURN_IF_ERROR(Send(kPing, size, 0));
    return RecvAll(fd_.get(), buffer_.data(), size);
  }

  // Warm-up before a size, verification after it.
  Status Warmup(std::uint64_t size) {
    for (std::uint64_t i = 0; i < config_.warmup; ++i) RDMAPS_RETURN_IF_ERROR(Ping(size));
    return Status::OK();
  }
  Status Verify(std::uint64_t size) {
    std::memset(buffer_.data(), 0, size);
    RDMAPS_RETURN_IF_ERROR(Ping(size));
    const std::int64_t bad = FindPatternMismatch({buffer_.data(), size}, kServerSeed);
    if (bad >= 0) {
      return DataLossError("ping-pong of " + std::to_string(size) +
                           " bytes returned wrong data at offset " + std::to_string(bad));
    }
    return Status::OK();
  }

  Status RunLatency(std::uint64_t size) {
    RDMAPS_RETURN_IF_ERROR(Warmup(size));
    const bool timed = config_.duration > 0;
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(config_.duration));
    std::vector<std::int64_t> samples;
    samples.reserve(timed ? 1 << 16 : config_.lat_iters);
    for (;;) {
      const auto t0 = Clock::now();
      if (timed ? t0 >= end : samples.size() >= config_.lat_iters) break;
      RDMAPS_RETURN_IF_ERROR(Ping(size));
      samples.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    }
    RDMAPS_RETURN_IF_ERROR(Verify(size));
    reporter_.AddLatency(ComputeLatency(size, samples), true);
    return Status::OK();
  }

  Status RunBandwidth(std::uint64_t size) {
    RDMAPS_RETURN_IF_ERROR(Warmup(size));
    const bool timed = config_.duration > 0;
    // With -D the stream is requested in chunks of about 64 MiB until time
    // is up; each chunk costs one extra request round trip.
    const std::uint64_t chunk =
        timed ? std::max<std::uint64_t>(1, (64u << 20) / size) : config_.bw_iters;
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(config_.duration));
    std::vector<BandwidthSample> samples;
    std::uint64_t received = 0;  // Bytes.
    std::uint64_t messages = 0;
    std::int64_t last_ns = 0;
    do {
      RDMAPS_RETURN_IF_ERROR(Send(kStream, size, chunk));
      const std::uint64_t target = received + chunk * size;
      while (received < target) {
        const std::size_t want =
            static_cast<std::size_t>(std::min<std::uint64_t>(buffer_.size(), target - received));
        RDMAPS_ASSIGN_OR_RETURN(std::size_t k, RecvSome(fd_.get(), buffer_.data(), want));
        if (k == 0) return UnavailableError("the server closed the connection mid-stream");
        received += k;
        last_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
        if (received / size != messages) {
          messages = received / size;
          samples.push_back({last_ns, messages});
        }
      }
    } while (timed && Clock::now() < end);
    RDMAPS_RETURN_IF_ERROR(Verify(size));
    reporter_.AddBandwidth(ComputeBandwidth(size, messages, last_ns, samples, 1), true);
    return Status::OK();
  }

  const Config& config_;
  Reporter& reporter_;
  Fd fd_;
  std::vector<std::byte> buffer_;
};

int Usage(const std::string& message) {
  std::fprintf(stderr, "socket-baseline: %s (see --help)\n", message.c_str());
  return 2;
}

int Main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "plain TCP ping-pong and stream, the baseline for rdmaps-perf --transport=tcp.\n"
      "  server:   socket-baseline [-p PORT]\n"
      "  client:   socket-baseline [options] HOST[:PORT]\n"
      "  loopback: socket-baseline --loopback [options]");
  const std::vector<std::string> positional = ParseFlags(argc, argv);
  if (positional.size() > 1) return Usage("expected at most one positional argument, HOST[:PORT]");
  if (FLAGS_loopback && !positional.empty()) {
    return Usage("--loopback runs its own server; drop the address " + positional[0]);
  }

  Config c;
  if (FLAGS_mode == "lat" || FLAGS_mode == "bw" || FLAGS_mode == "both") {
    c.latency = FLAGS_mode != "bw";
    c.bandwidth = FLAGS_mode != "lat";
  } else {
    return Usage("unknown --mode='" + FLAGS_mode + "'; use lat, bw or both");
  }
  if (FLAGS_all) {
    for (std::uint64_t s = 2; s <= (1u << 23); s *= 2) c.sizes.push_back(s);
  } else if (!FLAGS_size.empty()) {
    auto sizes = ParseSizes(FLAGS_size);
    if (!sizes.ok()) return Usage(sizes.status().message());
    c.sizes = *sizes;
  } else {
    if (c.latency) c.sizes.push_back(2);
    if (c.bandwidth) c.sizes.push_back(65536);
  }
  if (FLAGS_duration < 0) return Usage("-D must not be negative");
  if (FLAGS_duration > 0 && FLAGS_iters != 0) return Usage("pass either -n or -D, not both");
  c.duration = FLAGS_duration;
  if (FLAGS_iters != 0) c.lat_iters = c.bw_iters = FLAGS_iters;
  c.warmup = FLAGS_warmup;
  if (!(FLAGS_timeout > 0)) return Usage("--timeout must be positive");
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(FLAGS_timeout * 1000));
  if (FLAGS_port < 0 || FLAGS_port > 65535) return Usage("-p must be a port number, 0..65535");
  auto format = ParseOutputFormat(FLAGS_output);
  if (!format.ok()) return Usage(format.status().message());

  nlohmann::json info;
  info["transport"] = "socket";
  info["op"] = "ping-pong (lat) / stream (bw)";
  info["mode"] = FLAGS_mode;
  info["warmup"] = c.warmup;
  if (c.duration > 0) {
    info["duration_s"] = c.duration;
  } else {
    if (c.latency) info["lat_iterations"] = c.lat_iters;
    if (c.bandwidth) info["bw_iterations"] = c.bw_iters;
  }
  if (c.latency) info["latency_is"] = "full round trip: 64-byte request, N-byte response";
  Reporter reporter(*format, stdout, "socket-baseline", info);

  std::string bind = FLAGS_bind;
  if (bind.empty()) bind = FLAGS_loopback ? "127.0.0.1" : "0.0.0.0";
  std::string listen_address;
  if (!WithPort(bind, FLAGS_port, &listen_address)) listen_address = JoinHostPort(bind, 0);

  Status status;
  if (positional.empty()) {
    Server server(c);
    auto address = server.Listen(listen_address);
    if (!address.ok()) {
      std::fprintf(stderr, "socket-baseline: %s\n", address.status().ToString().c_str());
      return 1;
    }
    if (FLAGS_loopback) {
      Status server_status;
      std::thread thread([&] { server_status = server.Serve(); });
      {
        Client client(c, reporter);
        status = client.Run(*address);
      }  // Closes the socket: on a client error the server sees EOF and returns.
      thread.join();
      if (status.ok()) status = server_status.WithContext("server");
    } else {
      std::printf("listening on %s (transport socket)\n", address->c_str());
      std::fflush(stdout);
      status = server.Serve();
      if (!status.ok()) {
        std::fprintf(stderr, "socket-baseline: %s\n", status.ToString().c_str());
        return 1;
      }
      return 0;
    }
  } else {
    std::string address;
    if (!WithPort(positional[0], FLAGS_port, &address)) {
      return Usage("the server address '" + positional[0] +
                   "' has no port; pass HOST:PORT (as the server printed it) or -p PORT");
    }
    Client client(c, reporter);
    status = client.Run(address);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "socket-baseline: %s\n", status.ToString().c_str());
    return 1;
  }
  reporter.Finish();
  return 0;
}

}  // namespace
}  // namespace rdmaps::perf

int main(int argc, char** argv) {
  return rdmaps::tools::GuardedMain("socket-baseline",
                                    [&] { return rdmaps::perf::Main(argc, argv); });
}

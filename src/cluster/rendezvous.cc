#include "src/cluster/rendezvous.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "src/base/fd.h"
#include "src/base/host_port.h"
#include "src/base/log.h"
#include "src/base/secret.h"
#include "src/cluster/resolve.h"
#include "transport/transport.h"

namespace rdmaps::internal {

RendezvousRootCounters& TEST_RendezvousRootCounters() {
  static RendezvousRootCounters counters;
  return counters;
}

namespace {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

// After its own deadline a joiner waits this much longer for the root's
// answer, so that the root's message naming the missing ranks gets through.
constexpr std::chrono::seconds kAnswerGrace{3};
// How long the root leaves its listener out of poll when it could not shed
// a connection at the descriptor limit (not even with its reserve).
constexpr std::chrono::milliseconds kShedBackoff{20};

int MillisUntil(TimePoint t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1000 * 1000));
}

std::string Seconds(std::chrono::steady_clock::duration d) {
  std::ostringstream os;
  os.precision(3);
  os << std::chrono::duration<double>(d).count() << " s";
  return os.str();
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

std::string EncodeHello(HelloHeader h, std::string_view addr) {
  HelloHeader w = h;
  w.magic = htobe32(h.magic);
  w.version = htobe16(h.version);
  w.reserved0 = 0;
  w.rank = static_cast<std::int32_t>(htobe32(static_cast<std::uint32_t>(h.rank)));
  w.world_size = htobe32(h.world_size);
  w.num_servers = htobe32(h.num_servers);
  w.num_workers = htobe32(h.num_workers);
  w.addr_len = htobe32(static_cast<std::uint32_t>(addr.size()));
  w.reserved1 = 0;
  std::string out(sizeof(w), '\0');
  std::memcpy(out.data(), &w, sizeof(w));
  out.append(addr);
  return out;
}

HelloHeader DecodeHello(const char* p) {
  HelloHeader h;
  std::memcpy(&h, p, sizeof(h));
  h.magic = be32toh(h.magic);
  h.version = be16toh(h.version);
  h.rank = static_cast<std::int32_t>(be32toh(static_cast<std::uint32_t>(h.rank)));
  h.world_size = be32toh(h.world_size);
  h.num_servers = be32toh(h.num_servers);
  h.num_workers = be32toh(h.num_workers);
  h.addr_len = be32toh(h.addr_len);
  return h;
}

Nonce ToNonce(const std::uint8_t (&a)[16]) {
  Nonce n;
  std::copy(std::begin(a), std::end(a), n.begin());
  return n;
}

void PutU64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// The joiner's proof (h in host order).
Mac HelloMac(const SecretKey& key, const HelloHeader& h, const Nonce& root_nonce,
             std::string_view address) {
  std::vector<std::uint8_t> bound;
  for (std::uint64_t v : {std::uint64_t{h.role}, std::uint64_t{h.world_size},
                          std::uint64_t{h.num_servers}, std::uint64_t{h.num_workers}}) {
    PutU64(bound, v);
  }
  bound.insert(bound.end(), address.begin(), address.end());
  HandshakeTranscript t;
  t.protocol = "rendezvous";
  t.version = h.version;
  t.direction = MacDirection::kConnector;
  t.connector_nonce = ToNonce(h.nonce);
  t.acceptor_nonce = root_nonce;
  t.connector_id = static_cast<std::uint32_t>(h.rank);
  t.bound = bound;
  return HandshakeMac(key, t);
}

// The root's proof over one answer.
Mac AnswerMac(const SecretKey& key, const Nonce& joiner_nonce, const Nonce& root_nonce,
              std::int32_t rank, std::uint8_t code, std::uint8_t role, std::int32_t index,
              std::uint32_t num_servers, std::uint32_t num_workers, std::string_view body) {
  std::vector<std::uint8_t> bound;
  for (std::uint64_t v : {std::uint64_t{code}, std::uint64_t{role},
                          static_cast<std::uint64_t>(static_cast<std::uint32_t>(index)),
                          std::uint64_t{num_servers}, std::uint64_t{num_workers}}) {
    PutU64(bound, v);
  }
  bound.insert(bound.end(), body.begin(), body.end());
  HandshakeTranscript t;
  t.protocol = "rendezvous";
  t.version = kRendezvousVersion;
  t.direction = MacDirection::kAcceptor;
  t.connector_nonce = joiner_nonce;
  t.acceptor_nonce = root_nonce;
  t.connector_id = static_cast<std::uint32_t>(rank);
  t.bound = bound;
  return HandshakeMac(key, t);
}

std::string EncodeChallenge(const Nonce& nonce) {
  ChallengeHeader c{};
  c.magic = htobe32(kRendezvousChallengeMagic);
  c.version = htobe16(kRendezvousVersion);
  std::copy(nonce.begin(), nonce.end(), c.nonce);
  return std::string(reinterpret_cast<const char*>(&c), sizeof(c));
}

// `key` and the nonces: the MAC that lets the process trust the answer.
std::string EncodeAnswer(const Status& status, Role role, int index, int num_servers,
                         int num_workers, std::string_view body, const SecretKey& key,
                         const Nonce& joiner_nonce, const Nonce& root_nonce, std::int32_t rank) {
  AnswerHeader w{};
  w.magic = htobe32(kRendezvousAnswerMagic);
  w.version = htobe16(kRendezvousVersion);
  w.code = static_cast<std::uint8_t>(status.code());
  w.role = static_cast<std::uint8_t>(role);
  w.index = static_cast<std::int32_t>(htobe32(static_cast<std::uint32_t>(index)));
  w.num_servers = htobe32(static_cast<std::uint32_t>(num_servers));
  w.num_workers = htobe32(static_cast<std::uint32_t>(num_workers));
  std::string payload = status.ok() ? std::string(body) : status.message();
  w.body_len = htobe32(static_cast<std::uint32_t>(payload.size()));
  const Mac mac = AnswerMac(key, joiner_nonce, root_nonce, rank, w.code, w.role, index,
                            static_cast<std::uint32_t>(num_servers),
                            static_cast<std::uint32_t>(num_workers), payload);
  std::copy(mac.begin(), mac.end(), w.mac);
  std::string out(sizeof(w), '\0');
  std::memcpy(out.data(), &w, sizeof(w));
  out += payload;
  return out;
}

// Writes all of `data` by `deadline` (small messages: the socket buffer takes
// them at once in practice).
Status SendAll(int fd, std::string_view data, TimePoint deadline) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, MillisUntil(deadline)) <= 0) {
        return TimedOutError("rendezvous: sending timed out");
      }
      continue;
    }
    return ErrnoError("rendezvous: send", errno);
  }
  return Status::OK();
}

// Reads exactly `len` bytes by `deadline`. Unavailable on EOF.
Status RecvAll(int fd, char* out, std::size_t len, TimePoint deadline, std::string_view peer) {
  while (len > 0) {
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, MillisUntil(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return TimedOutError("no answer");
    ssize_t n = recv(fd, out, len, 0);
    if (n > 0) {
      out += n;
      len -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) {
      return UnavailableError("rendezvous root " + std::string(peer) +
                              " closed the connection without answering (did it exit? see its "
                              "log)");
    }
    return ErrnoError("rendezvous: recv from " + std::string(peer), errno);
  }
  return Status::OK();
}

bool IsLoopback(std::string_view host) {
  return host == "localhost" || host.starts_with("127.") || host == "::1";
}

// Binds the root's listening socket. `host` decides loopback vs all
// interfaces (binding a host name can land on Debian's 127.0.1.1).
Result<Fd> ListenOn(std::string_view host, int port) {
  bool loop = IsLoopback(host);
  Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return ErrnoError("rendezvous: socket", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(port));
  sa.sin_addr.s_addr = htonl(loop ? INADDR_LOOPBACK : INADDR_ANY);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    int err = errno;
    if (err == EADDRINUSE) {
      return UnavailableError("rendezvous: port " + std::to_string(port) +
                              " is already in use on this host (another job, or a rank 0 "
                              "still running?); pass --rendezvous=HOST:OTHER_PORT");
    }
    return ErrnoError("rendezvous: bind port " + std::to_string(port), err);
  }
  if (listen(fd.get(), 1024) != 0) return ErrnoError("rendezvous: listen", errno);
  SetNonBlocking(fd.get());
  return fd;
}

int BoundPort(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return ntohs(sa.sin_port);
}

Status PublishFile(const std::string& path, const std::string& address) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << address << "\n";
    if (!out) {
      return Status(StatusCode::kIOError,
                    "rendezvous: cannot write " + tmp +
                        "; --rendezvous=file:PATH needs a writable directory every rank sees");
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoError("rendezvous: rename " + tmp + " to " + path, errno);
  }
  return Status::OK();
}

std::string RankName(bool ranked, int num_servers, int rank) {
  if (!ranked) return "?";
  return "rank " + std::to_string(rank) + " (" +
         (rank < num_servers ? "ps" + std::to_string(rank)
                             : "worker" + std::to_string(rank - num_servers)) +
         ")";
}

// --- Root ------------------------------------------------------------------

struct Joiner {
  Fd fd;
  std::string in;
  bool hello = false;
  HelloHeader header{};
  std::string address;
  std::string peer;    // IP:port as seen by the root, for messages.
  Nonce root_nonce{};  // sent in its challenge
  TimePoint accepted_at{};
  std::uint64_t accept_seq = 0;
};

Result<RendezvousResult> RunRoot(const ClusterLayout& layout, std::string_view self_address,
                                 TimePoint deadline) {
  const TimePoint start = Clock::now();
  const bool ranked = layout.rank >= 0;
  const int S = layout.num_servers, W = layout.num_workers;
  const SecretKey key = SecretKey::FromSecret(layout.job_token);
  // Given up to accept (and close) a connection when no descriptor is free.
  // Taken before the root is announced: a process that exhausts its
  // descriptors once it knows the root is there leaves it one.
  Fd reserve(::open("/dev/null", O_RDONLY | O_CLOEXEC));

  Fd listener;
  std::string where;
  if (layout.rendezvous.starts_with("file:")) {
    RDMAPS_ASSIGN_OR_RETURN(listener, ListenOn(layout.advertise_host, 0));
    where = JoinHostPort(layout.advertise_host, BoundPort(listener.get()));
    RDMAPS_RETURN_IF_ERROR(PublishFile(layout.rendezvous.substr(5), where));
  } else {
    RDMAPS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(layout.rendezvous, "--rendezvous"));
    RDMAPS_ASSIGN_OR_RETURN(listener, ListenOn(hp.host, hp.port));
    where = layout.rendezvous;
  }
  RDMAPS_LOG(INFO) << "rendezvous root listening at " << where << ", expecting " << S << " ps + "
                   << W << " workers";

  // An entry whose fd is closed is in none of the maps below and is reused
  // by the next accepted socket, so conns stays as small as the sockets
  // open at once: at most kMaxRendezvousUnauthenticated without a hello,
  // plus the processes of the job.
  std::vector<Joiner> conns;
  std::uint64_t accept_seq = 0;
  // Until then the listener is out of poll: a connection could not be shed.
  TimePoint listen_again{};
  RendezvousRootCounters& counters = TEST_RendezvousRootCounters();
  // Arrived processes: rank -> conn index (ranked); arrival order (ps-lite).
  std::map<int, std::size_t> by_rank;
  std::vector<std::size_t> servers_in, workers_in;
  Status failure;

  auto arrived = [&]() {
    return ranked ? static_cast<int>(by_rank.size())
                  : static_cast<int>(servers_in.size() + workers_in.size());
  };
  const int expected = ranked ? layout.world_size - 1 : S + W;

  auto answer_error = [&](Joiner& j, const Status& s) {
    (void)SendAll(j.fd.get(),
                  EncodeAnswer(s, Role::kWorker, -1, S, W, "", key, ToNonce(j.header.nonce),
                               j.root_nonce, j.header.rank),
                  Clock::now() + std::chrono::seconds(1));
    j.fd.Reset();
  };
  auto forget = [&](std::size_t ci) {
    for (auto it = by_rank.begin(); it != by_rank.end(); ++it) {
      if (it->second == ci) {
        by_rank.erase(it);
        break;
      }
    }
    std::erase(servers_in, ci);
    std::erase(workers_in, ci);
  };

  // Validates a complete Hello; returns a job-wide failure (fail everyone) or
  // OK. Per-process refusals are answered here.
  auto on_hello = [&](std::size_t ci) -> Status {
    Joiner& j = conns[ci];
    const HelloHeader& h = j.header;
    std::string who = ranked ? RankName(true, S, h.rank) : std::string(RoleName(Role(h.role)));
    who += " from " + j.peer;
    if (h.version != kRendezvousVersion) {
      answer_error(
          j, FailedPreconditionError("rendezvous protocol version " + std::to_string(h.version) +
                                     " != root's " + std::to_string(kRendezvousVersion) +
                                     "; run the same rdmaps version everywhere"));
      RDMAPS_LOG(WARNING) << "rendezvous: refused " << who << ": protocol version " << h.version;
      return Status::OK();
    }
    if (!ConstantTimeEqual(HelloMac(key, h, j.root_nonce, j.address), h.mac)) {
      answer_error(j, PermissionDeniedError(
                          "rendezvous root " + where +
                          " refused this process: job secret mismatch (another job on the same "
                          "port, or another secret); " +
                          transport::kJobSecretFix));
      RDMAPS_LOG(WARNING) << "rendezvous: refused " << who
                          << ": job secret mismatch (its MAC does not verify); "
                          << transport::kJobSecretFix;
      return Status::OK();
    }
    if (static_cast<int>(h.num_servers) != S || static_cast<int>(h.num_workers) != W ||
        (ranked && static_cast<int>(h.world_size) != layout.world_size)) {
      return InvalidArgumentError(
          "rendezvous: " + who + " has a different job shape: " + std::to_string(h.num_servers) +
          " ps + " + std::to_string(h.num_workers) + " workers (world " +
          std::to_string(h.world_size) + "), root has " + std::to_string(S) + " ps + " +
          std::to_string(W) + " workers (world " + std::to_string(layout.world_size) +
          "); give every process the same --num_servers");
    }
    if (ranked) {
      if (h.rank <= 0 || h.rank >= layout.world_size) {
        return InvalidArgumentError("rendezvous: " + who + " has a rank outside 1.." +
                                    std::to_string(layout.world_size - 1) +
                                    " (rank 0 is this root)");
      }
      auto [it, inserted] = by_rank.emplace(h.rank, ci);
      if (!inserted) {
        return InvalidArgumentError("rendezvous: rank " + std::to_string(h.rank) +
                                    " joined twice (from " + conns[it->second].peer + " and " +
                                    j.peer + "); two processes share a rank");
      }
    } else {
      auto& list = Role(h.role) == Role::kServer ? servers_in : workers_in;
      int limit = Role(h.role) == Role::kServer ? S : W;
      if (Role(h.role) == Role::kScheduler || h.rank != -1) {
        return InvalidArgumentError("rendezvous: unexpected " + who +
                                    " (a second scheduler, or a ranked process)");
      }
      if (static_cast<int>(list.size()) >= limit) {
        return InvalidArgumentError("rendezvous: one " + std::string(RoleName(Role(h.role))) +
                                    " too many (" + who + "): the job expects " +
                                    std::to_string(limit) + "; check DMLC_NUM_SERVER/WORKER");
      }
      list.push_back(ci);
    }
    return Status::OK();
  };

  while (failure.ok() && arrived() < expected) {
    if (Clock::now() >= deadline) break;
    std::vector<pollfd> pfds;
    const bool listening = Clock::now() >= listen_again;
    pfds.push_back({listener.get(), static_cast<short>(listening ? POLLIN : 0), 0});
    for (auto& j : conns)
      pfds.push_back({j.fd.get(), static_cast<short>(j.fd.get() >= 0 ? POLLIN : 0), 0});
    int timeout = std::min(MillisUntil(deadline), 1000);
    if (!listening) timeout = std::min(timeout, MillisUntil(listen_again) + 1);
    int r = poll(pfds.data(), pfds.size(), timeout);
    if (r < 0 && errno != EINTR) return ErrnoError("rendezvous: poll", errno);
    if (r <= 0) continue;
    if (pfds[0].revents & POLLIN) {
      while (true) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        int c = accept4(listener.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) {
          if (errno == EMFILE || errno == ENFILE) {
            // The connection stays queued and the listener readable: shed
            // it, or poll would wake us at once until the deadline.
            counters.accept_errors.fetch_add(1);
            RDMAPS_LOG_EVERY_T(WARNING, 1.0)
                << "rendezvous: out of file descriptors ("
                << (errno == EMFILE ? "EMFILE: raise `ulimit -n`" : "ENFILE: the system's limit")
                << "); closing the connections that arrive until some are free";
            reserve.Reset();
            int shed = accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (shed >= 0) {
              // Counted before the close: a peer that sees it closed sees it counted.
              counters.fd_sheds.fetch_add(1);
              ::close(shed);
            } else {
              // Not even the reserve was there (another thread holds every
              // descriptor): the connection stays queued, and the listener
              // readable. Look again in a moment rather than at once.
              listen_again = Clock::now() + kShedBackoff;
            }
            reserve.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
          }
          break;
        }
        // Sockets without a verified hello are bounded: past the cap the
        // oldest goes, so idle sockets cannot lock the job's processes out.
        std::size_t unauthenticated = 0, oldest = conns.size(), free_slot = conns.size();
        for (std::size_t k = 0; k < conns.size(); ++k) {
          if (conns[k].fd.get() < 0) {
            if (free_slot == conns.size()) free_slot = k;
            continue;
          }
          if (conns[k].hello) continue;
          ++unauthenticated;
          if (oldest == conns.size() || conns[k].accept_seq < conns[oldest].accept_seq) oldest = k;
        }
        if (unauthenticated >= kMaxRendezvousUnauthenticated) {
          RDMAPS_LOG_EVERY_T(WARNING, 1.0)
              << "rendezvous: " << unauthenticated
              << " sockets have not sent a hello; dropping the oldest, from " << conns[oldest].peer;
          conns[oldest].fd.Reset();
          counters.dropped_oldest.fetch_add(1);
          if (free_slot == conns.size() || oldest < free_slot) free_slot = oldest;
        }
        Joiner j;
        j.fd = Fd(c);
        j.accepted_at = Clock::now();
        j.accept_seq = ++accept_seq;
        char host[NI_MAXHOST] = "?", serv[NI_MAXSERV] = "?";
        getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV);
        j.peer = std::string(host) + ":" + serv;
        j.root_nonce = RandomNonce();
        // 24 bytes into a fresh socket's buffer: a short send only costs
        // that process its rendezvous.
        const std::string challenge = EncodeChallenge(j.root_nonce);
        (void)send(j.fd.get(), challenge.data(), challenge.size(), MSG_NOSIGNAL);
        if (free_slot < conns.size()) {
          conns[free_slot] = std::move(j);
        } else {
          conns.push_back(std::move(j));
        }
      }
    }
    // Each socket has kRendezvousHelloTimeout to send its hello.
    const TimePoint now = Clock::now();
    for (auto& j : conns) {
      if (j.fd.get() >= 0 && !j.hello && now - j.accepted_at > kRendezvousHelloTimeout) {
        RDMAPS_LOG_EVERY_T(WARNING, 1.0)
            << "rendezvous: " << j.peer << " sent no hello within "
            << std::chrono::duration_cast<std::chrono::seconds>(kRendezvousHelloTimeout).count()
            << " s; dropped";
        j.fd.Reset();
        counters.hello_timeouts.fetch_add(1);
      }
    }
    for (std::size_t i = 1; i < pfds.size() && failure.ok(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      std::size_t ci = i - 1;
      Joiner& j = conns[ci];
      // Dropped, or its slot reused, since the poll.
      if (j.fd.get() < 0 || j.fd.get() != pfds[i].fd) continue;
      char buf[4096];
      ssize_t n = recv(j.fd.get(), buf, sizeof(buf), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        // Gone before the answer: it no longer counts as arrived.
        if (j.hello) {
          RDMAPS_LOG(WARNING) << "rendezvous: "
                              << (ranked ? RankName(true, S, j.header.rank) : j.peer)
                              << " disconnected while waiting";
        }
        forget(ci);
        j.fd.Reset();
        continue;
      }
      if (j.hello) continue;  // Nothing more is expected; ignore.
      j.in.append(buf, static_cast<std::size_t>(n));
      if (j.in.size() < sizeof(HelloHeader)) continue;
      // Wait for the whole hello (its address length bounded first), then
      // parse exactly its bytes.
      const HelloHeader peek = DecodeHello(j.in.data());
      const std::size_t whole =
          sizeof(HelloHeader) + std::min<std::size_t>(peek.addr_len, kMaxRendezvousAddress);
      if (peek.magic == kRendezvousHelloMagic && peek.addr_len <= kMaxRendezvousAddress &&
          j.in.size() < whole) {
        continue;
      }
      Result<RendezvousHello> parsed = ParseRendezvousHello(
          std::as_bytes(std::span<const char>(j.in.data(), std::min(j.in.size(), whole))));
      if (!parsed.ok()) {
        RDMAPS_LOG(WARNING) << "rendezvous: dropped " << j.peer << ": " << parsed.status();
        answer_error(j, parsed.status());
        continue;
      }
      j.header = parsed->header;
      j.address = std::move(parsed->address);
      j.hello = true;
      failure = on_hello(ci);
    }
  }

  RendezvousResult mine;
  mine.role = ranked ? Role::kServer : Role::kScheduler;
  mine.index = ranked ? 0 : -1;

  if (failure.ok() && arrived() < expected) {
    std::string missing;
    int count = 0;
    if (ranked) {
      for (int rk = 1; rk < layout.world_size; ++rk) {
        if (by_rank.count(rk)) continue;
        if (count < 32) missing += (missing.empty() ? "" : ", ") + RankName(true, S, rk);
        ++count;
      }
      if (count > 32) missing += ", ...";
    } else {
      missing = std::to_string(S - static_cast<int>(servers_in.size())) + " of " +
                std::to_string(S) + " ps and " +
                std::to_string(W - static_cast<int>(workers_in.size())) + " of " +
                std::to_string(W) + " workers";
      count = expected - arrived();
    }
    failure = TimedOutError("rendezvous at " + where + " (" + layout.source +
                            "): " + std::to_string(count) + " process(es) never arrived within " +
                            Seconds(Clock::now() - start) + ": " + missing +
                            "; check that they were started, and with the same layout");
  }

  if (!failure.ok()) {
    for (auto& j : conns) {
      if (j.fd.get() >= 0 && j.hello) answer_error(j, failure);
    }
    return failure;
  }

  // Everyone is here: assemble the lists.
  std::vector<std::string> servers(static_cast<std::size_t>(S)),
      workers(static_cast<std::size_t>(W));
  std::vector<std::pair<std::size_t, int>> assignment;  // conn -> index
  if (ranked) {
    servers[0] = std::string(self_address);
    for (auto [rk, ci] : by_rank) {
      if (rk < S) {
        servers[static_cast<std::size_t>(rk)] = conns[ci].address;
      } else {
        workers[static_cast<std::size_t>(rk - S)] = conns[ci].address;
      }
      assignment.push_back({ci, rk < S ? rk : rk - S});
    }
  } else {
    for (std::size_t k = 0; k < servers_in.size(); ++k) {
      servers[k] = conns[servers_in[k]].address;
      assignment.push_back({servers_in[k], static_cast<int>(k)});
    }
    for (std::size_t k = 0; k < workers_in.size(); ++k) {
      workers[k] = conns[workers_in[k]].address;
      assignment.push_back({workers_in[k], static_cast<int>(k)});
    }
  }
  std::map<std::string, int> seen;
  for (int s = 0; s < S; ++s) {
    const std::string& a = servers[static_cast<std::size_t>(s)];
    auto hp = ParseHostPort(a, "rendezvous: ps" + std::to_string(s) + " address");
    if (hp.ok() && hp->port == 0) {
      hp = Status(InvalidArgumentError("rendezvous: ps" + std::to_string(s) +
                                       " reported port 0; a server must report the address "
                                       "it actually listens on"));
    }
    if (!hp.ok()) {
      failure = hp.status();
      break;
    }
    auto [it, inserted] = seen.emplace(a, s);
    if (!inserted) {
      failure = InvalidArgumentError("rendezvous: ps" + std::to_string(it->second) + " and ps" +
                                     std::to_string(s) + " both report " + a +
                                     "; every server needs its own address");
      break;
    }
  }
  if (!failure.ok()) {
    for (auto& j : conns) {
      if (j.fd.get() >= 0 && j.hello) answer_error(j, failure);
    }
    return failure;
  }
  std::string body;
  for (const auto& s : servers) body += s + "\n";
  for (const auto& w : workers) body += w + "\n";
  for (auto [ci, idx] : assignment) {
    Joiner& j = conns[ci];
    Status s = SendAll(j.fd.get(),
                       EncodeAnswer(Status::OK(), Role(j.header.role), idx, S, W, body, key,
                                    ToNonce(j.header.nonce), j.root_nonce, j.header.rank),
                       Clock::now() + std::chrono::seconds(2));
    if (!s.ok()) RDMAPS_LOG(WARNING) << "rendezvous: answering " << j.peer << ": " << s;
  }
  mine.servers = std::move(servers);
  mine.workers = std::move(workers);
  RDMAPS_LOG(INFO) << "rendezvous complete: " << S << " ps + " << W << " workers in "
                   << Seconds(Clock::now() - start);
  return mine;
}

// --- Joiner ----------------------------------------------------------------

// Connects to host:port by `deadline` (one attempt). IOError/Unavailable.
Result<Fd> ConnectOnce(const HostPort& hp, TimePoint deadline) {
  RDMAPS_ASSIGN_OR_RETURN(AddrInfoList res, ResolveHostPort(hp, AddressUse::kConnect));
  Status last = UnavailableError("no address for " + hp.host);
  for (addrinfo* ai = res.get(); ai; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) continue;
    SetNonBlocking(fd.get());
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) return fd;
    if (errno != EINPROGRESS) {
      last = ErrnoError("connect", errno);
      continue;
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int r = poll(&p, 1, std::min(MillisUntil(deadline), 2000));
    if (r <= 0) {
      last = TimedOutError("connect timed out");
      continue;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) return fd;
    last = ErrnoError("connect", err);
  }
  return last;
}

Result<RendezvousResult> RunJoin(const ClusterLayout& layout, std::string_view self_address,
                                 TimePoint deadline) {
  const TimePoint start = Clock::now();
  const bool ranked = layout.rank >= 0;
  std::string me =
      ranked ? RankName(true, layout.num_servers, layout.rank) : std::string(RoleName(layout.role));
  std::string root_name = ranked ? "rank 0" : "the scheduler";
  std::string address(self_address.empty() ? layout.advertise_host : self_address);
  if (address.size() > kMaxRendezvousAddress) {
    return InvalidArgumentError("rendezvous: address " + address + " is too long");
  }
  HelloHeader h{};
  h.magic = kRendezvousHelloMagic;
  h.version = kRendezvousVersion;
  h.role = static_cast<std::uint8_t>(layout.role);
  h.rank = layout.rank;
  h.world_size = static_cast<std::uint32_t>(layout.world_size);
  h.num_servers = static_cast<std::uint32_t>(layout.num_servers);
  h.num_workers = static_cast<std::uint32_t>(layout.num_workers);
  const SecretKey key = SecretKey::FromSecret(layout.job_token);

  Status last = UnavailableError("never tried");
  std::string root = layout.rendezvous;
  auto backoff = std::chrono::milliseconds(10);
  // Before the next try: wait out the backoff (never past the deadline).
  auto pause = [&] {
    std::this_thread::sleep_for(
        std::min<std::chrono::nanoseconds>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  };
  while (Clock::now() < deadline) {
    if (layout.rendezvous.starts_with("file:")) {
      std::ifstream in(layout.rendezvous.substr(5));
      std::string line;
      if (!(in >> line)) {
        last = NotFoundError("the rendezvous file " + layout.rendezvous.substr(5) +
                             " does not exist yet");
        pause();
        continue;
      }
      root = line;
    }
    auto hp = ParseHostPort(root, "rendezvous root");
    if (!hp.ok()) return hp.status();
    auto fd = ConnectOnce(*hp, deadline);
    if (!fd.ok()) {
      last = fd.status();
      pause();
      continue;
    }
    const TimePoint answer_by = deadline + kAnswerGrace;
    // The root's challenge, then our hello with its proof.
    std::array<std::byte, sizeof(ChallengeHeader)> cbuf;
    Status s =
        RecvAll(fd->get(), reinterpret_cast<char*>(cbuf.data()), cbuf.size(), deadline, root);
    Result<std::array<std::uint8_t, 16>> root_nonce =
        s.ok() ? ParseRendezvousChallenge(cbuf) : Result<std::array<std::uint8_t, 16>>(s);
    if (!root_nonce.ok()) {
      Status bad = s.ok() ? FailedPreconditionError("rendezvous: " + root +
                                                    " is not an rdmaps rendezvous root (" +
                                                    root_nonce.status().message() + ")")
                          : s;
      if (layout.rendezvous.starts_with("file:")) {  // maybe a stale file: read it again
        last = bad;
        pause();
        continue;
      }
      return bad;
    }
    const Nonce mine = RandomNonce();
    std::copy(mine.begin(), mine.end(), h.nonce);
    const Mac proof = HelloMac(key, h, *root_nonce, address);
    std::copy(proof.begin(), proof.end(), h.mac);
    RDMAPS_RETURN_IF_ERROR(SendAll(fd->get(), EncodeHello(h, address), deadline));
    char hdr[sizeof(AnswerHeader)];
    s = RecvAll(fd->get(), hdr, sizeof(hdr), answer_by, root);
    if (s.code() == StatusCode::kTimedOut) {
      return TimedOutError("rendezvous: " + me + " reached " + root_name + " at " + root +
                           " but got no answer within " + Seconds(Clock::now() - start) +
                           "; the root names missing ranks in its own log");
    }
    AnswerHeader w;
    std::memcpy(&w, hdr, sizeof(w));
    if (!s.ok() || be32toh(w.magic) != kRendezvousAnswerMagic) {
      Status bad = s.ok() ? FailedPreconditionError("rendezvous: " + root +
                                                    " is not an rdmaps rendezvous root (bad magic)")
                          : s;
      // A file left by an earlier job can name a stale address: the new
      // root replaces it, so read it again.
      if (layout.rendezvous.starts_with("file:")) {
        last = bad;
        pause();
        continue;
      }
      return bad;
    }
    if (be16toh(w.version) != kRendezvousVersion) {
      return FailedPreconditionError("rendezvous protocol version mismatch: root " + root +
                                     " speaks " + std::to_string(be16toh(w.version)) +
                                     ", this process " + std::to_string(kRendezvousVersion) +
                                     "; run the same rdmaps version everywhere");
    }
    std::uint32_t body_len = be32toh(w.body_len);
    if (body_len > kMaxRendezvousBody) return DataLossError("rendezvous: oversized answer");
    std::string body(body_len, '\0');
    RDMAPS_RETURN_IF_ERROR(RecvAll(fd->get(), body.data(), body.size(), answer_by, root));
    auto code = static_cast<StatusCode>(w.code);
    if (code > StatusCode::kInternal) return DataLossError("rendezvous: bad answer code");
    if (code != StatusCode::kOk) return Status(code, body);
    const Mac want =
        AnswerMac(key, mine, *root_nonce, h.rank, w.code, w.role,
                  static_cast<std::int32_t>(be32toh(static_cast<std::uint32_t>(w.index))),
                  be32toh(w.num_servers), be32toh(w.num_workers), body);
    if (!ConstantTimeEqual(want, w.mac)) {
      return PermissionDeniedError("rendezvous: the root at " + root +
                                   " did not prove knowledge of this job's secret (MAC "
                                   "mismatch); " +
                                   transport::kJobSecretFix);
    }
    AnswerHeader host = w;  // in host order, for the checks
    host.index = static_cast<std::int32_t>(be32toh(static_cast<std::uint32_t>(w.index)));
    host.num_servers = be32toh(w.num_servers);
    host.num_workers = be32toh(w.num_workers);
    host.body_len = body_len;
    return RendezvousResultOf(host, body, root);
  }
  return TimedOutError("rendezvous: " + me + " could not reach " + root_name + " at " + root +
                       " within " + Seconds(Clock::now() - start) +
                       " (last error: " + last.ToString() + "); is " + root_name +
                       " running, and is its port reachable from here?");
}

}  // namespace

Result<std::array<std::uint8_t, 16>> ParseRendezvousChallenge(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(ChallengeHeader)) {
    return InvalidArgumentError("rendezvous challenge of " + std::to_string(bytes.size()) +
                                " bytes");
  }
  ChallengeHeader c;
  std::memcpy(&c, bytes.data(), sizeof(c));
  if (be32toh(c.magic) != kRendezvousChallengeMagic) {
    return InvalidArgumentError("bad rendezvous challenge magic");
  }
  if (be16toh(c.version) != kRendezvousVersion) {
    return InvalidArgumentError("rendezvous protocol version " +
                                std::to_string(be16toh(c.version)) + ", this process speaks " +
                                std::to_string(kRendezvousVersion) +
                                "; run the same rdmaps version everywhere");
  }
  std::array<std::uint8_t, 16> n;
  std::copy(std::begin(c.nonce), std::end(c.nonce), n.begin());
  return n;
}

Result<RendezvousHello> ParseRendezvousHello(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(HelloHeader)) {
    return InvalidArgumentError("rendezvous hello of " + std::to_string(bytes.size()) + " bytes");
  }
  RendezvousHello out;
  out.header = DecodeHello(reinterpret_cast<const char*>(bytes.data()));
  if (out.header.magic != kRendezvousHelloMagic) {
    return InvalidArgumentError("not an rdmaps rendezvous hello");
  }
  if (out.header.addr_len > kMaxRendezvousAddress ||
      bytes.size() != sizeof(HelloHeader) + out.header.addr_len) {
    return InvalidArgumentError("rendezvous hello with an address of " +
                                std::to_string(out.header.addr_len) + " bytes (at most " +
                                std::to_string(kMaxRendezvousAddress) + ")");
  }
  if (out.header.role > static_cast<std::uint8_t>(Role::kScheduler)) {
    return InvalidArgumentError("rendezvous hello with role " + std::to_string(out.header.role));
  }
  out.address.assign(reinterpret_cast<const char*>(bytes.data()) + sizeof(HelloHeader),
                     out.header.addr_len);
  return out;
}

Result<RendezvousAnswer> ParseRendezvousAnswer(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(AnswerHeader)) {
    return InvalidArgumentError("rendezvous answer of " + std::to_string(bytes.size()) + " bytes");
  }
  RendezvousAnswer out;
  std::memcpy(&out.header, bytes.data(), sizeof(AnswerHeader));
  AnswerHeader& h = out.header;
  h.magic = be32toh(h.magic);
  h.version = be16toh(h.version);
  h.index = static_cast<std::int32_t>(be32toh(static_cast<std::uint32_t>(h.index)));
  h.num_servers = be32toh(h.num_servers);
  h.num_workers = be32toh(h.num_workers);
  h.body_len = be32toh(h.body_len);
  if (h.magic != kRendezvousAnswerMagic) return InvalidArgumentError("bad rendezvous answer magic");
  if (h.code > static_cast<std::uint8_t>(StatusCode::kInternal)) {
    return InvalidArgumentError("rendezvous answer code " + std::to_string(h.code));
  }
  if (bytes.size() != sizeof(AnswerHeader) + std::size_t{h.body_len}) {
    return InvalidArgumentError("rendezvous answer body of " + std::to_string(h.body_len) +
                                " bytes in " + std::to_string(bytes.size()) + " bytes");
  }
  out.body.assign(reinterpret_cast<const char*>(bytes.data()) + sizeof(AnswerHeader), h.body_len);
  return out;
}

Result<RendezvousResult> RendezvousResultOf(const AnswerHeader& h, std::string_view body,
                                            std::string_view root) {
  const std::string from = "rendezvous: answer from " + std::string(root);
  if (h.body_len != body.size() || body.size() > kMaxRendezvousBody) {
    return DataLossError(from + " has a body of " + std::to_string(body.size()) +
                         " bytes, its header says " + std::to_string(h.body_len));
  }
  if (h.code > static_cast<std::uint8_t>(StatusCode::kInternal)) {
    return DataLossError(from + " carries unknown status code " + std::to_string(h.code));
  }
  if (h.code != 0) {
    // The root's own error, cut so that a hostile root cannot flood a log.
    return Status(static_cast<StatusCode>(h.code), std::string(body.substr(0, 4096)));
  }
  // Counts of at most 2^24 (one line each in a body of at most 2^24 bytes)
  // and an index inside its role: no sum or subscript below can wrap.
  if (h.num_servers < 1 || h.num_servers > kMaxRendezvousBody || h.num_workers < 1 ||
      h.num_workers > kMaxRendezvousBody) {
    return DataLossError(from + " gives " + std::to_string(h.num_servers) + " servers and " +
                         std::to_string(h.num_workers) + " workers");
  }
  if (h.role != static_cast<std::uint8_t>(Role::kServer) &&
      h.role != static_cast<std::uint8_t>(Role::kWorker)) {
    return DataLossError(from + " assigns unknown role " + std::to_string(h.role));
  }
  const std::uint32_t of =
      h.role == static_cast<std::uint8_t>(Role::kServer) ? h.num_servers : h.num_workers;
  if (h.index < 0 || static_cast<std::uint32_t>(h.index) >= of) {
    return DataLossError(from + " assigns index " + std::to_string(h.index) + " of " +
                         std::to_string(of));
  }
  std::vector<std::string> all;
  std::size_t start = 0;
  while (start < body.size()) {
    std::size_t nl = body.find('\n', start);
    if (nl == std::string_view::npos) nl = body.size();
    all.emplace_back(body.substr(start, nl - start));
    start = nl + 1;
  }
  const std::uint64_t expected = std::uint64_t{h.num_servers} + h.num_workers;
  if (all.size() != expected) {
    return DataLossError(from + " lists " + std::to_string(all.size()) + " addresses, expected " +
                         std::to_string(expected));
  }
  RendezvousResult out;
  out.role = static_cast<Role>(h.role);
  out.index = h.index;
  out.servers.assign(all.begin(), all.begin() + h.num_servers);
  out.workers.assign(all.begin() + h.num_servers, all.end());
  return out;
}

Result<RendezvousResult> RunRendezvous(const ClusterLayout& layout, std::string_view self_address,
                                       std::chrono::steady_clock::time_point deadline) {
  bool root = layout.rank == 0 || layout.role == Role::kScheduler;
  if (root) return RunRoot(layout, self_address, deadline);
  return RunJoin(layout, self_address, deadline);
}

}  // namespace rdmaps::internal

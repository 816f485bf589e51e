#include "transport/tcp/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

namespace rdmaps::transport::tcp {

Result<ResolvedAddress> Resolve(const HostPort& hp, std::string_view original) {
  ResolvedAddress out;
  in_addr a4;
  in6_addr a6;
  if (!hp.bracketed && ::inet_pton(AF_INET, hp.host.c_str(), &a4) == 1) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&out.storage);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(hp.port);
    sin->sin_addr = a4;
    out.length = sizeof(sockaddr_in);
    return out;
  }
  if (hp.bracketed && ::inet_pton(AF_INET6, hp.host.c_str(), &a6) == 1) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(hp.port);
    sin6->sin6_addr = a6;
    out.length = sizeof(sockaddr_in6);
    return out;
  }
  auto ai = ResolveHostPort(hp, AddressUse::kConnect);
  if (!ai.ok()) {
    return Status(ai.status().code(),
                  "tcp address '" + std::string(original) + "': " + ai.status().message());
  }
  std::memcpy(&out.storage, (*ai)->ai_addr, (*ai)->ai_addrlen);
  out.length = (*ai)->ai_addrlen;
  return out;
}

std::string LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return SockaddrToString(reinterpret_cast<sockaddr*>(&ss));
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return SockaddrToString(reinterpret_cast<sockaddr*>(&ss));
}

Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoError("fcntl(O_NONBLOCK)", errno);
  }
  return Status::OK();
}

void SetNoDelay(int fd) {
  int one = 1;
  // Best effort: a socket without TCP_NODELAY is slower, not wrong.
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int PollTimeoutMs(Deadline deadline) {
  auto left = deadline - SteadyClock::now();
  if (left <= std::chrono::nanoseconds::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

Result<Fd> ConnectTo(const ResolvedAddress& address, std::string_view name, Deadline deadline) {
  Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket()", errno);
  SetNoDelay(fd.get());
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length);
  if (rc != 0 && errno != EINPROGRESS) {
    int err = errno;
    return UnavailableError("connect to " + std::string(name) + " failed: " + std::strerror(err) +
                            "; is an rdmaps endpoint listening there?");
  }
  if (rc != 0) {
    for (;;) {
      pollfd p{fd.get(), POLLOUT, 0};
      int n = ::poll(&p, 1, PollTimeoutMs(deadline));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("poll(connect)", errno);
      if (n == 0) {
        return TimedOutError("connect to " + std::string(name) +
                             " did not complete by the deadline; check the address and that the "
                             "peer is reachable, or allow more time");
      }
      break;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return UnavailableError("connect to " + std::string(name) + " failed: " + std::strerror(err) +
                              "; is an rdmaps endpoint listening there?");
    }
  }
  return fd;
}

namespace {
Status WaitFd(int fd, short events, Deadline deadline, std::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("poll", errno);
    if (n == 0) {
      return TimedOutError(std::string(what) +
                           ": no answer by the deadline; the peer may be overloaded or not an "
                           "rdmaps endpoint");
    }
    return Status::OK();
  }
}
}  // namespace

Status SendAll(int fd, const void* data, std::size_t n, Deadline deadline, std::string_view what) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      RDMAPS_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, what));
      continue;
    }
    return UnavailableError(std::string(what) + ": send failed: " + std::strerror(errno));
  }
  return Status::OK();
}

Status RecvAll(int fd, void* data, std::size_t n, Deadline deadline, std::string_view what) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) {
      return UnavailableError(std::string(what) + ": the peer closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      RDMAPS_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, what));
      continue;
    }
    return UnavailableError(std::string(what) + ": recv failed: " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace rdmaps::transport::tcp

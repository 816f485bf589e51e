// Socket plumbing for the tcp backend: "host:port" parsing and resolution,
// an owning file descriptor, and small helpers. Used by setup code only.
//
// Thread safety: free functions are thread-safe; a Fd is a value owned by one
// thread at a time.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "rdmaps/status.h"
#include "transport/transport.h"

namespace rdmaps::transport::tcp {

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.Release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// "host:port" split; host is an IPv4 literal, a name, or an IPv6 literal
// written "[v6]:port".
struct HostPort {
  std::string host;  // Without brackets.
  std::uint16_t port = 0;
  bool bracketed = false;
};

// InvalidArgument, naming the expected form, when `address` is malformed.
Result<HostPort> ParseAddress(std::string_view address);

// Resolves a parsed address (numeric first, then by name) to one sockaddr.
struct ResolvedAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
Result<ResolvedAddress> Resolve(const HostPort& hp, std::string_view original);

// "1.2.3.4:80" or "[::1]:80".
std::string FormatSockaddr(const sockaddr* sa);

// Local or remote address of a socket, formatted; "?" when unknown.
std::string LocalAddress(int fd);
std::string PeerAddress(int fd);

Status SetNonBlocking(int fd);
void SetNoDelay(int fd);

// Non-blocking connect of a fresh socket to `address` by `deadline`.
// Unavailable when refused or unreachable, TimedOut at the deadline.
Result<Fd> ConnectTo(const ResolvedAddress& address, std::string_view name, Deadline deadline);

// Blocking-style full send/receive on a non-blocking socket, by `deadline`.
// Unavailable on EOF/reset, TimedOut at the deadline.
Status SendAll(int fd, const void* data, std::size_t n, Deadline deadline, std::string_view what);
Status RecvAll(int fd, void* data, std::size_t n, Deadline deadline, std::string_view what);

// Milliseconds from now to `deadline` for poll(2), clamped to [0, INT_MAX].
int PollTimeoutMs(Deadline deadline);

}  // namespace rdmaps::transport::tcp

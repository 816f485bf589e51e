// Socket plumbing for the tcp backend: address resolution and small helpers
// over sockets (rdmaps::Fd owns them; rdmaps::ParseHostPort parses the
// addresses, src/base/). Used by setup code only.
//
// Thread safety: free functions are thread-safe.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "rdmaps/status.h"
#include "src/base/fd.h"
#include "src/base/host_port.h"
#include "transport/transport.h"

namespace rdmaps::transport::tcp {

// Resolves a parsed address (numeric first, then by name) to one sockaddr.
struct ResolvedAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
Result<ResolvedAddress> Resolve(const HostPort& hp, std::string_view original);

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

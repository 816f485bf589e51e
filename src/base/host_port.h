// "host:port" addresses: the one parser every part of rdmaps uses (the
// transports' Listen and Connect, the cluster layout, the perf tools), so an
// address is valid or not whatever the hardware.
//
// The accepted forms:
//   host:port    a name or an IPv4 literal: "10.0.0.1:7000", "ps0:7000"
//   [v6]:port    an IPv6 literal in brackets: "[::1]:7000", "[fe80::1]:0"
// where port is a decimal number in 0..65535 (0 picks a free port when
// listening). Refused: a missing or empty port ("host", "host:"), an empty
// host (":7000"; listen on 0.0.0.0 for every interface), an IPv6 literal
// without brackets ("::1:80", "[::1"), a bracketed host that is not an IPv6
// literal, and hosts with whitespace, ',' or '/'.
//
// ResolveHostPort turns a parsed address into socket addresses (the one
// getaddrinfo call of the tree) and SockaddrToString turns one back into
// "host:port", for the tcp and verbs backends, the rendezvous and the perf
// tools alike.
//
// Thread safety: pure functions (getaddrinfo is thread-safe).
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "rdmaps/status.h"

namespace rdmaps {

struct HostPort {
  std::string host;  // Without brackets.
  std::uint16_t port = 0;
  bool bracketed = false;  // Written "[v6]:port".
};

// Splits `text`; InvalidArgument when malformed, naming `what` (e.g.
// "--ps_hosts", "Connect address"), quoting `text`, saying what is wrong and
// what to write instead.
Result<HostPort> ParseHostPort(std::string_view text, std::string_view what);

// "host:port", with brackets around an IPv6 host: the inverse of
// ParseHostPort.
std::string JoinHostPort(std::string_view host, int port);

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
// getaddrinfo's list, freed with it; never null once resolved.
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// What the address is for: a socket that listens (an empty or wildcard host
// binds every interface) or one that connects.
enum class AddressUse { kListen, kConnect };

// The stream-socket addresses of `hp`, any family, in the resolver's order,
// with hp.port set. Unavailable quoting the host and the resolver's reason.
Result<AddrInfoList> ResolveHostPort(const HostPort& hp, AddressUse use);

// "10.0.0.1:7000" or "[fe80::1]:7000" for an AF_INET or AF_INET6 address;
// "?" for any other family.
std::string SockaddrToString(const sockaddr* sa);

}  // namespace rdmaps

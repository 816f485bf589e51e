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
// Thread safety: pure functions.
#pragma once

#include <cstdint>
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

}  // namespace rdmaps

// Which address a process of a multi-node job advertises to the others: the
// network interfaces of this host, an interface choice in NCCL's style
// (RDMAPS_IFNAME, read like NCCL_SOCKET_IFNAME), and whether a host is a
// loopback address (which no other node can reach).
//
// RDMAPS_IFNAME is a comma-separated list of interface name prefixes:
//   "eth0"         interfaces whose name starts with eth0 (eth0, eth0.100)
//   "ib,eth"       ib* first, then eth*
//   "=eth0"        exactly eth0 (a leading '=' makes every entry exact)
//   "^lo,docker"   any interface but lo* and docker* (a leading '^' excludes)
//   "^=lo"         any interface but exactly lo
// Unset: the first ib* interface, else the first that is not lo*, docker*
// or virbr*. Only interfaces that are up and have an IPv4 (or a global
// IPv6) address count; IPv4 first.
//
// Thread safety: pure functions (getifaddrs and getaddrinfo are).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/status.h"

namespace rdmaps::internal {

struct NetInterface {
  std::string name;     // "eth0"
  std::string address;  // "10.0.0.1" or "fd00::1" (no brackets)
  bool ipv6 = false;
};

// This host's interfaces that are up and have an address, in getifaddrs
// order (loopback included).
Result<std::vector<NetInterface>> ListInterfaces();

// The address of the first interface of `interfaces` that `spec` (an
// RDMAPS_IFNAME value, or empty for the default) chooses. NotFound naming
// the spec and listing the interfaces there are.
Result<std::string> ChooseInterfaceAddress(std::string_view spec,
                                           const std::vector<NetInterface>& interfaces);

// True when `host` is a loopback literal (127/8, ::1, "localhost") or a
// name whose every address is one (a hostname that /etc/hosts maps to
// 127.0.1.1, as Debian's installer writes it). False when it does not
// resolve: whether it will is not known here.
bool IsLoopbackAddress(std::string_view host);

}  // namespace rdmaps::internal

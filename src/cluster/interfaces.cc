#include "src/cluster/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <memory>

#include "src/base/host_port.h"

namespace rdmaps::internal {
namespace {

struct IfAddrsDeleter {
  void operator()(ifaddrs* p) const { ::freeifaddrs(p); }
};

bool IsLoopbackSockaddr(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

std::vector<std::string> SplitCommas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    auto comma = s.find(',');
    std::string_view part = s.substr(0, comma);
    if (!part.empty()) out.emplace_back(part);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

bool Matches(const std::string& name, const std::string& entry, bool exact) {
  return exact ? name == entry : name.starts_with(entry);
}

}  // namespace

Result<std::vector<NetInterface>> ListInterfaces() {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return ErrnoError("getifaddrs", errno);
  std::unique_ptr<ifaddrs, IfAddrsDeleter> list(raw);
  std::vector<NetInterface> v4, v6;
  for (const ifaddrs* p = raw; p; p = p->ifa_next) {
    if (!p->ifa_addr || !(p->ifa_flags & IFF_UP)) continue;
    const int family = p->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(p->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;  // needs a scope id
    }
    char host[NI_MAXHOST];
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (getnameinfo(p->ifa_addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    (family == AF_INET ? v4 : v6).push_back({p->ifa_name, host, family == AF_INET6});
  }
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

Result<std::string> ChooseInterfaceAddress(std::string_view spec,
                                           const std::vector<NetInterface>& interfaces) {
  std::string_view rest = spec;
  bool exclude = false, exact = false;
  if (rest.starts_with('^')) {
    exclude = true;
    rest.remove_prefix(1);
  }
  if (rest.starts_with('=')) {
    exact = true;
    rest.remove_prefix(1);
  }
  const std::vector<std::string> entries = SplitCommas(rest);
  auto listed = [&] {
    std::string s;
    for (const NetInterface& i : interfaces) {
      s += (s.empty() ? "" : ", ") + i.name + " " + i.address;
    }
    return s.empty() ? std::string("none") : s;
  };
  if (spec.empty()) {
    // NCCL's default: InfiniBand (IPoIB) first, then anything but loopback
    // and the usual virtual bridges.
    for (const NetInterface& i : interfaces) {
      if (i.name.starts_with("ib")) return i.address;
    }
    for (const NetInterface& i : interfaces) {
      if (!i.name.starts_with("lo") && !i.name.starts_with("docker") &&
          !i.name.starts_with("virbr")) {
        return i.address;
      }
    }
    return NotFoundError(
        "no network interface other than loopback is up (interfaces: " + listed() +
        "); other nodes cannot reach this one: bring one up or name the address with "
        "--advertise_host");
  }
  if (entries.empty()) {
    return InvalidArgumentError("RDMAPS_IFNAME=" + std::string(spec) +
                                " names no interface; write e.g. eth0, ib,eth, =eth0 or ^lo");
  }
  if (exclude) {
    for (const NetInterface& i : interfaces) {
      bool excluded = false;
      for (const std::string& e : entries) excluded = excluded || Matches(i.name, e, exact);
      if (!excluded) return i.address;
    }
  } else {
    for (const std::string& e : entries) {  // in the order the list gives
      for (const NetInterface& i : interfaces) {
        if (Matches(i.name, e, exact)) return i.address;
      }
    }
  }
  return NotFoundError("RDMAPS_IFNAME=" + std::string(spec) +
                       " matches no interface that is up with an address (interfaces: " + listed() +
                       ")");
}

bool IsLoopbackAddress(std::string_view host) {
  if (host == "localhost") return true;
  HostPort hp{std::string(host), 0, false};
  auto list = ResolveHostPort(hp, AddressUse::kConnect);
  if (!list.ok()) return false;
  bool any = false;
  for (const addrinfo* ai = list->get(); ai; ai = ai->ai_next) {
    if (!IsLoopbackSockaddr(ai->ai_addr)) return false;
    any = true;
  }
  return any;
}

}  // namespace rdmaps::internal

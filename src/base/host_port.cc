#include "src/base/host_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <charconv>

namespace rdmaps {

Result<HostPort> ParseHostPort(std::string_view text, std::string_view what) {
  auto bad = [&](std::string_view why) {
    constexpr std::size_t kMaxQuoted = 200;
    const std::string quoted(text.substr(0, kMaxQuoted));
    return InvalidArgumentError(std::string(what) + ": '" + quoted +
                                (text.size() > kMaxQuoted ? "...' " : "' ") + std::string(why) +
                                "; expected host:port, e.g. 10.0.0.1:7000, or [::1]:7000 for "
                                "IPv6 (port 0 picks a free port when listening)");
  };
  HostPort hp;
  std::string_view port;
  if (text.starts_with('[')) {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("is missing the ']' of [ipv6]:port");
    hp.host = std::string(text.substr(1, close - 1));
    hp.bracketed = true;
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("has no ':port' after ']'");
    port = rest.substr(1);
    if (hp.host.empty()) return bad("has an empty IPv6 address");
    in6_addr a6;
    if (::inet_pton(AF_INET6, hp.host.c_str(), &a6) != 1) {
      return bad("has no IPv6 address inside [ ]");
    }
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no port");
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (hp.host.find(':') != std::string::npos) return bad("has an IPv6 host without [ ]");
    if (hp.host.empty()) {
      return bad("has an empty host (listen on 0.0.0.0 for every interface)");
    }
    for (char c : hp.host) {
      if (std::isspace(static_cast<unsigned char>(c)) || c == ',' || c == '/') {
        return bad("has a malformed host");
      }
    }
  }
  if (port.empty()) return bad("has an empty port");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    return bad("has a port outside 0..65535");
  }
  hp.port = static_cast<std::uint16_t>(value);
  return hp;
}

std::string JoinHostPort(std::string_view host, int port) {
  std::string h(host);
  if (h.find(':') != std::string::npos && !h.starts_with('[')) h = "[" + h + "]";
  return h + ":" + std::to_string(port);
}

Result<AddrInfoList> ResolveHostPort(const HostPort& hp, AddressUse use) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (use == AddressUse::kListen) hints.ai_flags = AI_PASSIVE;
  const std::string port = std::to_string(hp.port);
  addrinfo* res = nullptr;
  const int rc =
      ::getaddrinfo(hp.host.empty() ? nullptr : hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return UnavailableError("cannot resolve '" + hp.host +
                            "': " + (rc != 0 ? ::gai_strerror(rc) : "no address") +
                            "; check the host name or give a numeric address");
  }
  return AddrInfoList(res);
}

std::string SockaddrToString(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return JoinHostPort(host, ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return JoinHostPort(host, ntohs(in6->sin6_port));
  }
  return "?";
}

}  // namespace rdmaps

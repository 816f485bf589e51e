// Where verbs tests listen: the IPv4 address of an RDMA device's netdev.
//
// RDMAPS_TEST_VERBS_ADDR (set by the Soft-RoCE VM harness, tests/vm/) wins;
// otherwise the first device under /sys/class/infiniband with an ACTIVE port
// whose netdev (RoCE, rxe) has an IPv4 address. Empty when there is none, and
// `why` says why. Header-only, no verbs headers: reads sysfs and getifaddrs.
// Thread safety: a pure function of the machine's state.
#pragma once

#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace rdmaps::testing {

inline std::string ReadSysfsLine(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

inline std::string Ipv4OfNetdev(const std::string& netdev) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (netdev != a->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    out = buf;
    break;
  }
  freeifaddrs(list);
  return out;
}

inline std::string VerbsTestAddress(std::string* why) {
  if (const char* env = std::getenv("RDMAPS_TEST_VERBS_ADDR"); env != nullptr && *env) {
    return env;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path root = "/sys/class/infiniband";
  if (!fs::exists(root, ec)) {
    if (why) *why = "no /sys/class/infiniband: no RDMA device on this machine";
    return "";
  }
  for (const auto& dev : fs::directory_iterator(root, ec)) {
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", ec)) {
      if (ReadSysfsLine(port.path() / "state").find("ACTIVE") == std::string::npos) continue;
      std::string netdev = ReadSysfsLine(port.path() / "gid_attrs" / "ndevs" / "0");
      if (netdev.empty()) continue;
      std::string ip = Ipv4OfNetdev(netdev);
      if (!ip.empty()) return ip;
    }
  }
  if (why) *why = "no ACTIVE RDMA port whose netdev has an IPv4 address; set RDMAPS_TEST_VERBS_ADDR";
  return "";
}

}  // namespace rdmaps::testing

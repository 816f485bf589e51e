#include "perf/rdmaps-perf/perf_cli.h"

#include <cstdlib>
#include <map>

namespace rdmaps::perf {

std::vector<std::string> TranslateArgs(int argc, char** argv) {
  static const std::map<std::string, std::string> kShort = {
      {"-s", "--size"},     {"-n", "--iters"},     {"-a", "--all"},   {"-D", "--duration"},
      {"-t", "--tx_depth"}, {"-l", "--post_list"}, {"-p", "--port"},  {"-d", "--ib_dev"},
      {"-i", "--ib_port"},  {"-x", "--gid_index"}, {"-h", "--help"},
  };
  std::vector<std::string> out;
  bool positional_only = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i == 0 || positional_only || arg.size() < 2 || arg[0] != '-') {
      out.push_back(arg);
      continue;
    }
    if (arg == "--") {
      positional_only = true;
      out.push_back(arg);
      continue;
    }
    const std::size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    const std::string rest = eq == std::string::npos ? "" : arg.substr(eq);
    if (auto it = kShort.find(name); it != kShort.end()) {
      out.push_back(it->second + rest);
      continue;
    }
    if (name.rfind("--", 0) == 0) {
      for (std::size_t k = 2; k < name.size(); ++k) {
        if (name[k] == '-') name[k] = '_';
      }
    }
    out.push_back(name + rest);
  }
  return out;
}

std::string Bracketed(const std::string& host) {
  if (host.find(':') != std::string::npos && host[0] != '[') return "[" + host + "]";
  return host;
}

bool SplitHostPort(const std::string& address, std::string* host, int* port) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return false;
  std::string h = address.substr(0, colon);
  if (!h.empty() && h.front() == '[') {
    if (h.back() != ']') return false;
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return false;  // An IPv6 literal without brackets has no port.
  }
  char* end = nullptr;
  const long p = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535) return false;
  *host = h;
  *port = static_cast<int>(p);
  return true;
}

bool WithPort(const std::string& address, int port, std::string* out) {
  std::string host;
  int p = 0;
  if (SplitHostPort(address, &host, &p)) {
    *out = address;
    return true;
  }
  if (port <= 0) return false;
  *out = Bracketed(address) + ":" + std::to_string(port);
  return true;
}

}  // namespace rdmaps::perf

#include "perf/rdmaps-perf/perf_cli.h"

#include <cstdlib>
#include <map>

#include "src/base/host_port.h"
#include "tools/common/flags.h"

namespace rdmaps::perf {

std::vector<std::string> ParseFlags(int argc, char** argv) {
  std::vector<std::string> args = TranslateArgs(argc, argv);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  int cargc = static_cast<int>(args.size());
  char** cargv = cargs.data();
  tools::ParseCommandLineFlags(&cargc, &cargv);
  return std::vector<std::string>(cargv + 1, cargv + cargc);
}

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

bool WithPort(const std::string& address, int port, std::string* out) {
  if (ParseHostPort(address, "address").ok()) {
    *out = address;
    return true;
  }
  if (port <= 0) return false;
  *out = JoinHostPort(address, port);
  return true;
}

Result<std::vector<std::uint64_t>> ParseSizes(std::string_view text) {
  std::vector<std::uint64_t> sizes;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    std::string item(text.substr(pos, comma - pos));
    std::uint64_t scale = 1;
    if (!item.empty()) {
      switch (item.back()) {
        case 'k': case 'K': scale = 1ull << 10; break;
        case 'm': case 'M': scale = 1ull << 20; break;
        case 'g': case 'G': scale = 1ull << 30; break;
        default: break;
      }
      if (scale != 1) item.pop_back();
    }
    char* end = nullptr;
    const unsigned long long v = item.empty() ? 0 : std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || item[0] == '-' || v == 0 || v > (1ull << 30) / scale) {
      return InvalidArgumentError("bad size '" + std::string(text.substr(pos, comma - pos)) +
                                  "' in -s " + std::string(text) +
                                  "; give sizes of 1 byte to 1G, e.g. -s 64,4K,1M");
    }
    sizes.push_back(v * scale);
    pos = comma + 1;
  }
  return sizes;
}

}  // namespace rdmaps::perf

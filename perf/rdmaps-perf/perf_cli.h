// Command-line helpers shared by rdmaps-perf and socket-baseline: perftest's
// one-letter flags on top of gflags, and HOST[:PORT] defaults.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/status.h"

namespace rdmaps::perf {

// gflags has no one-letter aliases and no dashes in flag names: rewrites
// perftest-style "-s 65536", "-a", "--tx-depth=4" to "--size 65536",
// "--all", "--tx_depth=4". Short flags: -s size, -n iters, -a all, -D
// duration, -t tx_depth, -l post_list, -p port, -d ib_dev, -i ib_port,
// -x gid_index, -h help. Arguments after "--" stay as they are.
std::vector<std::string> TranslateArgs(int argc, char** argv);

// TranslateArgs, then rdmaps::tools::ParseCommandLineFlags (gflags with the
// tool's own flags first in --help, tools/common/flags.h); returns the
// positional arguments (the program name excluded).
std::vector<std::string> ParseFlags(int argc, char** argv);

// Gives `address` a port: keeps an explicit one ("h:1", "[::1]:1"; the
// rules of src/base/host_port.h), else appends `port`. False when there is
// none and `port` <= 0.
bool WithPort(const std::string& address, int port, std::string* out);

// Parses "-s": one size or a comma list, each with an optional binary
// suffix K, M or G ("64,4K,1M"). Sizes must be 1..1 GiB.
Result<std::vector<std::uint64_t>> ParseSizes(std::string_view text);

}  // namespace rdmaps::perf

// The lists a cluster layout is made of: comma-separated host:port lists,
// Slurm's compressed node lists, counts from the environment, this host's
// name; and the quoting every layout error uses. Parsers of hostile input
// (flags, environment variables): every refusal is InvalidArgument quoting
// the part at fault.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/status.h"

namespace rdmaps::internal {

// A comma-separated "host:port" list; empty entries and bad entries are
// InvalidArgument naming `what` and quoting the entry.
Result<std::vector<std::string>> ParseHostList(std::string_view text, std::string_view what);

// Slurm's compressed host list: "node[01-03,7],gpu5" ->
// node01 node02 node03 node7 gpu5. Zero padding is kept; several bracket
// groups in one name expand as a product ("r[1-2]n[1-2]").
// At most kMaxSlurmNodes names (InvalidArgument beyond).
inline constexpr std::size_t kMaxSlurmNodes = 65536;
Result<std::vector<std::string>> ExpandSlurmNodeList(std::string_view text);

// A non-negative integer; InvalidArgument "`name`=`text` is not ..." else.
Result<int> ParseCount(std::string_view name, std::string_view text);

// gethostname(), or "localhost" if that fails.
std::string LocalHostName();

// `s` in single quotes, cut to 200 characters ("...") so that a hostile
// value cannot flood a log line.
std::string Quote(std::string_view s);

}  // namespace rdmaps::internal

// Internals of the layout resolver (include/rdmaps/cluster.h), exposed for
// tests: host lists, Slurm node lists, and each source on its own.
//
// Thread safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/status.h"
#include "src/base/host_port.h"

namespace rdmaps::internal {

// A comma-separated "host:port" list; empty entries and bad entries are
// InvalidArgument naming `what` and quoting the entry.
Result<std::vector<std::string>> ParseHostList(std::string_view text, std::string_view what);

// Slurm's compressed host list: "node[01-03,7],gpu5" ->
// node01 node02 node03 node7 gpu5. Zero padding is kept; several bracket
// groups in one name expand as a product ("r[1-2]n[1-2]").
Result<std::vector<std::string>> ExpandSlurmNodeList(std::string_view text);

// A non-negative integer; InvalidArgument "`name`=`text` is not ..." else.
Result<int> ParseCount(std::string_view name, std::string_view text);

// Each source alone. std::nullopt when the source is absent; an error when it
// is present but malformed.
using MaybeCluster = std::optional<Result<ClusterLayout>>;
MaybeCluster ClusterFromOptions(const ClusterOptions& options);
MaybeCluster ClusterFromRdmapsEnv(const ClusterOptions& options, const Environment& env);
MaybeCluster ClusterFromTfConfig(const ClusterOptions& options, const Environment& env);
MaybeCluster ClusterFromDmlc(const ClusterOptions& options, const Environment& env);
MaybeCluster ClusterFromRanks(const ClusterOptions& options, const Environment& env);
ClusterLayout LoopbackCluster(const ClusterOptions& options);

// Checks counts, index range and duplicate addresses (entries with port 0
// are exempt: a worker does not listen).
Status ValidateCluster(const ClusterLayout& layout);

// gethostname(), or "localhost" if that fails.
std::string LocalHostName();

}  // namespace rdmaps::internal

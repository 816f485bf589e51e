// Internals of the cluster layout resolver (include/rdmaps/cluster.h),
// exposed for tests: each source on its own and the checks of a layout (the
// host and node lists it is made of are in src/cluster/host_lists.h).
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
#include "src/cluster/host_lists.h"

namespace rdmaps::internal {

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

}  // namespace rdmaps::internal

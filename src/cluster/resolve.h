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

// Where a Slurm job's rendezvous root listens when nothing says:
// kDefaultRendezvousPort + a mix of SLURM_JOB_ID and SLURM_STEP_ID in
// [0, 1000), so that two steps of one allocation (or two jobs) on the same
// first node do not meet at one port.
int SlurmRendezvousPort(const Environment& env);

// Checks counts, index range and duplicate addresses (entries with port 0
// are exempt: a worker does not listen).
Status ValidateCluster(const ClusterLayout& layout);

}  // namespace rdmaps::internal

// Replication and failover of parameter-server shards: who is the primary
// of each shard, at which epoch, and the one place that decides a failover
// (docs/ps.md, "Replication and failover").
//
// A shard with ServerOptions::replicas == 2 has a primary (the Server
// workers push to) and a backup (a Server started with
// ReplicaRole::kBackup and the same server_index), which the primary
// forwards every slot to, in apply order, before it acknowledges it. When
// one of them is lost the survivor asks the FailoverDecider; the decider
// answers every question about a shard from one state, so that at most one
// Server of a shard acknowledges pushes at any epoch. The job's Coordinator
// (src/cluster/coordinator.h, etcd-backed across hosts) implements it
// (OpenFailoverDecider); NewEmbeddedFailoverDecider() is the in-process one
// (tests, one host).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "rdmaps/cluster.h"
#include "rdmaps/status.h"

namespace rdmaps {

// The placement rule: which server process hosts the backup of a shard.
// Version 1: the backup of shard i lives beside the primary of shard
// (i + 1) mod n. Carried in every ShardAssignment, so that a rule added
// later (chains, k backups) can be told apart.
inline constexpr std::uint32_t kPlacementVersion = 1;
inline std::uint32_t BackupHostOf(std::uint32_t shard, std::uint32_t num_servers) {
  return num_servers == 0 ? 0 : (shard + 1) % num_servers;
}

// One shard's entry of the shard map.
struct ShardAssignment {
  std::uint32_t shard = 0;
  // 1 when first registered; every decision (a promotion, a primary going
  // on without its backup) makes it one larger.
  std::uint64_t epoch = 0;
  std::uint32_t placement_version = kPlacementVersion;
  std::string primary;  // the address workers connect to
  std::string backup;   // the backup's address; empty: the shard has one copy
};

// Ends a FailoverDecider::WatchPrimary when destroyed (and waits for its
// callback if one is running).
class PrimaryWatch {
 public:
  virtual ~PrimaryWatch() = default;
};

class FailoverDecider {
 public:
  virtual ~FailoverDecider() = default;

  // The primary of `shard` at start: epoch 1, `primary` and `backup`.
  // Returns the entry; FailedPrecondition when the shard is registered
  // already with another primary (a stale primary restarting).
  virtual Result<ShardAssignment> Register(std::uint32_t shard, const std::string& primary,
                                           const std::string& backup) = 0;
  // The current entry of `shard`; NotFound before Register.
  virtual Result<ShardAssignment> Current(std::uint32_t shard) = 0;
  // The backup `reporter` of `shard` lost its primary at `epoch`: when that
  // is still the current entry and `reporter` its backup, the backup becomes
  // the primary (epoch + 1, no backup). Returns the entry after the
  // decision (which may be another one's, made before).
  virtual Result<ShardAssignment> ReportPrimaryLost(std::uint32_t shard, std::uint64_t epoch,
                                                    const std::string& reporter) = 0;
  // The primary `reporter` of `shard` lost its backup at `epoch`: when that
  // is still the current entry and `reporter` its primary, it goes on alone
  // (epoch + 1, no backup). Returns the entry after the decision: a primary
  // not named in it is fenced and must acknowledge nothing more.
  virtual Result<ShardAssignment> ReportBackupLost(std::uint32_t shard, std::uint64_t epoch,
                                                   const std::string& reporter) = 0;
  // Re-protection: the primary `primary` of `shard`, serving alone at
  // `epoch`, has a new backup `backup` whose state equals its own (copied,
  // then caught up from the log): when that is still the current entry
  // (`primary` named, no backup) it gets `backup` at epoch + 1. Returns the
  // entry after the decision; the backup counts only when it names it.
  // The default: NotSupported (a decider that cannot re-protect).
  virtual Result<ShardAssignment> AddBackup(std::uint32_t shard, std::uint64_t epoch,
                                            const std::string& primary, const std::string& backup) {
    (void)shard, (void)epoch, (void)primary, (void)backup;
    return NotSupportedError("this FailoverDecider cannot add a backup (re-protection)");
  }
  // Waits until the entry of `shard` has an epoch above `epoch` and returns
  // it; TimedOut at `deadline`.
  virtual Result<ShardAssignment> WaitForEpochAfter(
      std::uint32_t shard, std::uint64_t epoch, std::chrono::steady_clock::time_point deadline) = 0;
  // Detection beyond connection loss, for the backup of `shard`: calls
  // `on_lost` once (on the watch's own thread) when the shard's primary,
  // after it was seen holding its lease, stops holding it (hung, stopped,
  // partitioned from the coordinator). The backup then drops its primary's
  // connection, which asks ReportPrimaryLost. Deciders without leases
  // return nullptr (connection loss is the only detection).
  virtual Result<std::unique_ptr<PrimaryWatch>> WatchPrimary(std::uint32_t shard,
                                                             std::function<void()> on_lost) {
    (void)shard;
    (void)on_lost;
    return std::unique_ptr<PrimaryWatch>();
  }
};

// An in-process decider (a mutex and a map): for tests and for jobs whose
// servers and workers share one process.
std::shared_ptr<FailoverDecider> NewEmbeddedFailoverDecider();

// The decider kept in the job's coordinator (docs/coordination.md,
// "Failover records"): every server and worker of a job that opens the same
// coordinator (and prefix) decides from one state, across hosts with etcd.
// A primary registered with a backup holds a lease of `lease_ttl` (the
// detection bound of a primary that hangs with its connections open).
// InvalidArgument for an empty or malformed address; Unavailable when the
// coordinator cannot be reached.
Result<std::shared_ptr<FailoverDecider>> OpenFailoverDecider(
    const CoordinatorConfig& coordinator,
    std::chrono::milliseconds lease_ttl = std::chrono::milliseconds(750));

}  // namespace rdmaps

// The FailoverDecider (rdmaps/failover.h) kept in the job's Coordinator, so
// that the servers and workers of many hosts decide from one state (etcd
// across hosts, "dir:" on one machine, "memory:" in tests).
//
// == Records ==
// Each shard has one record under "failover/shard/<i>":
//
//   rdmaps failover shard v1
//   epoch 3
//   primary 10.0.0.5:7470
//   backup 10.0.0.6:7470        ("backup -" when the shard has one copy)
//
// Exactly these lines, each ending in '\n'; the epoch a decimal without sign
// or leading zeros, >= 1; an address 1..kMaxFailoverAddressBytes printable
// characters without spaces. A record that does not parse is DataLoss
// (naming the key), never a guess.
//
// Every decision (a promotion, a primary going on alone) is ONE
// compare-and-swap on the record's mod_revision, derived from the record at
// the epoch the reporter knows: two reporters that saw the same epoch can
// never both win (the loser re-reads and gets the winner's entry). Epochs
// are per shard: a failover of shard 0 does not move shard 1.
//
// == Leases and heartbeats (detection beyond connection loss) ==
// The primary of a replicated shard (Register with a backup) holds a lease
// (LeaseKeeper, TTL `lease_ttl`, default 750 ms) with the key
// "failover/lease/<i>" = its address. When the coordinator stretched that
// lease (etcd grants at least its minimum TTL, ceil(1.5 x election
// timeout) = 2 s with its default flags, and checks expiry every 500 ms)
// the primary also re-puts the key at every renewal (every TTL/3: a
// heartbeat, LeaseKeeperOptions::heartbeat). The backup's WatchPrimary
// fires when
//   - the key vanished (the lease expired or was revoked; with exact
//     leases, the embedded coordinators, this alone bounds detection), or
//   - the key has been beating (it changed under the watch) and a read
//     shows it at the mod_revision this process first saw a whole
//     `lease_ttl` ago by its own monotonic clock (no heartbeat for a TTL).
// So detection is bounded by lease_ttl whatever etcd's flags. Only a
// successful read can fire the watch (a backup that cannot reach the
// coordinator could not be promoted either), and every delay (a slow
// coordinator, a descheduled backup) only postpones it. Primary and backup
// must use the same lease_ttl (rdmaps-server --lease_ttl_ms).
//
// When the watch fires the backup drops its primary's connection, which
// runs the same decision as a lost connection (ReportPrimaryLost). Why a
// primary that was only slow cannot acknowledge afterwards: it
// acknowledges a push only once its log write into the backup completed,
// and the backup closed that connection before its promoting CAS and then
// deregistered its ring; the resumed primary's next log write fails, it
// asks the decider, the entry names another primary, so it is fenced. Its
// lease keeper loses the lease too (expired, or its key taken over).
//
// Thread safety: safe for concurrent use by many threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "rdmaps/failover.h"
#include "src/base/mutex.h"
#include "src/cluster/coordinator.h"
#include "src/cluster/lease_keeper.h"

namespace rdmaps::internal {

inline constexpr std::size_t kMaxFailoverAddressBytes = 256;

std::string FailoverShardKey(std::uint32_t shard);
std::string FailoverLeaseKey(std::uint32_t shard);
std::string EncodeFailoverRecord(const ::rdmaps::ShardAssignment& a);
// `shard` is the record's shard (not stored in the text).
Result<::rdmaps::ShardAssignment> ParseFailoverRecord(std::uint32_t shard, std::string_view text);

struct CoordFailoverOptions {
  // Each coordinator call's deadline.
  std::chrono::milliseconds call_timeout{5000};
  // The primary's lease (the detection bound of a hung primary).
  std::chrono::milliseconds lease_ttl = kDefaultLeaseTtl;
  // When the primary re-puts its lease key as a heartbeat: by default only
  // when the coordinator stretched the lease (etcd); kAlways for tests.
  LeaseKeeperOptions::Heartbeat heartbeat = LeaseKeeperOptions::Heartbeat::kWhenStretched;
};

class CoordFailoverDecider final : public FailoverDecider {
 public:
  CoordFailoverDecider(std::shared_ptr<Coordinator> coord, CoordFailoverOptions options = {});
  ~CoordFailoverDecider() override;

  Result<::rdmaps::ShardAssignment> Register(std::uint32_t shard, const std::string& primary,
                                             const std::string& backup) override;
  Result<::rdmaps::ShardAssignment> Current(std::uint32_t shard) override;
  Result<::rdmaps::ShardAssignment> ReportPrimaryLost(std::uint32_t shard, std::uint64_t epoch,
                                                      const std::string& reporter) override;
  Result<::rdmaps::ShardAssignment> ReportBackupLost(std::uint32_t shard, std::uint64_t epoch,
                                                     const std::string& reporter) override;
  // Re-protection: one CAS from (epoch, primary, no backup) to epoch + 1
  // with `backup`; then this process holds the primary's lease.
  Result<::rdmaps::ShardAssignment> AddBackup(std::uint32_t shard, std::uint64_t epoch,
                                              const std::string& primary,
                                              const std::string& backup) override;
  Result<::rdmaps::ShardAssignment> WaitForEpochAfter(
      std::uint32_t shard, std::uint64_t epoch,
      std::chrono::steady_clock::time_point deadline) override;
  Result<std::unique_ptr<PrimaryWatch>> WatchPrimary(std::uint32_t shard,
                                                     std::function<void()> on_lost) override;

  Coordinator& coordinator() { return *coord_; }
  // The lease (and heartbeat) of `shard`'s primary stops (true) or resumes
  // (false) being renewed: a hung primary, for tests. False when this
  // decider holds no lease for `shard`.
  bool TEST_PauseLease(std::uint32_t shard, bool paused) RDMAPS_EXCLUDES(mu_);
  // Only the heartbeat stops (the lease is still renewed): what only the
  // backup's heartbeat timer can notice, for tests.
  bool TEST_PauseHeartbeat(std::uint32_t shard, bool paused) RDMAPS_EXCLUDES(mu_);

 private:
  struct Read {
    std::optional<::rdmaps::ShardAssignment> entry;
    std::int64_t mod_revision = 0;
    std::int64_t revision = 0;
  };
  Result<Read> ReadEntry(std::uint32_t shard, CoordDeadline deadline);
  // The CAS loop of both reports: `decide` changes the entry (true) or
  // leaves it (false: the answer is the entry as it is).
  Result<::rdmaps::ShardAssignment> Decide(
      std::uint32_t shard, const std::function<bool(::rdmaps::ShardAssignment&)>& decide);
  CoordDeadline CallDeadline() const { return CoordClock::now() + options_.call_timeout; }
  // Starts this process's lease on `shard`'s primary key (once per shard).
  Status HoldLease(std::uint32_t shard, const std::string& primary, CoordDeadline deadline)
      RDMAPS_EXCLUDES(mu_);

  // Constant after construction.
  const std::shared_ptr<Coordinator> coord_;
  const CoordFailoverOptions options_;

  Mutex mu_;
  // The leases of the primaries this process registered, by shard.
  std::map<std::uint32_t, std::unique_ptr<LeaseKeeper>> leases_ RDMAPS_GUARDED_BY(mu_);
};

}  // namespace rdmaps::internal

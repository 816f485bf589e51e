// The in-process FailoverDecider (rdmaps/failover.h): one mutex, one map,
// every decision made under the mutex, so two survivors that report at
// once see one outcome.
#include "rdmaps/failover.h"

#include <condition_variable>
#include <map>

#include "src/base/mutex.h"

namespace rdmaps {
namespace {

class EmbeddedDecider final : public FailoverDecider {
 public:
  Result<ShardAssignment> Register(std::uint32_t shard, const std::string& primary,
                                   const std::string& backup) override {
    MutexLock lock(mu_);
    auto it = map_.find(shard);
    if (it != map_.end()) {
      if (it->second.primary == primary && it->second.epoch == 1) return it->second;
      return FailedPreconditionError("shard " + std::to_string(shard) +
                                     " is registered already, primary " + it->second.primary +
                                     " at epoch " + std::to_string(it->second.epoch) + "; " +
                                     primary + " may not serve it (a stale primary restarting?)");
    }
    ShardAssignment a;
    a.shard = shard;
    a.epoch = 1;
    a.primary = primary;
    a.backup = backup;
    map_[shard] = a;
    cv_.notify_all();
    return a;
  }

  Result<ShardAssignment> Current(std::uint32_t shard) override {
    MutexLock lock(mu_);
    auto it = map_.find(shard);
    if (it == map_.end()) {
      return NotFoundError("shard " + std::to_string(shard) + " has no primary registered yet");
    }
    return it->second;
  }

  Result<ShardAssignment> ReportPrimaryLost(std::uint32_t shard, std::uint64_t epoch,
                                            const std::string& reporter) override {
    MutexLock lock(mu_);
    auto it = map_.find(shard);
    if (it == map_.end()) return NotFoundError("shard " + std::to_string(shard) + " is unknown");
    ShardAssignment& a = it->second;
    if (a.epoch == epoch && !a.backup.empty() && a.backup == reporter) {
      a.primary = reporter;
      a.backup.clear();
      ++a.epoch;
      cv_.notify_all();
    }
    return a;
  }

  Result<ShardAssignment> ReportBackupLost(std::uint32_t shard, std::uint64_t epoch,
                                           const std::string& reporter) override {
    MutexLock lock(mu_);
    auto it = map_.find(shard);
    if (it == map_.end()) return NotFoundError("shard " + std::to_string(shard) + " is unknown");
    ShardAssignment& a = it->second;
    if (a.epoch == epoch && a.primary == reporter && !a.backup.empty()) {
      a.backup.clear();
      ++a.epoch;
      cv_.notify_all();
    }
    return a;
  }

  Result<ShardAssignment> AddBackup(std::uint32_t shard, std::uint64_t epoch,
                                    const std::string& primary,
                                    const std::string& backup) override {
    MutexLock lock(mu_);
    auto it = map_.find(shard);
    if (it == map_.end()) return NotFoundError("shard " + std::to_string(shard) + " is unknown");
    ShardAssignment& a = it->second;
    if (a.epoch == epoch && a.primary == primary && a.backup.empty() && !backup.empty() &&
        backup != primary) {
      a.backup = backup;
      ++a.epoch;
      cv_.notify_all();
    }
    return a;
  }

  Result<ShardAssignment> WaitForEpochAfter(
      std::uint32_t shard, std::uint64_t epoch,
      std::chrono::steady_clock::time_point deadline) override {
    MutexLock lock(mu_);
    while (true) {
      auto it = map_.find(shard);
      if (it != map_.end() && it->second.epoch > epoch) return it->second;
      if (cv_.wait_until(lock.native(), deadline) == std::cv_status::timeout) {
        it = map_.find(shard);
        if (it != map_.end() && it->second.epoch > epoch) return it->second;
        return TimedOutError("shard " + std::to_string(shard) + " still at epoch " +
                             std::to_string(epoch) +
                             " at the deadline: no backup took it over (was it replicated?)");
      }
    }
  }

 private:
  Mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint32_t, ShardAssignment> map_ RDMAPS_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<FailoverDecider> NewEmbeddedFailoverDecider() {
  return std::make_shared<EmbeddedDecider>();
}

}  // namespace rdmaps

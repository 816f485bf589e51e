#include "src/cluster/coord_failover.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "src/base/log.h"

namespace rdmaps::internal {
namespace {

constexpr std::string_view kHeader = "rdmaps failover shard v1";

bool ParseEpoch(std::string_view s, std::uint64_t* out) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return v >= 1;
}

Status CheckAddress(std::string_view what, std::string_view a) {
  if (a.empty() || a.size() > kMaxFailoverAddressBytes) {
    return InvalidArgumentError(std::string(what) + " address of " + std::to_string(a.size()) +
                                " bytes; 1 to " + std::to_string(kMaxFailoverAddressBytes));
  }
  for (char c : a) {
    if (c <= ' ' || c > '~') {
      return InvalidArgumentError(std::string(what) + " address '" + std::string(a) +
                                  "' holds a space or a non-printable byte");
    }
  }
  if (a == "-") return InvalidArgumentError(std::string(what) + " address '-' is reserved");
  return Status();
}

// Takes "<word> <rest>\n" off the front of `text` into *value.
bool Line(std::string_view& text, std::string_view word, std::string_view* value) {
  const auto nl = text.find('\n');
  if (nl == std::string_view::npos) return false;
  std::string_view line = text.substr(0, nl);
  text.remove_prefix(nl + 1);
  if (line.size() <= word.size() + 1 || line.substr(0, word.size()) != word ||
      line[word.size()] != ' ') {
    return false;
  }
  *value = line.substr(word.size() + 1);
  return true;
}

// The lease key `kv` is `holder`'s (its value is the primary's address;
// an empty holder: anyone's).
bool HeldBy(const std::optional<KeyValue>& kv, const std::string& holder) {
  return kv && (holder.empty() || kv->value == holder);
}

// The backup's watch of its primary's lease key (see "Leases and
// heartbeats" in coord_failover.h). Fires when the key vanishes (the lease
// expired or was revoked) or, once the key has changed under the watch (a
// beating primary: the lease's key is re-put only as a heartbeat), when a
// successful read shows it at the mod_revision it had `ttl` ago by this
// process's monotonic clock. A read that fails never fires it: a backup
// that cannot reach the coordinator could not be promoted either. Only the
// lease of `holder`, the primary the shard map named when the watch
// started, counts (empty: anyone's), so that a replacement backup started
// while the dead primary's lease has not expired yet does not take its
// expiry for its new primary's.
class CoordPrimaryWatch final : public PrimaryWatch {
 public:
  // `seen`: the key's mod_revision when the watch started (0: absent, or
  // not `holder`'s).
  CoordPrimaryWatch(Coordinator* coord, std::string key, std::string holder,
                    std::function<void()> on_lost, std::int64_t seen,
                    std::chrono::milliseconds ttl)
      : coord_(coord),
        key_(std::move(key)),
        holder_(std::move(holder)),
        on_lost_(std::move(on_lost)),
        ttl_(ttl) {
    thread_ = std::thread([this, seen] { Run(seen); });
  }

  ~CoordPrimaryWatch() override {
    stop_.store(true);
    thread_.join();
  }

 private:
  void Run(std::int64_t seen_mod) {
    // When this process first saw the key at seen_mod (a read that
    // returned then: later than the heartbeat itself, so never early).
    CoordDeadline seen_at = CoordClock::now();
    bool beating = false;  // the key changed while it existed: heartbeats
    while (!stop_.load()) {
      const CoordDeadline asked = CoordClock::now();
      auto r = coord_->Get(key_, asked + std::chrono::milliseconds(200));
      if (!r.ok()) {
        RDMAPS_LOG_EVERY_T(WARNING, 5.0) << "failover watch of " << key_ << ": " << r.status();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      if (!HeldBy(r->kv, holder_)) {
        if (seen_mod != 0) {
          RDMAPS_LOG(WARNING) << "failover: the primary's lease " << key_
                              << " is gone (the primary stopped renewing it)";
          on_lost_();
          return;
        }
      } else if (r->kv->mod_revision != seen_mod) {
        beating = beating || seen_mod != 0;
        seen_mod = r->kv->mod_revision;
        seen_at = CoordClock::now();
      } else if (beating && asked - seen_at >= ttl_) {
        // Read after a whole TTL, and still the heartbeat seen then.
        const auto silent =
            std::chrono::duration_cast<std::chrono::milliseconds>(asked - seen_at).count();
        RDMAPS_LOG(WARNING) << "failover: the primary's lease " << key_
                            << " has had no heartbeat for " << silent << " ms (lease_ttl "
                            << ttl_.count() << " ms): the primary is taken as dead";
        on_lost_();
        return;
      }
      // Short waits, so that the destructor is not held up; at most until
      // the heartbeat is due.
      CoordDeadline until = CoordClock::now() + std::chrono::milliseconds(200);
      if (beating) until = std::min(until, seen_at + ttl_);
      auto w = coord_->WaitForChange(key_, false, r->revision, until);
      if (!w.ok() && w.status().code() != StatusCode::kTimedOut) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  Coordinator* const coord_;
  const std::string key_;
  const std::string holder_;
  const std::function<void()> on_lost_;
  const std::chrono::milliseconds ttl_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

std::string FailoverShardKey(std::uint32_t shard) {
  return "failover/shard/" + std::to_string(shard);
}
std::string FailoverLeaseKey(std::uint32_t shard) {
  return "failover/lease/" + std::to_string(shard);
}

std::string EncodeFailoverRecord(const ::rdmaps::ShardAssignment& a) {
  std::string out(kHeader);
  out += "\nepoch " + std::to_string(a.epoch) + "\nprimary " + a.primary + "\nbackup " +
         (a.backup.empty() ? std::string("-") : a.backup) + "\n";
  return out;
}

Result<::rdmaps::ShardAssignment> ParseFailoverRecord(std::uint32_t shard, std::string_view text) {
  auto bad = [&](std::string_view why) {
    return DataLossError("the failover record '" + FailoverShardKey(shard) + "' " +
                         std::string(why) +
                         " (not a record rdmaps wrote; see docs/coordination.md, \"Failover "
                         "records\")");
  };
  if (text.substr(0, kHeader.size()) != kHeader || text.size() == kHeader.size() ||
      text[kHeader.size()] != '\n') {
    return bad("does not start with '" + std::string(kHeader) + "'");
  }
  text.remove_prefix(kHeader.size() + 1);
  ::rdmaps::ShardAssignment a;
  a.shard = shard;
  std::string_view v;
  if (!Line(text, "epoch", &v) || !ParseEpoch(v, &a.epoch)) return bad("has no valid epoch line");
  if (!Line(text, "primary", &v) || !CheckAddress("primary", v).ok()) {
    return bad("has no valid primary line");
  }
  a.primary = std::string(v);
  if (!Line(text, "backup", &v)) return bad("has no backup line");
  if (v != "-") {
    if (!CheckAddress("backup", v).ok()) return bad("has an invalid backup line");
    a.backup = std::string(v);
  }
  if (!text.empty()) return bad("has bytes after its backup line");
  if (a.backup == a.primary) return bad("names one address as primary and backup");
  return a;
}

CoordFailoverDecider::CoordFailoverDecider(std::shared_ptr<Coordinator> coord,
                                           CoordFailoverOptions options)
    : coord_(std::move(coord)), options_(options) {}

CoordFailoverDecider::~CoordFailoverDecider() {
  std::map<std::uint32_t, std::unique_ptr<LeaseKeeper>> leases;
  {
    MutexLock lock(mu_);
    leases.swap(leases_);
  }
  leases.clear();  // each revokes its lease
}

Result<CoordFailoverDecider::Read> CoordFailoverDecider::ReadEntry(std::uint32_t shard,
                                                                   CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(ReadResult r, coord_->Get(FailoverShardKey(shard), deadline));
  Read out;
  out.revision = r.revision;
  if (r.kv) {
    RDMAPS_ASSIGN_OR_RETURN(::rdmaps::ShardAssignment a, ParseFailoverRecord(shard, r.kv->value));
    out.entry = std::move(a);
    out.mod_revision = r.kv->mod_revision;
  }
  return out;
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::Register(std::uint32_t shard,
                                                                 const std::string& primary,
                                                                 const std::string& backup) {
  RDMAPS_RETURN_IF_ERROR(CheckAddress("primary", primary));
  if (!backup.empty()) {
    RDMAPS_RETURN_IF_ERROR(CheckAddress("backup", backup));
    if (backup == primary) {
      return InvalidArgumentError("shard " + std::to_string(shard) + ": primary and backup are " +
                                  primary);
    }
  }
  const CoordDeadline deadline = CallDeadline();
  ::rdmaps::ShardAssignment a;
  a.shard = shard;
  a.epoch = 1;
  a.primary = primary;
  a.backup = backup;
  RDMAPS_ASSIGN_OR_RETURN(
      CasResult cas, coord_->CompareAndSwap(FailoverShardKey(shard), 0, EncodeFailoverRecord(a),
                                            kNoLease, deadline));
  if (!cas.swapped) {
    if (!cas.current)
      return UnavailableError("the failover record of shard " + std::to_string(shard) +
                              " changed while registering");
    RDMAPS_ASSIGN_OR_RETURN(::rdmaps::ShardAssignment now,
                            ParseFailoverRecord(shard, cas.current->value));
    if (now.primary != primary || now.epoch != 1) {
      return FailedPreconditionError(
          "shard " + std::to_string(shard) + " is registered already in " + coord_->Describe() +
          ", primary " + now.primary + " at epoch " + std::to_string(now.epoch) + "; " + primary +
          " may not serve it (a stale primary restarting, or another job on the same "
          "coordinator prefix: give each job its own RDMAPS_COORDINATOR_PREFIX)");
    }
    a = now;
  }
  if (!a.backup.empty()) RDMAPS_RETURN_IF_ERROR(HoldLease(shard, primary, deadline));
  return a;
}

Status CoordFailoverDecider::HoldLease(std::uint32_t shard, const std::string& primary,
                                       CoordDeadline deadline) {
  MutexLock lock(mu_);
  if (leases_.count(shard) != 0) return Status::OK();
  LeaseKeeperOptions lo;
  lo.ttl = options_.lease_ttl;
  lo.key = FailoverLeaseKey(shard);
  lo.value = primary;
  lo.heartbeat = options_.heartbeat;
  lo.on_lost = [shard](const Status& why) {
    RDMAPS_LOG(ERROR) << "ps server " << shard << ": lost its primary lease (" << why
                      << "); its backup takes over, and this primary stops at its next log "
                         "write";
  };
  RDMAPS_ASSIGN_OR_RETURN(leases_[shard], LeaseKeeper::Start(coord_.get(), lo, deadline));
  return Status::OK();
}

bool CoordFailoverDecider::TEST_PauseLease(std::uint32_t shard, bool paused) {
  MutexLock lock(mu_);
  auto it = leases_.find(shard);
  if (it == leases_.end()) return false;
  it->second->TEST_PauseRenewals(paused);
  return true;
}

bool CoordFailoverDecider::TEST_PauseHeartbeat(std::uint32_t shard, bool paused) {
  MutexLock lock(mu_);
  auto it = leases_.find(shard);
  if (it == leases_.end()) return false;
  it->second->TEST_PauseHeartbeat(paused);
  return true;
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::AddBackup(std::uint32_t shard,
                                                                  std::uint64_t epoch,
                                                                  const std::string& primary,
                                                                  const std::string& backup) {
  RDMAPS_RETURN_IF_ERROR(CheckAddress("backup", backup));
  RDMAPS_ASSIGN_OR_RETURN(::rdmaps::ShardAssignment a,
                          Decide(shard, [&](::rdmaps::ShardAssignment& e) {
                            if (e.epoch != epoch || e.primary != primary || !e.backup.empty() ||
                                backup == primary || e.epoch == UINT64_MAX) {
                              return false;
                            }
                            e.backup = backup;
                            ++e.epoch;
                            return true;
                          }));
  if (a.primary == primary && a.backup == backup && a.epoch == epoch + 1) {
    // A promoted primary held no lease (only a primary registered with a
    // backup does): from now on its backup watches one. Without it the
    // backup still takes over when the connection drops.
    if (Status st = HoldLease(shard, primary, CallDeadline()); !st.ok()) {
      RDMAPS_LOG(WARNING) << "ps server " << shard << ": re-protected without a primary lease ("
                          << st << "): a hung primary is detected by connection loss only";
    }
  }
  return a;
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::Current(std::uint32_t shard) {
  RDMAPS_ASSIGN_OR_RETURN(Read r, ReadEntry(shard, CallDeadline()));
  if (!r.entry) {
    return NotFoundError("shard " + std::to_string(shard) + " has no primary registered yet in " +
                         coord_->Describe());
  }
  return *r.entry;
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::Decide(
    std::uint32_t shard, const std::function<bool(::rdmaps::ShardAssignment&)>& decide) {
  const CoordDeadline deadline = CallDeadline();
  RDMAPS_ASSIGN_OR_RETURN(Read r, ReadEntry(shard, deadline));
  // Each lost CAS means another decision moved the record on; a record
  // moves a bounded number of times per failure, so this loop is short.
  for (int attempt = 0; attempt < 64; ++attempt) {
    if (!r.entry) return NotFoundError("shard " + std::to_string(shard) + " is unknown");
    ::rdmaps::ShardAssignment next = *r.entry;
    if (!decide(next)) return *r.entry;
    RDMAPS_ASSIGN_OR_RETURN(CasResult cas,
                            coord_->CompareAndSwap(FailoverShardKey(shard), r.mod_revision,
                                                   EncodeFailoverRecord(next), kNoLease, deadline));
    if (cas.swapped) return next;
    r = Read{};
    if (cas.current) {
      RDMAPS_ASSIGN_OR_RETURN(::rdmaps::ShardAssignment now,
                              ParseFailoverRecord(shard, cas.current->value));
      r.entry = std::move(now);
      r.mod_revision = cas.current->mod_revision;
    }
  }
  return UnavailableError("the failover record of shard " + std::to_string(shard) +
                          " kept changing under 64 decisions");
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::ReportPrimaryLost(
    std::uint32_t shard, std::uint64_t epoch, const std::string& reporter) {
  return Decide(shard, [&](::rdmaps::ShardAssignment& a) {
    if (a.epoch != epoch || a.backup.empty() || a.backup != reporter || a.epoch == UINT64_MAX) {
      return false;
    }
    a.primary = reporter;
    a.backup.clear();
    ++a.epoch;
    return true;
  });
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::ReportBackupLost(
    std::uint32_t shard, std::uint64_t epoch, const std::string& reporter) {
  return Decide(shard, [&](::rdmaps::ShardAssignment& a) {
    if (a.epoch != epoch || a.primary != reporter || a.backup.empty() || a.epoch == UINT64_MAX) {
      return false;
    }
    a.backup.clear();
    ++a.epoch;
    return true;
  });
}

Result<::rdmaps::ShardAssignment> CoordFailoverDecider::WaitForEpochAfter(
    std::uint32_t shard, std::uint64_t epoch, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    RDMAPS_ASSIGN_OR_RETURN(Read r, ReadEntry(shard, deadline));
    if (r.entry && r.entry->epoch > epoch) return *r.entry;
    auto w = coord_->WaitForChange(FailoverShardKey(shard), false, r.revision, deadline);
    if (!w.ok()) {
      if (w.status().code() != StatusCode::kTimedOut) return w.status();
      return TimedOutError("shard " + std::to_string(shard) + " still at epoch " +
                           std::to_string(epoch) + " in " + coord_->Describe() +
                           " at the deadline: no backup took it over (was it replicated?)");
    }
  }
}

Result<std::unique_ptr<PrimaryWatch>> CoordFailoverDecider::WatchPrimary(
    std::uint32_t shard, std::function<void()> on_lost) {
  if (!on_lost) return InvalidArgumentError("WatchPrimary needs a callback");
  // Read once here, so that a lease held now counts as seen whenever the
  // watch's thread first looks.
  RDMAPS_ASSIGN_OR_RETURN(Read entry, ReadEntry(shard, CallDeadline()));
  const std::string holder = entry.entry ? entry.entry->primary : std::string();
  RDMAPS_ASSIGN_OR_RETURN(ReadResult r, coord_->Get(FailoverLeaseKey(shard), CallDeadline()));
  return std::unique_ptr<PrimaryWatch>(new CoordPrimaryWatch(
      coord_.get(), FailoverLeaseKey(shard), holder, std::move(on_lost),
      HeldBy(r.kv, holder) ? std::max<std::int64_t>(r.kv->mod_revision, 1) : 0,
      options_.lease_ttl));
}

}  // namespace rdmaps::internal

namespace rdmaps {

Result<std::shared_ptr<FailoverDecider>> OpenFailoverDecider(const CoordinatorConfig& coordinator,
                                                             std::chrono::milliseconds lease_ttl) {
  if (coordinator.address.empty()) {
    return InvalidArgumentError(
        "a replicated shard needs a coordinator: set RDMAPS_COORDINATOR (etcd://HOST:PORT, or "
        "dir:/PATH on one machine) or --coordinator");
  }
  RDMAPS_RETURN_IF_ERROR(internal::CheckLeaseTtl(lease_ttl));
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<internal::Coordinator> coord,
                          internal::OpenCoordinator(coordinator));
  internal::CoordFailoverOptions o;
  o.lease_ttl = lease_ttl;
  return std::shared_ptr<FailoverDecider>(std::make_shared<internal::CoordFailoverDecider>(
      std::shared_ptr<internal::Coordinator>(std::move(coord)), o));
}

}  // namespace rdmaps

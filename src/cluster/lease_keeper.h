// A server's heartbeat: holds a lease in the coordinator, renews it every
// TTL/3, optionally keeps a key under it ("servers/3" = its address), and
// says until when the process may still act as the holder.
//
// Detection: a process that dies stops renewing; its lease expires and its
// key vanishes at most TTL after its last renewal reached the coordinator.
// With kDefaultLeaseTtl (750 ms) and renewals every 250 ms a crashed server
// is gone from the coordinator within 750 ms (embedded coordinators; etcd
// grants whole seconds, at least its minimum TTL, and checks expiry every
// 500 ms: there the key's heartbeat, LeaseKeeperOptions::heartbeat, is what
// a watcher times, docs/coordination.md).
// Transport errors (a refused connection, a completion error) detect a
// crash faster; the lease is the bound when nothing else notices.
//
// Fencing (why a slow but alive primary cannot act after its lease is
// gone): valid_until() is the time the last successful renewal was SENT plus
// TTL × (1 - kLeaseSafetyMargin), TTL being what the coordinator granted
// (etcd may grant more than asked; renewals still go every asked TTL/3).
// The coordinator starts that renewal's TTL when it RECEIVES it, which is
// later, so it expires the lease strictly
// after valid_until() (clock rates differ by far less than the 10 % margin).
// A holder that acknowledges anything only while Valid() has therefore
// stopped before any decider can see the lease gone and promote a backup.
// A process that was stopped (SIGSTOP, a long GC pause, swapped out) wakes
// with Valid() false and must not acknowledge again until it re-reads the
// shard map; the epoch then fences whatever it still sends (the backup
// refuses an older epoch's log writes).
//
//   LeaseKeeperOptions o;
//   o.key = "servers/" + std::to_string(index);
//   o.value = address;
//   o.on_lost = [&](const Status& why) { StopAcknowledging(why); };
//   RDMAPS_ASSIGN_OR_RETURN(auto keeper, LeaseKeeper::Start(coord, o, deadline));
//   ... if (!keeper->Valid()) refuse; else acknowledge ...
//
// Thread safety: all methods may be called from any thread; on_lost runs
// once, on the keeper's thread, and must not call Stop().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "src/base/mutex.h"
#include "src/cluster/coordinator.h"

namespace rdmaps::internal {

inline constexpr std::chrono::milliseconds kDefaultLeaseTtl{750};
inline constexpr double kLeaseSafetyMargin = 0.1;

struct LeaseKeeperOptions {
  std::chrono::milliseconds ttl = kDefaultLeaseTtl;
  // When set, put under the lease (replacing an older value, e.g. one of
  // this server's previous incarnation whose lease has not expired yet).
  std::string key;
  std::string value;
  // With `key`: every renewal also re-puts the key (same value, a new
  // mod_revision): a heartbeat that a watcher times with its own clock.
  // kWhenStretched beats only when the coordinator granted more than `ttl`
  // (etcd grants at least its minimum TTL, 2 s with its default flags):
  // an exact lease (the embedded coordinators) needs no heartbeat, and the
  // directory coordinator is spared a state-file write per renewal. The
  // re-put is a CAS on the key's last mod_revision under this lease: a key
  // that another lease took over loses the lease (FailedPrecondition).
  enum class Heartbeat { kNone, kWhenStretched, kAlways };
  Heartbeat heartbeat = Heartbeat::kNone;
  // Called once when the lease is lost: expired (NotFound), not renewed
  // before valid_until() (Unavailable naming the last error) or, with
  // `heartbeat`, its key taken over (FailedPrecondition).
  std::function<void(const Status&)> on_lost;
};

class LeaseKeeper {
 public:
  // Grants the lease, puts the key, starts renewing. `coord` must outlive
  // the keeper.
  static Result<std::unique_ptr<LeaseKeeper>> Start(Coordinator* coord,
                                                    const LeaseKeeperOptions& options,
                                                    CoordDeadline deadline);
  // Stop().
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  LeaseId lease() const { return lease_; }
  // The holder may act until this time (see "Fencing" above).
  CoordDeadline valid_until() const;
  // Not lost and now < valid_until().
  bool Valid() const;
  // The TTL the coordinator granted (>= options.ttl).
  std::chrono::milliseconds granted_ttl() const { return granted_ttl_; }
  // Whether renewals also re-put the key (see LeaseKeeperOptions::heartbeat).
  bool beats() const { return beats_; }
  // OK while held; the reason once lost.
  Status status() const;
  // Blocks until the lease is lost (its reason) or the deadline passes
  // (TimedOut).
  Status WaitUntilLost(CoordDeadline deadline);
  // Stops renewing and revokes the lease (its key vanishes now), within
  // one TTL. Idempotent.
  void Stop();

  // Renewals stop (true) or resume (false): a slow server, for tests.
  void TEST_PauseRenewals(bool paused) { paused_.store(paused); }
  // The heartbeat's re-puts stop (true) or resume (false) while the lease
  // is still renewed: only a heartbeat watcher can notice, for tests.
  void TEST_PauseHeartbeat(bool paused) { heartbeat_paused_.store(paused); }

 private:
  LeaseKeeper(Coordinator* coord, LeaseKeeperOptions options, LeaseGrant grant,
              CoordDeadline valid_until);
  void Run();
  void Lose(Status why) RDMAPS_EXCLUDES(mu_);
  // The heartbeat's re-put of the key (Run's thread only): OK, a transient
  // error (retry soon), or FailedPrecondition when another lease holds it.
  Status Beat(CoordDeadline deadline);

  // Constant after construction
  Coordinator* const coord_;
  const LeaseKeeperOptions options_;
  const LeaseId lease_;
  const std::chrono::milliseconds granted_ttl_;
  const bool beats_;

  std::atomic<bool> paused_{false};
  std::atomic<bool> heartbeat_paused_{false};
  // The key's mod_revision as this keeper last put it (Run's thread, after
  // Start).
  std::int64_t key_mod_revision_ = 0;
  mutable Mutex mu_;
  std::condition_variable cv_;  // stop_, lost_
  bool stop_ RDMAPS_GUARDED_BY(mu_) = false;
  bool stopped_ RDMAPS_GUARDED_BY(mu_) = false;  // Stop() ran (revoked)
  CoordDeadline valid_until_ RDMAPS_GUARDED_BY(mu_);
  Status lost_ RDMAPS_GUARDED_BY(mu_);  // non-OK once lost
  std::thread thread_;
};

}  // namespace rdmaps::internal

#include "src/cluster/lease_keeper.h"

#include <algorithm>

namespace rdmaps::internal {
namespace {

CoordClock::duration SafeTtl(std::chrono::milliseconds ttl) {
  return std::chrono::duration_cast<CoordClock::duration>(ttl * (1.0 - kLeaseSafetyMargin));
}

}  // namespace

Result<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(Coordinator* coord,
                                                        const LeaseKeeperOptions& options,
                                                        CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckLeaseTtl(options.ttl));
  if (!options.key.empty()) {
    RDMAPS_RETURN_IF_ERROR(CheckCoordKey(options.key));
    RDMAPS_RETURN_IF_ERROR(CheckCoordValue(options.value));
  }
  const auto sent = CoordClock::now();
  RDMAPS_ASSIGN_OR_RETURN(LeaseGrant grant, coord->GrantLease(options.ttl, deadline));
  std::unique_ptr<LeaseKeeper> keeper(
      new LeaseKeeper(coord, options, grant, sent + SafeTtl(std::max(grant.ttl, options.ttl))));
  if (!options.key.empty()) {
    // Put the key under our lease whatever it holds (a CAS loop: the
    // interface has no blind put, and a racing writer of our key is a bug
    // the loop's bound reports).
    Status put = UnavailableError("the key " + options.key + " kept changing");
    for (int attempt = 0; attempt < 8; ++attempt) {
      auto read = coord->Get(options.key, deadline);
      if (!read.ok()) {
        put = read.status();
        break;
      }
      auto cas = coord->CompareAndSwap(options.key, read->kv ? read->kv->mod_revision : 0,
                                       options.value, grant.id, deadline);
      if (!cas.ok()) {
        put = cas.status();
        break;
      }
      if (cas->swapped) {
        keeper->key_mod_revision_ = cas->revision;
        put = Status();
        break;
      }
    }
    if (!put.ok()) {
      (void)coord->RevokeLease(grant.id, deadline);
      return put.WithContext("putting " + options.key + " under lease " + std::to_string(grant.id));
    }
  }
  keeper->thread_ = std::thread([k = keeper.get()] { k->Run(); });
  return keeper;
}

LeaseKeeper::LeaseKeeper(Coordinator* coord, LeaseKeeperOptions options, LeaseGrant grant,
                         CoordDeadline valid_until)
    : coord_(coord),
      options_(std::move(options)),
      lease_(grant.id),
      granted_ttl_(std::max(grant.ttl, options_.ttl)),
      beats_(!options_.key.empty() &&
             (options_.heartbeat == LeaseKeeperOptions::Heartbeat::kAlways ||
              (options_.heartbeat == LeaseKeeperOptions::Heartbeat::kWhenStretched &&
               grant.ttl > options_.ttl))),
      valid_until_(valid_until) {}

LeaseKeeper::~LeaseKeeper() { Stop(); }

CoordDeadline LeaseKeeper::valid_until() const {
  MutexLock lock(mu_);
  return valid_until_;
}

bool LeaseKeeper::Valid() const {
  MutexLock lock(mu_);
  return lost_.ok() && !stopped_ && CoordClock::now() < valid_until_;
}

Status LeaseKeeper::status() const {
  MutexLock lock(mu_);
  return lost_;
}

Status LeaseKeeper::WaitUntilLost(CoordDeadline deadline) {
  MutexLock lock(mu_);
  while (lost_.ok()) {
    if (CoordClock::now() >= deadline) {
      return TimedOutError("lease " + std::to_string(lease_) + " still held at the deadline");
    }
    cv_.wait_until(lock.native(), deadline);
  }
  return lost_;
}

void LeaseKeeper::Lose(Status why) {
  {
    MutexLock lock(mu_);
    if (!lost_.ok()) return;
    lost_ = std::move(why);
    cv_.notify_all();
  }
  if (options_.on_lost) options_.on_lost(status());
}

void LeaseKeeper::Run() {
  const auto interval = std::chrono::duration_cast<CoordClock::duration>(options_.ttl) / 3;
  auto next = CoordClock::now() + interval;
  Status last_error;
  for (;;) {
    {
      MutexLock lock(mu_);
      while (!stop_ && CoordClock::now() < next) cv_.wait_until(lock.native(), next);
      if (stop_) return;
      if (!lost_.ok()) return;
    }
    const auto sent = CoordClock::now();
    if (paused_.load()) {
      next = sent + interval / 4;
    } else {
      // A renewal that cannot finish before the lease would lapse is no
      // use: its deadline is the current validity (at least 1 ms).
      CoordDeadline deadline = std::max(valid_until(), sent + std::chrono::milliseconds(1));
      Status s = coord_->KeepAlive(lease_, deadline);
      if (s.ok()) {
        {
          MutexLock lock(mu_);
          valid_until_ = std::max(valid_until_, sent + SafeTtl(granted_ttl_));
          next = sent + interval;
        }
        if (!beats_ || heartbeat_paused_.load()) continue;
        s = Beat(std::max(valid_until(), CoordClock::now() + std::chrono::milliseconds(1)));
        if (s.ok()) continue;
        if (s.code() == StatusCode::kFailedPrecondition) {
          Lose(s);
          return;
        }
        // The lease holds; the heartbeat is retried soon (a watcher allows
        // a whole TTL without one).
      }
      if (s.code() == StatusCode::kNotFound) {
        Lose(s.WithContext("lease " + std::to_string(lease_) + " lost (" + coord_->Describe() +
                           ")"));
        return;
      }
      last_error = s;
      next = CoordClock::now() + interval / 4;  // retry soon, still inside the TTL
    }
    if (CoordClock::now() >= valid_until()) {
      Lose(UnavailableError(
          "lease " + std::to_string(lease_) + " was not renewed within its TTL of " +
          std::to_string(granted_ttl_.count()) + " ms (" + coord_->Describe() +
          "): " + (last_error.ok() ? std::string("renewals were paused") : last_error.ToString())));
      return;
    }
  }
}

Status LeaseKeeper::Beat(CoordDeadline deadline) {
  // Two tries: a put that timed out after the coordinator applied it shows
  // up as the key under our own lease at a newer mod_revision.
  for (int attempt = 0; attempt < 2; ++attempt) {
    RDMAPS_ASSIGN_OR_RETURN(
        CasResult cas,
        coord_->CompareAndSwap(options_.key, key_mod_revision_, options_.value, lease_, deadline));
    if (cas.swapped) {
      key_mod_revision_ = cas.revision;
      return Status::OK();
    }
    if (!cas.current || cas.current->lease != lease_) {
      return FailedPreconditionError(
          "the key " + options_.key + " of lease " + std::to_string(lease_) + " is " +
          (cas.current ? "held by lease " + std::to_string(cas.current->lease) : "gone") + " (" +
          coord_->Describe() + "): another holder took it over");
    }
    key_mod_revision_ = cas.current->mod_revision;
  }
  return UnavailableError("the heartbeat of " + options_.key + " kept missing its revision");
}

void LeaseKeeper::Stop() {
  {
    MutexLock lock(mu_);
    if (stopped_) return;
    stop_ = true;
    stopped_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  (void)coord_->RevokeLease(lease_, CoordClock::now() + options_.ttl);
}

}  // namespace rdmaps::internal

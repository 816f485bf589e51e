// The state machine of the embedded coordinators (embedded_coordinator.h):
// keys with revisions, leases with expiry times, tombstones for watches. A
// pure value type: no locks, no clock (every call that needs the time takes
// `now`, nanoseconds of CLOCK_MONOTONIC or of a test's fake clock), so the
// in-process and the directory coordinator run exactly the same rules and
// the tests drive expiry with a fake clock.
//
// Encode/ParseCoordStore give the directory coordinator's state file; the
// parser treats the bytes as hostile (bounded counts and sizes, every key
// and value checked as a caller's would be, exact length).
//
// Thread safety: none; the owner locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "src/cluster/coordinator.h"

namespace rdmaps::internal {

// Tombstones (deleted keys' revisions, for WaitForChange) kept at most; the
// oldest are dropped and a watcher from before them wakes early.
inline constexpr std::size_t kMaxCoordTombstones = 4096;
inline constexpr std::size_t kMaxCoordKeys = 65536;
inline constexpr std::size_t kMaxCoordLeases = 65536;
// A stored key is the job prefix (a key itself) and the caller's key.
inline constexpr std::size_t kMaxCoordStoredKeyBytes = 2 * kMaxCoordKeyBytes;

class CoordStore {
 public:
  using Nanos = std::int64_t;

  std::int64_t revision() const { return revision_; }

  // Deletes the keys of every lease expired at `now` (one revision for the
  // lot); true when anything changed.
  bool Expire(Nanos now);
  // The earliest expiry time of any lease, if any.
  std::optional<Nanos> NextExpiry() const;

  Result<LeaseGrant> Grant(std::chrono::milliseconds ttl, Nanos now);
  Status KeepAlive(LeaseId lease, Nanos now);
  void Revoke(LeaseId lease);

  ReadResult Get(std::string_view key) const;
  Result<ListResult> List(std::string_view prefix) const;
  Result<CasResult> CompareAndSwap(std::string_view key, std::int64_t expected_mod_revision,
                                   std::string_view value, LeaseId lease);
  void Delete(std::string_view key);

  // The newest revision at which `key` (or a key under `prefix`) changed,
  // or a later revision when that history was dropped; 0 if never.
  std::int64_t LastChange(std::string_view key, bool prefix) const;

  // `boot_id` identifies the clock the expiry times are measured on; a
  // state file from another boot has its leases expired at once.
  std::string EncodeWithBoot(std::string_view boot_id) const;
  friend Result<CoordStore> ParseCoordStore(std::string_view bytes, std::string_view boot_id,
                                            Nanos now);

 private:
  struct Entry {
    std::string value;
    std::int64_t create_revision = 0;
    std::int64_t mod_revision = 0;
    LeaseId lease = kNoLease;
  };
  struct Lease {
    Nanos ttl = 0;
    Nanos expires = 0;
  };
  void Tombstone(const std::string& key, std::int64_t revision);
  KeyValue ToKeyValue(const std::string& key, const Entry& e) const;

  std::int64_t revision_ = 1;
  LeaseId next_lease_ = 1;
  std::int64_t dropped_revision_ = 0;  // newest revision of a dropped tombstone
  std::map<std::string, Entry, std::less<>> kvs_;
  std::map<LeaseId, Lease> leases_;
  std::map<std::string, std::int64_t, std::less<>> tombstones_;
};

// The state file's bytes back to a store (see EncodeWithBoot).
// InvalidArgument naming what is wrong; the empty string is a new store.
Result<CoordStore> ParseCoordStore(std::string_view bytes, std::string_view boot_id,
                                   CoordStore::Nanos now);

}  // namespace rdmaps::internal

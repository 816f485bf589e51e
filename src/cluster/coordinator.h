// The coordinator: the one place where a job's decisions live (who is the
// primary of each shard, which processes are alive). A small, etcd-shaped
// key-value interface, so that the same code runs on the embedded
// implementations (one machine, tests) and on a real etcd v3 cluster
// (docs/coordination.md):
//
//   - a versioned key-value store: every change raises the store's revision
//     by one and stamps the changed key with it (mod_revision);
//   - compare-and-swap: a put that happens only when the key's mod_revision is
//     still the one the caller read (0 = the key must be absent), so two
//     deciders that read the same record can never both win;
//   - leases: a process holds a lease with a TTL and renews it (KeepAlive);
//     keys put under a lease vanish when it expires or is revoked, so a key
//     such as "servers/3" says "server 3 was alive within the last TTL";
//   - watch with a deadline: wait until a key (or any key under a prefix)
//     changes after a revision the caller already saw.
//
// The coordinator knows nothing of tables, optimizers or transports; the
// records it stores are opaque bytes (the shard map's format is in
// shard_map.h). Keys are relative to the job's prefix (CoordinatorOptions::
// job_prefix), so two jobs can share one etcd.
//
//   auto coord = OpenCoordinator({.address = "etcd://10.0.0.5:2379",
//                                 .job_prefix = "rdmaps/job-42/"});
//   auto lease = (*coord)->GrantLease(kDefaultLeaseTtl, deadline);
//   auto cas = (*coord)->CompareAndSwap("shard_map", read.kv->mod_revision,
//                                      new_bytes, kNoLease, deadline);
//   if (cas.ok() && !cas->swapped) { /* someone else changed it first */ }
//
// Errors: every call takes a deadline (TimedOut when it passes), a
// coordinator that cannot be reached is Unavailable (naming it and how to
// check it), bad keys or values are InvalidArgument, an expired or unknown
// lease is NotFound. A failed compare is not an error: CasResult::swapped is
// false and CasResult::current holds what the key holds now.
//
// Thread safety: a Coordinator is safe for concurrent use by many threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/status.h"

namespace rdmaps::internal {

using CoordClock = std::chrono::steady_clock;
using CoordDeadline = CoordClock::time_point;

using LeaseId = std::int64_t;
inline constexpr LeaseId kNoLease = 0;

// Keys are 1..kMaxCoordKeyBytes of [A-Za-z0-9/_.:-] (after the job prefix is
// removed); values are at most kMaxCoordValueBytes of any bytes.
inline constexpr std::size_t kMaxCoordKeyBytes = 512;
inline constexpr std::size_t kMaxCoordValueBytes = std::size_t{256} << 10;
// List returns at most this many keys (ResourceExhausted beyond).
inline constexpr std::size_t kMaxCoordListKeys = 4096;
// Lease TTLs from 10 ms to 1 hour.
inline constexpr std::chrono::milliseconds kMinLeaseTtl{10};
inline constexpr std::chrono::milliseconds kMaxLeaseTtl{3600 * 1000};

struct KeyValue {
  std::string key;  // relative to the job prefix
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  LeaseId lease = kNoLease;
};

struct ReadResult {
  std::optional<KeyValue> kv;  // empty: no such key
  std::int64_t revision = 0;   // the store's revision when read
};

struct ListResult {
  std::vector<KeyValue> kvs;  // sorted by key
  std::int64_t revision = 0;
};

struct CasResult {
  bool swapped = false;
  std::int64_t revision = 0;        // swapped: the key's new mod_revision; else the store's
  std::optional<KeyValue> current;  // !swapped: what the key holds now (empty: absent)
};

struct LeaseGrant {
  LeaseId id = kNoLease;
  // What the coordinator granted: at least what was asked (etcd rounds up
  // to whole seconds and to its minimum TTL).
  std::chrono::milliseconds ttl{0};
};

class Coordinator {
 public:
  virtual ~Coordinator() = default;

  // "embedded (memory:job)", "embedded (dir:/tmp/x)", "etcd (http://h:2379)".
  virtual std::string Describe() const = 0;

  // A new lease that expires `ttl` after its last renewal.
  virtual Result<LeaseGrant> GrantLease(std::chrono::milliseconds ttl, CoordDeadline deadline) = 0;
  // Renews `lease` for its whole TTL. NotFound when it already expired (or
  // was revoked): its keys are gone and the caller must stop acting on it.
  virtual Status KeepAlive(LeaseId lease, CoordDeadline deadline) = 0;
  // Ends `lease` now and deletes its keys; OK when it no longer exists.
  virtual Status RevokeLease(LeaseId lease, CoordDeadline deadline) = 0;

  virtual Result<ReadResult> Get(std::string_view key, CoordDeadline deadline) = 0;
  // Every key that starts with `prefix` (which may be empty: all keys).
  virtual Result<ListResult> List(std::string_view prefix, CoordDeadline deadline) = 0;

  // Puts `value` (attached to `lease` unless kNoLease) when the key's
  // mod_revision equals `expected_mod_revision` (0: when the key is absent).
  // NotFound when `lease` does not exist.
  virtual Result<CasResult> CompareAndSwap(std::string_view key, std::int64_t expected_mod_revision,
                                           std::string_view value, LeaseId lease,
                                           CoordDeadline deadline) = 0;
  // Deletes the key (OK when absent).
  virtual Status Delete(std::string_view key, CoordDeadline deadline) = 0;

  // Waits until `key` (with `prefix`: any key starting with it) is put or
  // deleted at a revision > `after_revision`, and returns a revision at
  // which it changed. May return early (a revision > after_revision at
  // which nothing the caller cares about changed, e.g. after etcd compacted
  // its history): callers re-read and, if nothing changed, wait again.
  // TimedOut at the deadline.
  virtual Result<std::int64_t> WaitForChange(std::string_view key, bool prefix,
                                             std::int64_t after_revision,
                                             CoordDeadline deadline) = 0;
};

// How a program reaches its job's coordinator: the public
// CoordinatorConfig (include/rdmaps/cluster.h), whose address is
// "memory:NAME" (every handle of one NAME in this process shares a store),
// "dir:/PATH" (the processes of one machine share the store in PATH, created
// 0700) or "etcd://H:P[,H:P...]" / "etcd+https://..." (a real etcd v3).
using CoordinatorOptions = ::rdmaps::CoordinatorConfig;

// ClusterLayout::coordinator from the environment (see its comment);
// InvalidArgument for a malformed prefix. `launcher_identity` (from
// LauncherJobIdentity, may be empty) names the default prefix.
Result<CoordinatorOptions> ResolveCoordinator(const CoordinatorOptions& explicit_options,
                                              const Environment& env,
                                              std::string_view launcher_identity);

Result<std::unique_ptr<Coordinator>> OpenCoordinator(const CoordinatorOptions& options);

// InvalidArgument naming the rule a key breaks (shared by every
// implementation, so a key is valid or not whatever the coordinator).
// `max_bytes` is larger only for a stored key (the job prefix and the key).
Status CheckCoordKey(std::string_view key, bool allow_empty_prefix = false,
                     std::size_t max_bytes = kMaxCoordKeyBytes);
Status CheckCoordValue(std::string_view value);
Status CheckLeaseTtl(std::chrono::milliseconds ttl);

}  // namespace rdmaps::internal

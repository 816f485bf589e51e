// The shard map: which server is the primary and which the backup of every
// shard, and the epoch that orders every version of it. It lives in the
// coordinator under kShardMapKey; each change raises the epoch by exactly
// one and is a single compare-and-swap against the revision it was derived
// from, so two deciders that saw the same map can never both change it
// (one Promote wins, the other gets won = false and the new map).
//
// Workers and servers follow only the newest epoch they have seen: a server
// whose epoch is older than the map's is no longer a primary, and anything
// stamped with an older epoch is refused (docs/coordination.md, "Fencing").
//
// The record is text, so `etcdctl get` shows it, with a strict parser:
//
//   rdmaps shard map v1
//   epoch 7
//   shard 0 primary 0 backup 1
//   shard 1 primary 1 backup -
//
// Exactly these lines, in this order, shards numbered 0..n-1, decimal
// numbers without signs or leading zeros, '-' for no backup, each line
// ending in '\n'. A primary is a server index (the coordination layer does
// not know what a server is beyond that number).
//
// Thread safety: pure functions, and helpers that call a Coordinator (which
// is thread-safe).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/cluster/coordinator.h"

namespace rdmaps::internal {

inline constexpr std::string_view kShardMapKey = "shard_map";
inline constexpr std::int32_t kNoServer = -1;
inline constexpr std::size_t kMaxShards = 4096;
inline constexpr std::int32_t kMaxServerIndex = 65535;

struct ShardAssignment {
  std::int32_t primary = kNoServer;
  std::int32_t backup = kNoServer;  // kNoServer: not protected
  bool operator==(const ShardAssignment&) const = default;
};

struct ShardMap {
  std::uint64_t epoch = 0;  // >= 1 in every published map
  std::vector<ShardAssignment> shards;
  bool operator==(const ShardMap&) const = default;
};

// InvalidArgument naming the rule broken: epoch >= 1, 1..kMaxShards shards,
// every primary in [0, kMaxServerIndex], a backup in range or kNoServer and
// never the shard's primary.
Status CheckShardMap(const ShardMap& map);
std::string EncodeShardMap(const ShardMap& map);
Result<ShardMap> ParseShardMap(std::string_view text);
// "epoch 7: 0->0/1 1->1/-" for logs.
std::string ShardMapSummary(const ShardMap& map);

// A map as read from the coordinator, with the revision a CAS compares to.
struct VersionedShardMap {
  ShardMap map;
  std::int64_t mod_revision = 0;
};

// The current map; empty when none was published yet. DataLoss when the
// record does not parse (with the parser's reason).
Result<std::optional<VersionedShardMap>> ReadShardMap(Coordinator& coord, CoordDeadline deadline);

struct PublishResult {
  bool won = false;       // this call's map is the one now published
  VersionedShardMap now;  // the map the coordinator holds after the call
};

// Publishes the first map (epoch 1 usually) if there is none; when there
// is one already, won = false and `now` is it (every server of a starting
// job may call this; exactly one wins).
Result<PublishResult> CreateShardMap(Coordinator& coord, const ShardMap& map,
                                     CoordDeadline deadline);

// Replaces `from` with `next` (whose epoch must be from.map.epoch + 1) by one
// CAS on from.mod_revision; won = false when the map changed since.
Result<PublishResult> ReplaceShardMap(Coordinator& coord, const VersionedShardMap& from,
                                      const ShardMap& next, CoordDeadline deadline);

// Failover's decision: if the map is still at `from_epoch`, makes `shard`'s
// backup its primary (no backup until re-protection) at from_epoch + 1.
// won = false (and `now` the newer map) when the epoch moved on, whoever
// moved it: the caller re-reads `now` and decides again. FailedPrecondition
// when the shard has no backup to promote; NotFound when there is no map.
Result<PublishResult> Promote(Coordinator& coord, std::size_t shard, std::uint64_t from_epoch,
                              CoordDeadline deadline);

// Re-protection: at from_epoch, sets `shard`'s backup to `server`.
Result<PublishResult> SetBackup(Coordinator& coord, std::size_t shard, std::int32_t server,
                                std::uint64_t from_epoch, CoordDeadline deadline);

// Waits for a map with epoch > after_epoch (workers after a failed
// operation; servers learning they were demoted); TimedOut at the deadline.
Result<VersionedShardMap> WaitForShardMap(Coordinator& coord, std::uint64_t after_epoch,
                                          CoordDeadline deadline);

}  // namespace rdmaps::internal

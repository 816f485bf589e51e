#include "src/cluster/shard_map.h"

namespace rdmaps::internal {
namespace {

constexpr std::string_view kHeader = "rdmaps shard map v1";

// A decimal without sign or leading zeros, at most `max`.
bool ParseDecimal(std::string_view s, std::uint64_t max, std::uint64_t* out) {
  if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return false;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

Status Bad(std::size_t line, std::string_view why) {
  return InvalidArgumentError("shard map line " + std::to_string(line) + ": " + std::string(why) +
                              " (the record under '" + std::string(kShardMapKey) +
                              "' is not one rdmaps wrote; see docs/coordination.md)");
}

std::string ServerText(std::int32_t s) { return s == kNoServer ? "-" : std::to_string(s); }

}  // namespace

Status CheckShardMap(const ShardMap& map) {
  if (map.epoch == 0) return InvalidArgumentError("shard map epoch 0; epochs start at 1");
  if (map.epoch == UINT64_MAX) return InvalidArgumentError("shard map epoch at its maximum");
  if (map.shards.empty() || map.shards.size() > kMaxShards) {
    return InvalidArgumentError("shard map of " + std::to_string(map.shards.size()) +
                                " shards; 1 to " + std::to_string(kMaxShards));
  }
  for (std::size_t i = 0; i < map.shards.size(); ++i) {
    const auto& a = map.shards[i];
    if (a.primary < 0 || a.primary > kMaxServerIndex) {
      return InvalidArgumentError("shard " + std::to_string(i) + " has primary " +
                                  std::to_string(a.primary) + "; a server index 0.." +
                                  std::to_string(kMaxServerIndex));
    }
    if (a.backup != kNoServer && (a.backup < 0 || a.backup > kMaxServerIndex)) {
      return InvalidArgumentError("shard " + std::to_string(i) + " has backup " +
                                  std::to_string(a.backup));
    }
    if (a.backup == a.primary) {
      return InvalidArgumentError("shard " + std::to_string(i) + " has server " +
                                  std::to_string(a.primary) + " as primary and backup");
    }
  }
  return Status();
}

std::string EncodeShardMap(const ShardMap& map) {
  std::string out(kHeader);
  out += "\nepoch " + std::to_string(map.epoch) + "\n";
  for (std::size_t i = 0; i < map.shards.size(); ++i) {
    out += "shard " + std::to_string(i) + " primary " + std::to_string(map.shards[i].primary) +
           " backup " + ServerText(map.shards[i].backup) + "\n";
  }
  return out;
}

Result<ShardMap> ParseShardMap(std::string_view text) {
  if (text.size() > kMaxCoordValueBytes) return Bad(0, "longer than any shard map");
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    if (nl == std::string_view::npos) return Bad(lines.size() + 1, "no newline at the end");
    lines.push_back(text.substr(0, nl));
    text.remove_prefix(nl + 1);
  }
  if (lines.empty() || lines[0] != kHeader) return Bad(1, "not 'rdmaps shard map v1'");
  ShardMap map;
  if (lines.size() < 2 || lines[1].substr(0, 6) != "epoch " ||
      !ParseDecimal(lines[1].substr(6), UINT64_MAX - 1, &map.epoch)) {
    return Bad(2, "not 'epoch N'");
  }
  if (lines.size() - 2 > kMaxShards) return Bad(kMaxShards + 3, "more than 4096 shards");
  for (std::size_t i = 2; i < lines.size(); ++i) {
    // "shard I primary P backup B"
    std::vector<std::string_view> w;
    std::string_view l = lines[i];
    while (!l.empty()) {
      const auto sp = l.find(' ');
      w.push_back(l.substr(0, sp));
      if (sp == std::string_view::npos) break;
      l.remove_prefix(sp + 1);
      if (l.empty()) w.push_back("");  // trailing space
    }
    std::uint64_t index = 0, primary = 0, backup = 0;
    if (w.size() != 6 || w[0] != "shard" || w[2] != "primary" || w[4] != "backup" ||
        !ParseDecimal(w[1], kMaxShards, &index) || !ParseDecimal(w[3], kMaxServerIndex, &primary) ||
        (w[5] != "-" && !ParseDecimal(w[5], kMaxServerIndex, &backup))) {
      return Bad(i + 1, "not 'shard I primary P backup B|-'");
    }
    if (index != i - 2) return Bad(i + 1, "shards out of order");
    map.shards.push_back({static_cast<std::int32_t>(primary),
                          w[5] == "-" ? kNoServer : static_cast<std::int32_t>(backup)});
  }
  if (Status s = CheckShardMap(map); !s.ok()) return Bad(0, s.message());
  return map;
}

std::string ShardMapSummary(const ShardMap& map) {
  std::string out = "epoch " + std::to_string(map.epoch) + ":";
  for (std::size_t i = 0; i < map.shards.size(); ++i) {
    out += " " + std::to_string(i) + "->" + std::to_string(map.shards[i].primary) + "/" +
           ServerText(map.shards[i].backup);
  }
  return out;
}

namespace {

Result<VersionedShardMap> FromKv(const KeyValue& kv) {
  auto map = ParseShardMap(kv.value);
  if (!map.ok()) return DataLossError(map.status().message());
  return VersionedShardMap{std::move(*map), kv.mod_revision};
}

Result<PublishResult> FromCas(const CasResult& cas, const ShardMap& mine) {
  PublishResult r;
  r.won = cas.swapped;
  if (cas.swapped) {
    r.now = VersionedShardMap{mine, cas.revision};
    return r;
  }
  if (!cas.current) {
    return NotFoundError("the shard map was deleted while it was being replaced");
  }
  RDMAPS_ASSIGN_OR_RETURN(r.now, FromKv(*cas.current));
  return r;
}

}  // namespace

Result<std::optional<VersionedShardMap>> ReadShardMap(Coordinator& coord, CoordDeadline deadline) {
  RDMAPS_ASSIGN_OR_RETURN(ReadResult r, coord.Get(kShardMapKey, deadline));
  if (!r.kv) return std::optional<VersionedShardMap>();
  RDMAPS_ASSIGN_OR_RETURN(VersionedShardMap v, FromKv(*r.kv));
  return std::optional<VersionedShardMap>(std::move(v));
}

Result<PublishResult> CreateShardMap(Coordinator& coord, const ShardMap& map,
                                     CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckShardMap(map));
  RDMAPS_ASSIGN_OR_RETURN(CasResult cas, coord.CompareAndSwap(kShardMapKey, 0, EncodeShardMap(map),
                                                              kNoLease, deadline));
  return FromCas(cas, map);
}

Result<PublishResult> ReplaceShardMap(Coordinator& coord, const VersionedShardMap& from,
                                      const ShardMap& next, CoordDeadline deadline) {
  RDMAPS_RETURN_IF_ERROR(CheckShardMap(next));
  if (next.epoch != from.map.epoch + 1) {
    return InvalidArgumentError("a new shard map must have epoch " +
                                std::to_string(from.map.epoch + 1) + ", not " +
                                std::to_string(next.epoch));
  }
  if (from.mod_revision <= 0) {
    return InvalidArgumentError("ReplaceShardMap needs a map read from the coordinator");
  }
  RDMAPS_ASSIGN_OR_RETURN(
      CasResult cas, coord.CompareAndSwap(kShardMapKey, from.mod_revision, EncodeShardMap(next),
                                          kNoLease, deadline));
  return FromCas(cas, next);
}

namespace {

// Reads the map; when it is at from_epoch, lets `change` edit a copy and
// publishes it at from_epoch + 1.
template <typename Change>
Result<PublishResult> ChangeAt(Coordinator& coord, std::size_t shard, std::uint64_t from_epoch,
                               CoordDeadline deadline, Change change) {
  RDMAPS_ASSIGN_OR_RETURN(auto current, ReadShardMap(coord, deadline));
  if (!current) return NotFoundError("no shard map is published yet");
  if (current->map.epoch != from_epoch) {
    return PublishResult{false, std::move(*current)};
  }
  if (shard >= current->map.shards.size()) {
    return InvalidArgumentError("shard " + std::to_string(shard) + " of a map of " +
                                std::to_string(current->map.shards.size()) + " shards");
  }
  ShardMap next = current->map;
  next.epoch = from_epoch + 1;
  RDMAPS_RETURN_IF_ERROR(change(next.shards[shard]));
  return ReplaceShardMap(coord, *current, next, deadline);
}

}  // namespace

Result<PublishResult> Promote(Coordinator& coord, std::size_t shard, std::uint64_t from_epoch,
                              CoordDeadline deadline) {
  return ChangeAt(coord, shard, from_epoch, deadline, [&](ShardAssignment& a) -> Status {
    if (a.backup == kNoServer) {
      return FailedPreconditionError("shard " + std::to_string(shard) +
                                     " has no backup to promote (its primary is server " +
                                     std::to_string(a.primary) + "); restore it from a checkpoint");
    }
    a = ShardAssignment{a.backup, kNoServer};
    return Status();
  });
}

Result<PublishResult> SetBackup(Coordinator& coord, std::size_t shard, std::int32_t server,
                                std::uint64_t from_epoch, CoordDeadline deadline) {
  return ChangeAt(coord, shard, from_epoch, deadline, [&](ShardAssignment& a) -> Status {
    a.backup = server;
    return Status();  // CheckShardMap refuses a backup that is the primary
  });
}

Result<VersionedShardMap> WaitForShardMap(Coordinator& coord, std::uint64_t after_epoch,
                                          CoordDeadline deadline) {
  for (;;) {
    RDMAPS_ASSIGN_OR_RETURN(ReadResult r, coord.Get(kShardMapKey, deadline));
    if (r.kv) {
      RDMAPS_ASSIGN_OR_RETURN(VersionedShardMap v, FromKv(*r.kv));
      if (v.map.epoch > after_epoch) return v;
    }
    RDMAPS_ASSIGN_OR_RETURN(std::int64_t changed,
                            coord.WaitForChange(kShardMapKey, false, r.revision, deadline));
    (void)changed;
  }
}

}  // namespace rdmaps::internal

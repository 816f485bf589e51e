#include "src/cluster/coord_store.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace rdmaps::internal {
namespace {

constexpr char kMagic[8] = {'R', 'D', 'M', 'A', 'P', 'S', 'C', 'S'};
constexpr std::uint32_t kStateVersion = 1;
constexpr std::size_t kMaxBootIdBytes = 64;

bool HasPrefix(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

void PutU32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutI64(std::string& out, std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void PutBytes(std::string& out, std::string_view b) {
  PutU32(out, static_cast<std::uint32_t>(b.size()));
  out.append(b);
}

// Reads the state file's fields, refusing to step past its end.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  bool U32(std::uint32_t* v) {
    if (rest_.size() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i)
      *v |= std::uint32_t{static_cast<unsigned char>(rest_[i])} << (8 * i);
    rest_.remove_prefix(4);
    return true;
  }
  bool I64(std::int64_t* v) {
    if (rest_.size() < 8) return false;
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= std::uint64_t{static_cast<unsigned char>(rest_[i])} << (8 * i);
    rest_.remove_prefix(8);
    *v = static_cast<std::int64_t>(u);
    return true;
  }
  bool Bytes(std::size_t max, std::string* out) {
    std::uint32_t n = 0;
    if (!U32(&n) || n > max || n > rest_.size()) return false;
    out->assign(rest_.substr(0, n));
    rest_.remove_prefix(n);
    return true;
  }
  bool Raw(std::size_t n, std::string_view* out) {
    if (n > rest_.size()) return false;
    *out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

Status Corrupt(std::string_view what) {
  return InvalidArgumentError(
      "coordinator state file is corrupt (" + std::string(what) +
      "); it is not written by this rdmaps version or was damaged: stop the job and remove the "
      "coordinator directory");
}

}  // namespace

// The key, value and TTL rules of coordinator.h, here with the state machine
// that applies them (so the parsers under fuzz need no transport library).
Status CheckCoordKey(std::string_view key, bool allow_empty_prefix, std::size_t max_bytes) {
  if (key.empty() && !allow_empty_prefix) {
    return InvalidArgumentError("coordinator key is empty");
  }
  if (key.size() > max_bytes) {
    return InvalidArgumentError("coordinator key of " + std::to_string(key.size()) +
                                " bytes; at most " + std::to_string(max_bytes));
  }
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '/' || c == '_' || c == '.' || c == ':' || c == '-';
    if (!ok) {
      return InvalidArgumentError("coordinator key '" + std::string(key.substr(0, 64)) +
                                  "' has a byte outside [A-Za-z0-9/_.:-]");
    }
  }
  return Status();
}

Status CheckCoordValue(std::string_view value) {
  if (value.size() > kMaxCoordValueBytes) {
    return InvalidArgumentError("coordinator value of " + std::to_string(value.size()) +
                                " bytes; at most " + std::to_string(kMaxCoordValueBytes));
  }
  return Status();
}

Status CheckLeaseTtl(std::chrono::milliseconds ttl) {
  if (ttl < kMinLeaseTtl || ttl > kMaxLeaseTtl) {
    return InvalidArgumentError("lease TTL of " + std::to_string(ttl.count()) +
                                " ms; it must be from " + std::to_string(kMinLeaseTtl.count()) +
                                " ms to " + std::to_string(kMaxLeaseTtl.count()) + " ms");
  }
  return Status();
}

void CoordStore::Tombstone(const std::string& key, std::int64_t revision) {
  tombstones_[key] = revision;
  while (tombstones_.size() > kMaxCoordTombstones) {
    auto oldest =
        std::min_element(tombstones_.begin(), tombstones_.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    dropped_revision_ = std::max(dropped_revision_, oldest->second);
    tombstones_.erase(oldest);
  }
}

KeyValue CoordStore::ToKeyValue(const std::string& key, const Entry& e) const {
  return KeyValue{key, e.value, e.create_revision, e.mod_revision, e.lease};
}

bool CoordStore::Expire(Nanos now) {
  bool any_expired = false;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires <= now) {
      it = leases_.erase(it);
      any_expired = true;
    } else {
      ++it;
    }
  }
  if (!any_expired) return false;
  bool deleted = false;
  const std::int64_t rev = revision_ + 1;
  for (auto it = kvs_.begin(); it != kvs_.end();) {
    if (it->second.lease != kNoLease && leases_.count(it->second.lease) == 0) {
      Tombstone(it->first, rev);
      it = kvs_.erase(it);
      deleted = true;
    } else {
      ++it;
    }
  }
  if (deleted) revision_ = rev;
  return true;
}

std::optional<CoordStore::Nanos> CoordStore::NextExpiry() const {
  std::optional<Nanos> next;
  for (const auto& [id, lease] : leases_) {
    if (!next || lease.expires < *next) next = lease.expires;
  }
  return next;
}

Result<LeaseGrant> CoordStore::Grant(std::chrono::milliseconds ttl, Nanos now) {
  RDMAPS_RETURN_IF_ERROR(CheckLeaseTtl(ttl));
  if (leases_.size() >= kMaxCoordLeases) {
    return ResourceExhaustedError("the embedded coordinator holds " +
                                  std::to_string(leases_.size()) +
                                  " leases already (its limit); revoke leases that are not used");
  }
  const Nanos ttl_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(ttl).count();
  const LeaseId id = next_lease_++;
  leases_[id] = Lease{ttl_ns, now + ttl_ns};
  return LeaseGrant{id, ttl};
}

Status CoordStore::KeepAlive(LeaseId lease, Nanos now) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) {
    return NotFoundError("lease " + std::to_string(lease) +
                         " has expired or was revoked: its keys are gone");
  }
  it->second.expires = now + it->second.ttl;
  return Status();
}

void CoordStore::Revoke(LeaseId lease) {
  if (leases_.erase(lease) == 0) return;
  bool deleted = false;
  const std::int64_t rev = revision_ + 1;
  for (auto it = kvs_.begin(); it != kvs_.end();) {
    if (it->second.lease == lease) {
      Tombstone(it->first, rev);
      it = kvs_.erase(it);
      deleted = true;
    } else {
      ++it;
    }
  }
  if (deleted) revision_ = rev;
}

ReadResult CoordStore::Get(std::string_view key) const {
  ReadResult r;
  r.revision = revision_;
  auto it = kvs_.find(key);
  if (it != kvs_.end()) r.kv = ToKeyValue(it->first, it->second);
  return r;
}

Result<ListResult> CoordStore::List(std::string_view prefix) const {
  ListResult r;
  r.revision = revision_;
  for (auto it = kvs_.lower_bound(prefix); it != kvs_.end() && HasPrefix(it->first, prefix); ++it) {
    if (r.kvs.size() >= kMaxCoordListKeys) {
      return ResourceExhaustedError("more than " + std::to_string(kMaxCoordListKeys) +
                                    " keys under '" + std::string(prefix) +
                                    "'; list a narrower prefix");
    }
    r.kvs.push_back(ToKeyValue(it->first, it->second));
  }
  return r;
}

Result<CasResult> CoordStore::CompareAndSwap(std::string_view key,
                                             std::int64_t expected_mod_revision,
                                             std::string_view value, LeaseId lease) {
  if (lease != kNoLease && leases_.count(lease) == 0) {
    return NotFoundError("lease " + std::to_string(lease) +
                         " has expired or was revoked; grant a new one");
  }
  CasResult r;
  auto it = kvs_.find(key);
  const std::int64_t current = it == kvs_.end() ? 0 : it->second.mod_revision;
  if (current != expected_mod_revision) {
    r.revision = revision_;
    if (it != kvs_.end()) r.current = ToKeyValue(it->first, it->second);
    return r;
  }
  if (it == kvs_.end() && kvs_.size() >= kMaxCoordKeys) {
    return ResourceExhaustedError("the embedded coordinator holds " + std::to_string(kvs_.size()) +
                                  " keys already (its limit)");
  }
  const std::int64_t rev = ++revision_;
  if (it == kvs_.end()) {
    it = kvs_.emplace(std::string(key), Entry{}).first;
    it->second.create_revision = rev;
  }
  it->second.value.assign(value);
  it->second.mod_revision = rev;
  it->second.lease = lease;
  tombstones_.erase(it->first);
  r.swapped = true;
  r.revision = rev;
  return r;
}

void CoordStore::Delete(std::string_view key) {
  auto it = kvs_.find(key);
  if (it == kvs_.end()) return;
  const std::int64_t rev = ++revision_;
  Tombstone(it->first, rev);
  kvs_.erase(it);
}

std::int64_t CoordStore::LastChange(std::string_view key, bool prefix) const {
  std::int64_t last = 0;
  if (!prefix) {
    if (auto it = kvs_.find(key); it != kvs_.end()) last = it->second.mod_revision;
    if (auto it = tombstones_.find(key); it != tombstones_.end()) last = std::max(last, it->second);
  } else {
    for (auto it = kvs_.lower_bound(key); it != kvs_.end() && HasPrefix(it->first, key); ++it) {
      last = std::max(last, it->second.mod_revision);
    }
    for (auto it = tombstones_.lower_bound(key);
         it != tombstones_.end() && HasPrefix(it->first, key); ++it) {
      last = std::max(last, it->second);
    }
  }
  // A dropped tombstone may have been this key's: report at least its
  // revision (an early wake-up, never a missed one).
  return std::max(last, dropped_revision_);
}

std::string CoordStore::EncodeWithBoot(std::string_view boot_id) const {
  std::string out(kMagic, sizeof(kMagic));
  PutU32(out, kStateVersion);
  PutBytes(out, boot_id.substr(0, kMaxBootIdBytes));
  PutI64(out, revision_);
  PutI64(out, next_lease_);
  PutI64(out, dropped_revision_);
  PutU32(out, static_cast<std::uint32_t>(leases_.size()));
  for (const auto& [id, lease] : leases_) {
    PutI64(out, id);
    PutI64(out, lease.ttl);
    PutI64(out, lease.expires);
  }
  PutU32(out, static_cast<std::uint32_t>(kvs_.size()));
  for (const auto& [key, e] : kvs_) {
    PutBytes(out, key);
    PutBytes(out, e.value);
    PutI64(out, e.create_revision);
    PutI64(out, e.mod_revision);
    PutI64(out, e.lease);
  }
  PutU32(out, static_cast<std::uint32_t>(tombstones_.size()));
  for (const auto& [key, rev] : tombstones_) {
    PutBytes(out, key);
    PutI64(out, rev);
  }
  return out;
}

Result<CoordStore> ParseCoordStore(std::string_view bytes, std::string_view boot_id,
                                   CoordStore::Nanos now) {
  CoordStore s;
  if (bytes.empty()) return s;
  Reader r(bytes);
  std::string_view magic;
  if (!r.Raw(sizeof(kMagic), &magic) || std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt("bad magic");
  }
  std::uint32_t version = 0;
  if (!r.U32(&version)) return Corrupt("truncated header");
  if (version != kStateVersion) {
    return Corrupt("state version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kStateVersion));
  }
  std::string boot;
  if (!r.Bytes(kMaxBootIdBytes, &boot) || !r.I64(&s.revision_) || !r.I64(&s.next_lease_) ||
      !r.I64(&s.dropped_revision_)) {
    return Corrupt("truncated header");
  }
  if (s.revision_ < 1 || s.revision_ == std::numeric_limits<std::int64_t>::max() ||
      s.next_lease_ < 1 || s.next_lease_ == std::numeric_limits<std::int64_t>::max() ||
      s.dropped_revision_ < 0 || s.dropped_revision_ > s.revision_) {
    return Corrupt("revision counters out of range");
  }
  const bool same_boot = boot == boot_id.substr(0, kMaxBootIdBytes);
  std::uint32_t n = 0;
  if (!r.U32(&n) || n > kMaxCoordLeases) return Corrupt("lease count");
  for (std::uint32_t i = 0; i < n; ++i) {
    LeaseId id = 0;
    CoordStore::Lease lease;
    if (!r.I64(&id) || !r.I64(&lease.ttl) || !r.I64(&lease.expires))
      return Corrupt("truncated lease");
    const auto ttl_ms = std::chrono::milliseconds(lease.ttl / 1000000);
    if (id < 1 || id >= s.next_lease_ || lease.ttl % 1000000 != 0 || !CheckLeaseTtl(ttl_ms).ok() ||
        !s.leases_.emplace(id, lease).second) {
      return Corrupt("lease " + std::to_string(id) + " out of range or repeated");
    }
    // Another boot's monotonic times mean nothing here: expired.
    if (!same_boot) s.leases_[id].expires = now;
  }
  if (!r.U32(&n) || n > kMaxCoordKeys) return Corrupt("key count");
  for (std::uint32_t i = 0; i < n; ++i) {
    std::string key;
    CoordStore::Entry e;
    if (!r.Bytes(kMaxCoordStoredKeyBytes, &key) || !r.Bytes(kMaxCoordValueBytes, &e.value) ||
        !r.I64(&e.create_revision) || !r.I64(&e.mod_revision) || !r.I64(&e.lease)) {
      return Corrupt("truncated key");
    }
    if (!CheckCoordKey(key, false, kMaxCoordStoredKeyBytes).ok() || e.create_revision < 1 ||
        e.create_revision > e.mod_revision || e.mod_revision > s.revision_ ||
        (e.lease != kNoLease && s.leases_.count(e.lease) == 0) ||
        !s.kvs_.emplace(key, std::move(e)).second) {
      return Corrupt("key '" + key + "' out of range or repeated");
    }
  }
  if (!r.U32(&n) || n > kMaxCoordTombstones) return Corrupt("tombstone count");
  for (std::uint32_t i = 0; i < n; ++i) {
    std::string key;
    std::int64_t rev = 0;
    if (!r.Bytes(kMaxCoordStoredKeyBytes, &key) || !r.I64(&rev)) {
      return Corrupt("truncated tombstone");
    }
    if (!CheckCoordKey(key, false, kMaxCoordStoredKeyBytes).ok() || rev < 1 || rev > s.revision_ ||
        !s.tombstones_.emplace(key, rev).second) {
      return Corrupt("tombstone '" + key + "' out of range or repeated");
    }
  }
  if (!r.done()) return Corrupt("trailing bytes");
  return s;
}

}  // namespace rdmaps::internal

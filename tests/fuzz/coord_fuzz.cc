// Fuzz target: the coordination layer's parsers of hostile bytes
// (src/cluster/shard_map.h, coord_store.h, etcd_coordinator.h). Input: one
// selector byte, then the text. 0: a shard map record (oracle: an accepted
// map re-encodes to the same bytes); 1: the directory coordinator's state
// file (oracle: an accepted state re-encodes to a state that parses again
// to the same encoding); 2: an etcd reply (oracle: only the documented
// status codes, and accepted kvs lie inside the job prefix with valid keys).
#include <cstdint>
#include <string>
#include <string_view>

#include "src/cluster/coord_store.h"
#include "src/cluster/etcd_coordinator.h"
#include "src/cluster/shard_map.h"
#include "tests/fuzz/fuzz_util.h"

namespace in = rdmaps::internal;
using rdmaps::StatusCode;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::QuietLogs();
  rdmaps::fuzz::Bytes bytes(data, size);
  const auto which = bytes.Take<std::uint8_t>() % 3;
  const std::string_view text = bytes.Rest();
  if (which == 0) {
    auto map = in::ParseShardMap(text);
    if (!map.ok()) {
      RDMAPS_FUZZ_ASSERT(map.status().code() == StatusCode::kInvalidArgument);
      return 0;
    }
    RDMAPS_FUZZ_ASSERT(in::CheckShardMap(*map).ok());
    RDMAPS_FUZZ_ASSERT(in::EncodeShardMap(*map) == text);
  } else if (which == 1) {
    auto store = in::ParseCoordStore(text, "boot", 0);
    if (!store.ok()) {
      RDMAPS_FUZZ_ASSERT(store.status().code() == StatusCode::kInvalidArgument);
      return 0;
    }
    const std::string again = store->EncodeWithBoot("boot");
    auto back = in::ParseCoordStore(again, "boot", 0);
    RDMAPS_FUZZ_ASSERT(back.ok() && back->EncodeWithBoot("boot") == again);
    store->Expire(1);  // expiry of whatever leases it holds must be safe
  } else {
    auto reply = in::ParseEtcdReply(text);
    if (!reply.ok()) return 0;  // an error reply or hostile bytes: a Status either way
    auto range = in::ParseEtcdRange(*reply, "job/");
    if (range.ok()) {
      for (const auto& kv : range->kvs) {
        RDMAPS_FUZZ_ASSERT(in::CheckCoordKey(kv.key).ok());
        RDMAPS_FUZZ_ASSERT(kv.mod_revision >= 1 && kv.mod_revision <= range->revision);
      }
    }
    auto cas = in::ParseEtcdCas(*reply, "job/");
    if (cas.ok() && cas->current) RDMAPS_FUZZ_ASSERT(in::CheckCoordKey(cas->current->key).ok());
    auto watch = in::ParseEtcdWatchMessage(*reply, 5);
    if (watch.ok()) RDMAPS_FUZZ_ASSERT(*watch == 0 || *watch > 5);
  }
  return 0;
}

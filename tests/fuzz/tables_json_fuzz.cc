// Fuzz target: the tables JSON of rdmaps-server/rdmaps-local --tables
// (include/rdmaps/tables_json.h). Input: the JSON text. Oracle: an accepted
// list passes the server's own table checks' size arithmetic without
// wrapping and survives a round trip through TablesToJson unchanged in
// count; the "checkpoint" object parses exactly when the list does, and
// an accepted one applies to ServerOptions within its bounds.
#include <cstdint>
#include <string_view>

#include "rdmaps/tables_json.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::QuietLogs();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tables = rdmaps::ParseTablesJson(text);
  auto ck = rdmaps::ParseCheckpointSettings(text);
  if (ck.ok()) {
    rdmaps::ServerOptions o;
    ck->ApplyTo(&o);
    RDMAPS_FUZZ_ASSERT(o.checkpoint_interval.count() >= 0 && o.checkpoint_timeout.count() >= 0);
  } else {
    RDMAPS_FUZZ_ASSERT(ck.status().code() == rdmaps::StatusCode::kInvalidArgument);
    RDMAPS_FUZZ_ASSERT(!tables.ok());
  }
  if (!tables.ok()) {
    RDMAPS_FUZZ_ASSERT(tables.status().code() == rdmaps::StatusCode::kInvalidArgument);
    return 0;
  }
  for (const rdmaps::TableOptions& t : *tables) RDMAPS_FUZZ_ASSERT(t.rows >= 1 && t.dim >= 1);
  auto again = rdmaps::ParseTablesJson(rdmaps::TablesToJson(*tables));
  RDMAPS_FUZZ_ASSERT(again.ok() && again->size() == tables->size());
  return 0;
}

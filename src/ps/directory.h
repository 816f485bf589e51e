// A server's directory: what it publishes for workers to READ at bootstrap
// (its tables' shards, the push rings, the control block and the barrier
// counter; byte layout in src/ps/wire.h), and the worker's view of the
// tables that the directories of all servers together describe.
//
// The server fills a Directory and encodes it into registered memory
// (EncodeDirectory); a worker decodes each server's copy (ParseDirectory),
// which refuses anything it cannot use safely with a Status naming the
// cause, then merges them into its tables (AddServerTables), server 0
// first, and checks them against what it was told (CheckWantedTables).
// No transport is involved: the tests feed bytes in.
//
// Thread safety: plain functions and values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "src/ps/wire.h"

namespace rdmaps::internal {

// One server's directory, decoded.
struct Directory {
  DirectoryHeader header{};
  std::vector<DirectoryTable> tables;  // names NUL-terminated
  std::vector<WireRegion> rings;       // per worker: its push ring on this server
};

// The entry of a table whose shard `shard` lies in `region`, laid out as
// `geometry` says (GeometryOf of the table's resolved layout).
DirectoryTable DirectoryEntry(const TableOptions& table, const ShardRange& shard,
                              const ShardGeometry& geometry, const WireRegion& region);

// The shard geometry of server `server` of `num_servers` for a table of
// `rows` x `dim` whose layout resolved to `layout`: what the server lays out
// and what a worker checks a directory entry against.
ShardGeometry ShardGeometryOf(std::uint32_t layout, std::uint64_t rows, std::uint32_t dim,
                              std::uint32_t num_servers, std::uint32_t server);

// Bytes EncodeDirectory writes for `dir`.
std::size_t EncodedBytes(const Directory& dir);

// Writes `dir` to `out` (EncodedBytes(dir) bytes), header.num_tables from
// dir.tables.
void EncodeDirectory(const Directory& dir, std::byte* out);

// What a worker was told about the job, to check a directory against.
struct DirectoryExpectation {
  std::uint32_t server_index = 0;
  std::uint32_t num_servers = 1;
  std::uint32_t num_workers = 1;
};

// Decodes the directory of one server as READ (`bytes`) and checks that a
// worker can use it: a complete directory of this layout version, of the
// server and job the worker expects, each table once, of a layout it knows,
// with the range partition and shard geometry it computes itself, and every
// region at least as long as what the worker reads or writes in it.
// DataLoss for a short or inconsistent directory, FailedPrecondition for
// one of another build or another job. `who` names the server in messages.
Result<Directory> ParseDirectory(std::span<const std::byte> bytes,
                                 const DirectoryExpectation& expect, std::string_view who);

// Where a table's shard lies on one server, as its directory says.
struct ShardRemote {
  std::uint64_t begin = 0;
  std::uint64_t count = 0;
  std::uint64_t base = 0;  // the shard's region, laid out as `geo` says
  std::uint32_t rkey = 0;
  ShardGeometry geo;
};

// A table as a worker sees it: its description and its shard on every
// server.
struct RemoteTable {
  TableInfo info;
  std::uint32_t layout = kLayoutDense;
  std::uint32_t rows_per_block = 1;  // the same on every shard
  std::size_t block_stride = 0;      // of the inline layout (the same on every shard)
  std::vector<ShardRemote> shards;   // per server
  // A dense table pulled by scattered ids was pointed at the inline layout
  // (logged once per client and table); under the client's mutex.
  mutable bool layout_hint_logged = false;
  bool inline_headers() const { return layout == kLayoutInline; }
};

using RemoteTables = std::unordered_map<std::uint32_t, RemoteTable>;

// Adds the tables of server `server`'s directory `dir` (checked by
// ParseDirectory) to `tables`: server 0's define them, every later server
// must publish the same tables (FailedPrecondition otherwise).
Status AddServerTables(const Directory& dir, std::uint32_t server, std::string_view who,
                       RemoteTables* tables);

// FailedPrecondition unless every table of `wanted` (ClientOptions.tables;
// may be empty) is what the servers publish.
Status CheckWantedTables(const RemoteTables& tables, const std::vector<TableOptions>& wanted,
                         std::uint32_t num_servers);

}  // namespace rdmaps::internal

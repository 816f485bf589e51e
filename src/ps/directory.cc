#include "src/ps/directory.h"

#include <algorithm>
#include <cstring>

namespace rdmaps::internal {

DirectoryTable DirectoryEntry(const TableOptions& table, const ShardRange& shard,
                              const ShardGeometry& geometry, const WireRegion& region) {
  DirectoryTable d{};
  d.id = table.id;
  d.dim = table.dim;
  d.rows = table.rows;
  d.shard_begin = shard.begin;
  d.shard_rows = shard.count;
  d.staleness = table.staleness;
  d.row_bytes = static_cast<std::uint32_t>(RowBytes(table.dim));
  d.shard = region;
  d.headers_offset = geometry.headers_offset;
  d.layout = geometry.layout;
  d.block_stride = static_cast<std::uint32_t>(geometry.block_stride);
  d.rows_per_block = geometry.rows_per_block;
  std::memcpy(d.name, table.name.data(), std::min(table.name.size(), sizeof(d.name) - 1));
  return d;
}

ShardGeometry ShardGeometryOf(std::uint32_t layout, std::uint64_t rows, std::uint32_t dim,
                              std::uint32_t num_servers, std::uint32_t server) {
  return GeometryOf(layout, PartitionOf(rows, num_servers, server).count, dim,
                    RowsPerBlock(layout, rows, dim, num_servers));
}

std::size_t EncodedBytes(const Directory& dir) {
  return DirectoryBytes(static_cast<std::uint32_t>(dir.tables.size()),
                        static_cast<std::uint32_t>(dir.rings.size()));
}

void EncodeDirectory(const Directory& dir, std::byte* out) {
  DirectoryHeader h = dir.header;
  h.num_tables = static_cast<std::uint32_t>(dir.tables.size());
  std::memcpy(out, &h, sizeof(h));
  out += sizeof(h);
  for (const DirectoryTable& d : dir.tables) {
    std::memcpy(out, &d, sizeof(d));
    out += sizeof(d);
  }
  for (const WireRegion& ring : dir.rings) {
    const DirectoryWorker w{ring};
    std::memcpy(out, &w, sizeof(w));
    out += sizeof(w);
  }
}

namespace {

// DataLoss unless `region` (`what`) holds at least `need` bytes.
Status CheckRegion(std::string_view who, const std::string& what, const WireRegion& region,
                   std::uint64_t need) {
  if (region.length >= need) return Status::OK();
  return DataLossError(std::string(who) + ": directory gives " + what + " " +
                       std::to_string(region.length) + " bytes, it needs " + std::to_string(need));
}

// Checks one table entry of `who`'s directory (header `h`).
Status CheckTable(const DirectoryHeader& h, const DirectoryTable& d, std::string_view who) {
  const std::string name = d.name;
  if (d.layout != kLayoutDense && d.layout != kLayoutInline) {
    return FailedPreconditionError(std::string(who) + ": table '" + name + "' has row layout " +
                                   std::to_string(d.layout) +
                                   ", which this client does not know; run the same "
                                   "rdmaps build everywhere");
  }
  const auto not_computed = [&] {
    return FailedPreconditionError(std::string(who) + ": shard of table '" + name +
                                   "' is not the range partition and layout this client "
                                   "computes; run the same rdmaps build everywhere");
  };
  // (Before the geometry: RowsPerBlock divides by the row size, and
  // GeometryOf's products must not wrap.)
  if (d.dim == 0 || d.dim > kMaxDim || d.row_bytes != RowBytes(d.dim)) return not_computed();
  const std::optional<std::uint64_t> bound = TableBytesBound(d.rows, d.dim);
  if (d.rows == 0 || !bound || *bound > kMaxTableBytes) {
    return DataLossError(std::string(who) + ": table '" + name + "' has " + std::to_string(d.rows) +
                         " rows of dim " + std::to_string(d.dim) + ", more than " +
                         std::to_string(kMaxTableBytes) + " bytes; the directory is corrupt");
  }
  const ShardRange expect = PartitionOf(d.rows, h.num_servers, h.server_index);
  const ShardGeometry g = ShardGeometryOf(d.layout, d.rows, d.dim, h.num_servers, h.server_index);
  if (d.shard_begin != expect.begin || d.shard_rows != expect.count ||
      d.headers_offset != g.headers_offset || d.rows_per_block != g.rows_per_block ||
      d.block_stride != g.block_stride || d.shard.length < g.bytes) {
    return not_computed();
  }
  if (SlotRowCapacity(h.slot_bytes, d.dim, true) == 0) {
    return DataLossError(std::string(who) + ": push slots of " + std::to_string(h.slot_bytes) +
                         " bytes cannot hold one row of table '" + name + "'");
  }
  return Status::OK();
}

}  // namespace

Result<Directory> ParseDirectory(std::span<const std::byte> bytes,
                                 const DirectoryExpectation& expect, std::string_view who) {
  const std::string at(who);
  Directory dir;
  if (bytes.size() < sizeof(DirectoryHeader)) return DataLossError(at + ": directory too short");
  DirectoryHeader& h = dir.header;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kDirectoryMagic || h.layout_version != kLayoutVersion) {
    return FailedPreconditionError(at + ": directory layout version " +
                                   std::to_string(h.layout_version) + ", this client speaks " +
                                   std::to_string(kLayoutVersion) +
                                   "; run the same rdmaps build everywhere");
  }
  if (h.num_servers != expect.num_servers || h.server_index != expect.server_index ||
      h.num_workers != expect.num_workers) {
    return FailedPreconditionError(
        at + " believes it is server " + std::to_string(h.server_index) + " of " +
        std::to_string(h.num_servers) + " with " + std::to_string(h.num_workers) +
        " workers; this worker was given " + std::to_string(expect.num_servers) + " servers and " +
        std::to_string(expect.num_workers) + " workers. Start everyone with the same layout");
  }
  if (bytes.size() < DirectoryBytes(h.num_tables, h.num_workers)) {
    return DataLossError(at + ": directory shorter than its header says");
  }
  // A slot must hold its header (and, below, one row of every table).
  if (h.ring_slots == 0 || h.slot_bytes < sizeof(SlotHeader)) {
    return DataLossError(at + ": directory gives push rings of " + std::to_string(h.ring_slots) +
                         " slots of " + std::to_string(h.slot_bytes) + " bytes");
  }
  RDMAPS_RETURN_IF_ERROR(
      CheckRegion(who, "the control block", h.control, ControlBlockBytes(h.num_workers)));
  RDMAPS_RETURN_IF_ERROR(CheckRegion(who, "the barrier counter", h.atomics, sizeof(std::uint64_t)));
  const std::byte* p = bytes.data() + sizeof(h);
  dir.tables.resize(h.num_tables);
  for (std::uint32_t i = 0; i < h.num_tables; ++i, p += sizeof(DirectoryTable)) {
    DirectoryTable& d = dir.tables[i];
    std::memcpy(&d, p, sizeof(d));
    d.name[sizeof(d.name) - 1] = '\0';
    RDMAPS_RETURN_IF_ERROR(CheckTable(h, d, who));
    for (std::uint32_t j = 0; j < i; ++j) {
      if (dir.tables[j].id == d.id) {
        return DataLossError(at + ": directory lists table " + std::to_string(d.id) + " twice");
      }
    }
  }
  dir.rings.resize(h.num_workers);
  const std::uint64_t ring_bytes = std::uint64_t{h.ring_slots} * h.slot_bytes;
  for (std::uint32_t w = 0; w < h.num_workers; ++w, p += sizeof(DirectoryWorker)) {
    std::memcpy(&dir.rings[w], p, sizeof(WireRegion));
    RDMAPS_RETURN_IF_ERROR(
        CheckRegion(who, "the push ring of worker " + std::to_string(w), dir.rings[w], ring_bytes));
  }
  return dir;
}

Status AddServerTables(const Directory& dir, std::uint32_t server, std::string_view who,
                       RemoteTables* tables) {
  const std::uint32_t S = dir.header.num_servers;
  for (const DirectoryTable& d : dir.tables) {
    auto it = tables->find(d.id);
    if (server == 0) {
      RemoteTable t;
      t.info.id = d.id;
      t.info.name = d.name;
      t.info.rows = d.rows;
      t.info.dim = d.dim;
      t.info.staleness = d.staleness;
      t.info.layout = static_cast<RowLayout>(d.layout);
      t.layout = d.layout;
      t.rows_per_block = d.rows_per_block;
      t.block_stride = d.block_stride;
      t.shards.resize(S);
      it = tables->emplace(d.id, std::move(t)).first;
    } else if (it == tables->end() || it->second.info.rows != d.rows ||
               it->second.info.dim != d.dim || it->second.info.name != d.name ||
               it->second.layout != d.layout) {
      return FailedPreconditionError(std::string(who) + " publishes table " + std::to_string(d.id) +
                                     " ('" + d.name +
                                     "') differently from server 0; give every server the "
                                     "same table list");
    }
    it->second.shards[server] = {d.shard_begin, d.shard_rows, d.shard.addr, d.shard.rkey,
                                 ShardGeometryOf(d.layout, d.rows, d.dim, S, server)};
  }
  if (server != 0 && dir.tables.size() != tables->size()) {
    return FailedPreconditionError(std::string(who) + " has " + std::to_string(dir.tables.size()) +
                                   " tables, server 0 has " + std::to_string(tables->size()) +
                                   "; give every server the same table list");
  }
  return Status::OK();
}

Status CheckWantedTables(const RemoteTables& tables, const std::vector<TableOptions>& wanted,
                         std::uint32_t num_servers) {
  for (const TableOptions& want : wanted) {
    auto it = tables.find(want.id);
    if (it == tables.end() || it->second.info.name != want.name ||
        it->second.info.rows != want.rows || it->second.info.dim != want.dim ||
        it->second.layout != ResolveRowLayout(static_cast<std::uint32_t>(want.layout), want.rows,
                                              want.dim, num_servers)) {
      return FailedPreconditionError("table " + std::to_string(want.id) + " ('" + want.name +
                                     "') of ClientOptions.tables is not what the servers "
                                     "publish; give workers and servers the same table list");
    }
  }
  return Status::OK();
}

}  // namespace rdmaps::internal

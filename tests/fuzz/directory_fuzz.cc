// Fuzz target: a worker's decoding of a server's directory
// (src/ps/directory.h, ParseDirectory + AddServerTables). Input: u8 server
// index, u8 servers, u8 workers, then the directory bytes as READ. Oracle:
// every region of an accepted directory is at least as long as what the
// worker computes it reads or writes there, computed without wrapping.
#include <cstdint>

#include "src/ps/directory.h"
#include "tests/fuzz/fuzz_util.h"

namespace in = rdmaps::internal;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::Bytes bytes(data, size);
  in::DirectoryExpectation expect;
  expect.num_servers = 1 + bytes.Take<std::uint8_t>() % 4;
  expect.server_index = bytes.Take<std::uint8_t>() % expect.num_servers;
  expect.num_workers = 1 + bytes.Take<std::uint8_t>() % 8;
  const std::string_view rest = bytes.Rest();
  auto dir = in::ParseDirectory({reinterpret_cast<const std::byte*>(rest.data()), rest.size()},
                                expect, "fuzzed server");
  if (!dir.ok()) return 0;
  RDMAPS_FUZZ_ASSERT(dir->rings.size() == expect.num_workers);
  for (const in::DirectoryTable& d : dir->tables) {
    const in::ShardGeometry g =
        in::ShardGeometryOf(d.layout, d.rows, d.dim, expect.num_servers, expect.server_index);
    RDMAPS_FUZZ_ASSERT(g.bytes <= d.shard.length);
    RDMAPS_FUZZ_ASSERT(g.rows == d.shard_rows);
    if (g.rows > 0) {
      // The last row and header a worker reads lie inside the region.
      const std::uint64_t last = g.rows - 1;
      RDMAPS_FUZZ_ASSERT(g.row(last) + g.row_bytes <= g.bytes);
      RDMAPS_FUZZ_ASSERT(g.header(g.block_of(last)) + sizeof(in::BlockHeader) <= g.bytes);
    }
  }
  in::RemoteTables tables;
  (void)in::AddServerTables(*dir, 0, "fuzzed server", &tables);
  return 0;
}

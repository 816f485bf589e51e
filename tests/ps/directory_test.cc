// The directory without a transport: what a server encodes decodes to the
// same directory, the directories of all servers merge into the tables a
// worker pulls from, and each refusal of a directory the worker cannot use
// safely, with its code and message.
#include "src/ps/directory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace rdmaps::internal {
namespace {

using ::testing::HasSubstr;

constexpr std::uint32_t kSlots = 4;
constexpr std::uint32_t kSlotBytes = 4096;

TableOptions Table(std::uint32_t id, std::string name, std::uint64_t rows, std::uint32_t dim,
                   RowLayout layout = RowLayout::kAuto) {
  TableOptions t;
  t.id = id;
  t.name = std::move(name);
  t.rows = rows;
  t.dim = dim;
  t.staleness = 2;
  t.layout = layout;
  return t;
}

std::vector<TableOptions> Tables() {
  return {Table(1, "dense", 100000, 64, RowLayout::kDense),
          Table(2, "inline", 1000, 8, RowLayout::kInline), Table(7, "auto", 50, 3)};
}

// The directory of server `server` of `S`, built as the server builds it
// (fake region addresses, exact lengths).
Directory ServerDirectory(std::uint32_t S, std::uint32_t server, std::uint32_t W,
                          const std::vector<TableOptions>& tables) {
  Directory dir;
  DirectoryHeader& h = dir.header;
  h.magic = kDirectoryMagic;
  h.layout_version = kLayoutVersion;
  h.server_index = server;
  h.num_servers = S;
  h.num_workers = W;
  h.ring_slots = kSlots;
  h.slot_bytes = kSlotBytes;
  std::uint64_t addr = 0x10000 * (server + 1);
  auto region = [&](std::uint64_t length) {
    const WireRegion r{addr, length, static_cast<std::uint32_t>(addr >> 8), 0};
    addr += length + 4096;
    return r;
  };
  h.control = region(ControlBlockBytes(W));
  h.atomics = region(kAtomicsBytes);
  for (const TableOptions& t : tables) {
    const std::uint32_t layout =
        ResolveRowLayout(static_cast<std::uint32_t>(t.layout), t.rows, t.dim, S);
    const ShardGeometry g = ShardGeometryOf(layout, t.rows, t.dim, S, server);
    dir.tables.push_back(DirectoryEntry(t, PartitionOf(t.rows, S, server), g, region(g.bytes)));
  }
  for (std::uint32_t w = 0; w < W; ++w) {
    dir.rings.push_back(region(std::uint64_t{kSlots} * kSlotBytes));
  }
  return dir;
}

std::vector<std::byte> Encode(const Directory& dir) {
  std::vector<std::byte> bytes(EncodedBytes(dir));
  EncodeDirectory(dir, bytes.data());
  return bytes;
}

Result<Directory> Parse(const std::vector<std::byte>& bytes, std::uint32_t S = 2,
                        std::uint32_t server = 1, std::uint32_t W = 3) {
  return ParseDirectory(bytes, {server, S, W}, "server " + std::to_string(server) + " (h:1)");
}

// The status of parsing `dir` (server 1 of 2, 3 workers) after `mutate`
// changed its encoding.
template <typename Mutate>
Status ParseChanged(Mutate mutate) {
  Directory dir = ServerDirectory(2, 1, 3, Tables());
  mutate(dir);
  return Parse(Encode(dir)).status();
}

void ExpectRefused(const Status& s, StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(s.message(), HasSubstr(text));
}

bool SameBytes(const DirectoryTable& a, const DirectoryTable& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

TEST(DirectoryTest, RoundTripsEveryField) {
  const Directory dir = ServerDirectory(2, 1, 3, Tables());
  const std::vector<std::byte> bytes = Encode(dir);
  ASSERT_EQ(bytes.size(), DirectoryBytes(3, 3));
  Result<Directory> back = Parse(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  DirectoryHeader want = dir.header;
  want.num_tables = 3;
  EXPECT_EQ(std::memcmp(&back->header, &want, sizeof(want)), 0);
  ASSERT_EQ(back->tables.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(SameBytes(back->tables[i], dir.tables[i])) << i;
  EXPECT_STREQ(back->tables[1].name, "inline");
  EXPECT_EQ(back->tables[2].layout, kLayoutInline);  // auto, small
  ASSERT_EQ(back->rings.size(), 3u);
  for (std::size_t w = 0; w < 3; ++w) {
    EXPECT_EQ(back->rings[w].addr, dir.rings[w].addr);
    EXPECT_EQ(back->rings[w].length, dir.rings[w].length);
    EXPECT_EQ(back->rings[w].rkey, dir.rings[w].rkey);
  }
  // Bytes past the directory (a longer region) are ignored.
  std::vector<std::byte> longer = bytes;
  longer.resize(bytes.size() + 100);
  EXPECT_TRUE(Parse(longer).ok());
}

TEST(DirectoryTest, EveryServersDirectoryMergesIntoTheTables) {
  constexpr std::uint32_t S = 3;
  RemoteTables tables;
  for (std::uint32_t s = 0; s < S; ++s) {
    Result<Directory> dir = Parse(Encode(ServerDirectory(S, s, 2, Tables())), S, s, 2);
    ASSERT_TRUE(dir.ok()) << dir.status();
    ASSERT_TRUE(AddServerTables(*dir, s, "server", &tables).ok());
  }
  ASSERT_EQ(tables.size(), 3u);
  const RemoteTable& dense = tables.at(1);
  EXPECT_EQ(dense.info.name, "dense");
  EXPECT_EQ(dense.info.rows, 100000u);
  EXPECT_EQ(dense.info.dim, 64u);
  EXPECT_EQ(dense.info.staleness, 2u);
  EXPECT_EQ(dense.info.layout, RowLayout::kDense);
  ASSERT_EQ(dense.shards.size(), S);
  std::uint64_t next = 0;
  for (std::uint32_t s = 0; s < S; ++s) {
    const ShardRemote& sh = dense.shards[s];
    EXPECT_EQ(sh.begin, next);
    EXPECT_EQ(sh.count, PartitionOf(100000, S, s).count);
    EXPECT_EQ(sh.geo.bytes, ShardGeometryOf(kLayoutDense, 100000, 64, S, s).bytes);
    EXPECT_NE(sh.base, 0u);
    next += sh.count;
  }
  EXPECT_EQ(next, 100000u);
  EXPECT_TRUE(tables.at(2).inline_headers());
  EXPECT_EQ(tables.at(2).block_stride, tables.at(2).shards[0].geo.block_stride);
  EXPECT_TRUE(CheckWantedTables(tables, Tables(), S).ok());
  EXPECT_TRUE(CheckWantedTables(tables, {}, S).ok());
}

TEST(DirectoryTest, RefusesAShortDirectory) {
  const std::vector<std::byte> bytes = Encode(ServerDirectory(2, 1, 3, Tables()));
  ExpectRefused(Parse({bytes.begin(), bytes.begin() + sizeof(DirectoryHeader) - 1}).status(),
                StatusCode::kDataLoss, "server 1 (h:1): directory too short");
  ExpectRefused(Parse({bytes.begin(), bytes.end() - 1}).status(), StatusCode::kDataLoss,
                "server 1 (h:1): directory shorter than its header says");
}

TEST(DirectoryTest, RefusesCountsThatOverflowTheDirectory) {
  // Counts far beyond the bytes READ: their product with the entry sizes
  // does not wrap in 64 bits, so the directory is merely short.
  std::vector<std::byte> bytes = Encode(ServerDirectory(2, 1, 3, Tables()));
  DirectoryHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  h.num_tables = 0xffffffffu;
  std::memcpy(bytes.data(), &h, sizeof(h));
  ExpectRefused(Parse(bytes).status(), StatusCode::kDataLoss, "shorter than its header says");
  h.num_tables = 3;
  h.num_workers = 0xffffffffu;
  std::memcpy(bytes.data(), &h, sizeof(h));
  ExpectRefused(ParseDirectory(bytes, {1, 2, 0xffffffffu}, "server 1").status(),
                StatusCode::kDataLoss, "shorter than its header says");
}

TEST(DirectoryTest, RefusesAnotherMagicOrLayoutVersion) {
  ExpectRefused(ParseChanged([](Directory& d) { d.header.layout_version = kLayoutVersion - 1; }),
                StatusCode::kFailedPrecondition,
                "server 1 (h:1): directory layout version " + std::to_string(kLayoutVersion - 1) +
                    ", this client speaks " + std::to_string(kLayoutVersion) +
                    "; run the same rdmaps build everywhere");
  ExpectRefused(ParseChanged([](Directory& d) { d.header.magic = kBootstrapMagic; }),
                StatusCode::kFailedPrecondition, "directory layout version");
}

TEST(DirectoryTest, RefusesAnotherServerOrJob) {
  const std::string want = "this worker was given 2 servers and 3 workers";
  ExpectRefused(ParseChanged([](Directory& d) { d.header.server_index = 0; }),
                StatusCode::kFailedPrecondition, "server 1 (h:1) believes it is server 0 of 2");
  ExpectRefused(ParseChanged([](Directory& d) { d.header.num_servers = 3; }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.header.num_workers = 4; }),
                StatusCode::kFailedPrecondition, "with 4 workers; " + want);
}

TEST(DirectoryTest, RefusesPushRingsThatCannotHoldASlot) {
  ExpectRefused(ParseChanged([](Directory& d) { d.header.ring_slots = 0; }), StatusCode::kDataLoss,
                "push rings of 0 slots of 4096 bytes");
  ExpectRefused(ParseChanged([](Directory& d) { d.header.slot_bytes = sizeof(SlotHeader) - 1; }),
                StatusCode::kDataLoss, "push rings of 4 slots of 63 bytes");
  // A slot too small for one row (with its id) of a table.
  ExpectRefused(ParseChanged([](Directory& d) { d.header.slot_bytes = 256; }),
                StatusCode::kDataLoss,
                "push slots of 256 bytes cannot hold one row of table "
                "'dense'");
}

TEST(DirectoryTest, RefusesRegionsShorterThanWhatTheWorkerUses) {
  ExpectRefused(ParseChanged([](Directory& d) { d.header.control.length -= 1; }),
                StatusCode::kDataLoss, "directory gives the control block");
  ExpectRefused(ParseChanged([](Directory& d) { d.header.atomics.length = 4; }),
                StatusCode::kDataLoss, "directory gives the barrier counter 4 bytes, it needs 8");
  ExpectRefused(ParseChanged([](Directory& d) { d.rings[2].length -= 1; }), StatusCode::kDataLoss,
                "directory gives the push ring of worker 2");
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].shard.length -= 1; }),
                StatusCode::kFailedPrecondition, "shard of table 'dense' is not the range");
}

TEST(DirectoryTest, RefusesAnUnknownRowLayout) {
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[1].layout = kLayoutAuto; }),
                StatusCode::kFailedPrecondition,
                "server 1 (h:1): table 'inline' has row layout 2, which this client does not "
                "know");
}

TEST(DirectoryTest, RefusesAShardItDoesNotCompute) {
  const std::string want =
      "server 1 (h:1): shard of table 'dense' is not the range partition and layout this "
      "client computes; run the same rdmaps build everywhere";
  // dim 0 would divide by zero in RowsPerBlock: refused before.
  ExpectRefused(ParseChanged([](Directory& d) {
                  d.tables[0].dim = 0;
                  d.tables[0].row_bytes = 0;
                }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].row_bytes += 4; }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].shard_begin -= 1; }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].shard_rows += 1; }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].headers_offset += 64; }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].rows_per_block = 2; }),
                StatusCode::kFailedPrecondition, want);
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].block_stride += 16; }),
                StatusCode::kFailedPrecondition, want);
  // The same table with the other layout is another geometry.
  ExpectRefused(ParseChanged([](Directory& d) { d.tables[0].layout = kLayoutInline; }),
                StatusCode::kFailedPrecondition, want);
}

// Regression: a table of 2^60 rows x 16 made GeometryOf wrap to a few
// bytes, so a short region passed the length check. (Layout version 5
// blocks such a table, and its geometry wraps to another value: the region
// is given exactly that wrapped length, so only the size bound refuses it.)
TEST(DirectoryTest, RefusesATableWhoseSizeWrapsSixtyFourBits) {
  const std::uint64_t rows = std::uint64_t{1} << 60;
  Directory dir = ServerDirectory(1, 0, 1, {Table(1, "huge", 1000, 16, RowLayout::kDense)});
  DirectoryTable& d = dir.tables[0];
  d.rows = rows;
  d.shard_rows = rows;
  const ShardGeometry g = ShardGeometryOf(kLayoutDense, rows, 16, 1, 0);
  d.headers_offset = g.headers_offset;
  d.rows_per_block = g.rows_per_block;
  d.block_stride = static_cast<std::uint32_t>(g.block_stride);
  d.shard.length = g.bytes;
  std::uint64_t true_bytes = 0;
  ASSERT_TRUE(__builtin_mul_overflow(rows, std::uint64_t{RowBytes(16)}, &true_bytes))
      << "the table this test needs no longer wraps 64 bits";
  ExpectRefused(Parse(Encode(dir), 1, 0, 1).status(), StatusCode::kDataLoss, "bytes");
}

TEST(DirectoryTest, RefusesADimBeyondTheLimit) {
  Status s = ParseChanged([](Directory& dir) {
    dir.tables[0].dim = kMaxDim + 1;
    dir.tables[0].row_bytes = static_cast<std::uint32_t>(RowBytes(kMaxDim + 1));
  });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
}

TEST(DirectoryTest, RefusesATableListedTwice) {
  ExpectRefused(ParseChanged([](Directory& d) { d.tables.push_back(d.tables[0]); }),
                StatusCode::kDataLoss, "server 1 (h:1): directory lists table 1 twice");
}

TEST(DirectoryTest, NamesEndAtTheirField) {
  Directory dir = ServerDirectory(2, 1, 3, Tables());
  std::memset(dir.tables[0].name, 'x', sizeof(dir.tables[0].name));
  Result<Directory> back = Parse(Encode(dir));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::string(back->tables[0].name), std::string(sizeof(dir.tables[0].name) - 1, 'x'));
}

TEST(DirectoryTest, LaterServersMustPublishTheSameTables) {
  auto merge = [](const std::vector<TableOptions>& second) {
    RemoteTables tables;
    Result<Directory> d0 = Parse(Encode(ServerDirectory(2, 0, 3, Tables())), 2, 0);
    EXPECT_TRUE(d0.ok()) << d0.status();
    EXPECT_TRUE(AddServerTables(*d0, 0, "server 0 (h:0)", &tables).ok());
    Result<Directory> d1 = Parse(Encode(ServerDirectory(2, 1, 3, second)), 2, 1);
    EXPECT_TRUE(d1.ok()) << d1.status();
    return AddServerTables(*d1, 1, "server 1 (h:1)", &tables);
  };
  EXPECT_TRUE(merge(Tables()).ok());
  const std::string differently =
      "server 1 (h:1) publishes table 2 ('inline') differently from server 0; give every "
      "server the same table list";
  for (auto change : {+[](TableOptions& t) { t.rows += 1; }, +[](TableOptions& t) { t.dim += 1; },
                      +[](TableOptions& t) { t.name = "other"; },
                      +[](TableOptions& t) { t.layout = RowLayout::kDense; }}) {
    std::vector<TableOptions> second = Tables();
    change(second[1]);
    const Status s = merge(second);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("server 1 (h:1) publishes table 2 ")) << s;
    EXPECT_THAT(s.message(), HasSubstr("differently from server 0")) << s;
  }
  std::vector<TableOptions> second = Tables();
  second[1].rows += 1;
  ExpectRefused(merge(second), StatusCode::kFailedPrecondition, differently);
  second = Tables();
  second[1].id = 9;
  ExpectRefused(merge(second), StatusCode::kFailedPrecondition, "publishes table 9 ('inline')");
  second = Tables();
  second.pop_back();
  ExpectRefused(merge(second), StatusCode::kFailedPrecondition,
                "server 1 (h:1) has 2 tables, server 0 has 3; give every server the same table "
                "list");
}

TEST(DirectoryTest, WantedTablesMustBeWhatTheServersPublish) {
  RemoteTables tables;
  for (std::uint32_t s = 0; s < 2; ++s) {
    Result<Directory> d = Parse(Encode(ServerDirectory(2, s, 3, Tables())), 2, s);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(AddServerTables(*d, s, "server", &tables).ok());
  }
  const std::string want =
      "table 7 ('auto') of ClientOptions.tables is not what the servers publish; give workers "
      "and servers the same table list";
  for (auto change :
       {+[](TableOptions& t) { t.rows += 1; }, +[](TableOptions& t) { t.dim += 1; },
        +[](TableOptions& t) { t.name = "other"; }, +[](TableOptions& t) { t.id = 8; },
        +[](TableOptions& t) { t.layout = RowLayout::kDense; }}) {
    std::vector<TableOptions> wanted = Tables();
    change(wanted[2]);
    const Status s = CheckWantedTables(tables, wanted, 2);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("of ClientOptions.tables is not what the servers publish"));
  }
  std::vector<TableOptions> wanted = Tables();
  wanted[2].dim += 1;
  ExpectRefused(CheckWantedTables(tables, wanted, 2), StatusCode::kFailedPrecondition, want);
  // kAuto resolves the way the servers resolved it.
  wanted = Tables();
  wanted[2].layout = RowLayout::kInline;
  EXPECT_TRUE(CheckWantedTables(tables, wanted, 2).ok());
}

}  // namespace
}  // namespace rdmaps::internal

// The range partition at its edges and the checked-block (torn-read) format.
#include "src/ps/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace rdmaps::internal {
namespace {

TEST(PartitionTest, EveryRowOnExactlyOneServerInOrder) {
  for (std::uint64_t rows : {1, 2, 3, 5, 7, 10, 16, 17, 100, 1001}) {
    for (std::uint32_t servers : {1u, 2u, 3u, 4u, 7u, 16u, 200u}) {
      std::uint64_t next = 0;
      for (std::uint32_t s = 0; s < servers; ++s) {
        const ShardRange r = PartitionOf(rows, servers, s);
        EXPECT_EQ(r.begin, next) << rows << " rows, " << servers << " servers, server " << s;
        // Sizes differ by at most one, larger shards first.
        EXPECT_TRUE(r.count == rows / servers || r.count == rows / servers + 1);
        EXPECT_EQ(r.count, rows / servers + (s < rows % servers ? 1 : 0));
        if (r.count > 0) {
          // First and last row of each shard map back to it.
          EXPECT_EQ(ServerOfRow(rows, servers, r.begin), s);
          EXPECT_EQ(ServerOfRow(rows, servers, r.end() - 1), s);
        }
        next = r.end();
      }
      EXPECT_EQ(next, rows) << rows << " rows, " << servers << " servers";
      if (rows <= 1001) {
        for (std::uint64_t row = 0; row < rows; ++row) {
          const std::uint32_t s = ServerOfRow(rows, servers, row);
          ASSERT_LT(s, servers);
          const ShardRange r = PartitionOf(rows, servers, s);
          ASSERT_GE(row, r.begin);
          ASSERT_LT(row, r.end());
        }
      }
    }
  }
}

TEST(PartitionTest, UnevenSplitGivesExtraRowsToFirstServers) {
  EXPECT_EQ(PartitionOf(10, 3, 0).begin, 0u);
  EXPECT_EQ(PartitionOf(10, 3, 0).count, 4u);
  EXPECT_EQ(PartitionOf(10, 3, 1).begin, 4u);
  EXPECT_EQ(PartitionOf(10, 3, 1).count, 3u);
  EXPECT_EQ(PartitionOf(10, 3, 2).begin, 7u);
  EXPECT_EQ(PartitionOf(10, 3, 2).count, 3u);
  EXPECT_EQ(ServerOfRow(10, 3, 3), 0u);
  EXPECT_EQ(ServerOfRow(10, 3, 4), 1u);
  EXPECT_EQ(ServerOfRow(10, 3, 6), 1u);
  EXPECT_EQ(ServerOfRow(10, 3, 7), 2u);
  EXPECT_EQ(ServerOfRow(10, 3, 9), 2u);
}

TEST(PartitionTest, MoreServersThanRowsLeavesEmptyShardsAtTheEnd) {
  for (std::uint32_t s = 0; s < 2; ++s) {
    EXPECT_EQ(PartitionOf(2, 5, s).begin, s);
    EXPECT_EQ(PartitionOf(2, 5, s).count, 1u);
  }
  for (std::uint32_t s = 2; s < 5; ++s) {
    EXPECT_EQ(PartitionOf(2, 5, s).count, 0u);
    EXPECT_EQ(PartitionOf(2, 5, s).begin, 2u);
  }
  EXPECT_EQ(ServerOfRow(2, 5, 0), 0u);
  EXPECT_EQ(ServerOfRow(2, 5, 1), 1u);
}

TEST(PartitionTest, HugeTablesDoNotOverflow) {
  const std::uint64_t rows = (1ull << 40) + 12345;
  const std::uint32_t servers = 97;
  const ShardRange last = PartitionOf(rows, servers, servers - 1);
  EXPECT_EQ(last.end(), rows);
  EXPECT_EQ(ServerOfRow(rows, servers, rows - 1), servers - 1);
  EXPECT_EQ(ServerOfRow(rows, servers, 0), 0u);
}

TEST(ShardLayoutTest, DenseRowsThenAlignedBlockHeaders) {
  for (std::uint32_t dim : {1u, 2u, 11u, 12u, 13u, 100u, 1000u}) {
    for (std::uint64_t rows : {0ull, 1ull, 7ull, 1000ull}) {
      for (std::uint32_t per_block : {1u, 3u, 64u}) {
        EXPECT_EQ(RowBytes(dim), 4 * std::size_t{dim});
        const ShardGeometry g = GeometryOf(kLayoutDense, rows, dim, per_block);
        EXPECT_EQ(g.headers_offset % 64, 0u);
        EXPECT_GE(g.headers_offset, rows * RowBytes(dim));
        EXPECT_LT(g.headers_offset, rows * RowBytes(dim) + 64);
        EXPECT_EQ(g.blocks(), (rows + per_block - 1) / per_block);
        EXPECT_EQ(g.bytes, g.headers_offset + g.blocks() * sizeof(BlockHeader));
      }
    }
  }
}

std::vector<std::byte> MakeBlock(std::uint64_t version, float value, std::size_t floats) {
  std::vector<std::byte> b(sizeof(BlockHeader) + floats * sizeof(float));
  for (std::size_t i = 0; i < floats; ++i) {
    std::memcpy(b.data() + sizeof(BlockHeader) + i * 4, &value, 4);
  }
  SealBlock(b.data(), version, floats * sizeof(float));
  return b;
}

TEST(CheckedBlockTest, SealedBlockVerifiesAndAnyChangeIsDetected) {
  const std::size_t floats = 37;
  auto b = MakeBlock(7, 1.5f, floats);
  EXPECT_TRUE(VerifyBlock(b.data(), floats * 4));
  for (std::size_t i = 0; i < b.size(); ++i) {
    auto c = b;
    c[i] ^= std::byte{0x10};
    EXPECT_FALSE(VerifyBlock(c.data(), floats * 4)) << "flipped byte " << i;
  }
}

TEST(CheckedBlockTest, EveryMixOfTwoVersionsAtCacheLineGranularityIsRejected) {
  // What a NIC can deliver: each 64-byte line from the old or the new row.
  const std::size_t floats = 60;  // 256 bytes = 4 lines
  auto old_b = MakeBlock(1, 1.0f, floats);
  auto new_b = MakeBlock(2, 2.0f, floats);
  const std::size_t lines = (old_b.size() + 63) / 64;
  for (unsigned mask = 0; mask < (1u << lines); ++mask) {
    std::vector<std::byte> mix(old_b.size());
    for (std::size_t l = 0; l < lines; ++l) {
      const auto& src = (mask >> l) & 1 ? new_b : old_b;
      const std::size_t n = std::min<std::size_t>(64, mix.size() - l * 64);
      std::memcpy(mix.data() + l * 64, src.data() + l * 64, n);
    }
    const bool whole = mask == 0 || mask == (1u << lines) - 1;
    EXPECT_EQ(VerifyBlock(mix.data(), floats * 4), whole) << "mask " << mask;
  }
}

TEST(ShardLayoutTest, AutoLayoutDependsOnTheLargestShard) {
  using internal::kLayoutAuto;
  using internal::kLayoutDense;
  using internal::kLayoutInline;
  using internal::ResolveRowLayout;
  EXPECT_EQ(ResolveRowLayout(kLayoutDense, 1, 1, 1), kLayoutDense);  // explicit stays
  EXPECT_EQ(ResolveRowLayout(kLayoutInline, 1 << 30, 1024, 1), kLayoutInline);
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 16384, 1, 1), kLayoutInline);  // 64 KiB
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 16385, 1, 1), kLayoutDense);
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 16385, 1, 2), kLayoutInline);         // 8193 per shard
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 2 * 16384 + 1, 1, 2), kLayoutDense);  // 16385 first
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 1, 16384, 1), kLayoutInline);
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 1, 16385, 8), kLayoutDense);  // one row > 64 KiB
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, std::uint64_t{1} << 62, 1u << 24, 3), kLayoutDense);
  // Embedding-shaped: >= 65536 rows of < 1 KiB.
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 65536, 255, 1), kLayoutInline);
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 65536, 256, 1), kLayoutDense);  // 1 KiB rows
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, 65535, 16, 1), kLayoutDense);   // 1 MiB, too few rows
  EXPECT_EQ(ResolveRowLayout(kLayoutAuto, std::uint64_t{1} << 40, 16, 64), kLayoutInline);
}

TEST(ShardLayoutTest, GeometryOfBothLayouts) {
  for (std::uint32_t dim : {1u, 3u, 4u, 16u, 100u}) {
    for (std::uint32_t per_block : {1u, 4u}) {
      const ShardGeometry d = GeometryOf(kLayoutDense, 10, dim, per_block);
      EXPECT_FALSE(d.inline_headers());
      EXPECT_EQ(d.row(3), 3 * RowBytes(dim));
      EXPECT_EQ(d.header(2), d.headers_offset + 2 * sizeof(BlockHeader));
      const ShardGeometry i = GeometryOf(kLayoutInline, 10, dim, per_block);
      EXPECT_TRUE(i.inline_headers());
      EXPECT_EQ(i.block_stride % 16, 0u);
      EXPECT_GE(i.block_stride, sizeof(BlockHeader) + per_block * RowBytes(dim));
      EXPECT_LT(i.block_stride, sizeof(BlockHeader) + per_block * RowBytes(dim) + 16);
      EXPECT_EQ(i.header(2), 2 * i.block_stride);
      EXPECT_EQ(i.row(3), (3 / per_block) * i.block_stride + sizeof(BlockHeader) +
                              (3 % per_block) * RowBytes(dim));
      EXPECT_EQ(i.bytes, i.blocks() * i.block_stride);
      for (const ShardGeometry& g : {d, i}) {
        // 10 rows: blocks of 4 are 4 + 4 + 2 rows.
        EXPECT_EQ(g.blocks(), per_block == 1 ? 10u : 3u);
        EXPECT_EQ(g.block_rows(g.blocks() - 1), per_block == 1 ? 1u : 2u);
        EXPECT_EQ(g.end_row(g.blocks() - 1), 10u);
        std::uint64_t covered = 0;
        for (std::uint64_t b = 0; b < g.blocks(); ++b) {
          EXPECT_EQ(g.first_row(b), covered);
          // A block's rows lie back to back, the header checks all of them.
          for (std::uint64_t r = g.first_row(b); r < g.end_row(b); ++r) {
            EXPECT_EQ(g.block_of(r), b);
            EXPECT_EQ(g.row(r), g.row(g.first_row(b)) + (r - g.first_row(b)) * RowBytes(dim));
          }
          covered = g.end_row(b);
        }
        EXPECT_EQ(covered, 10u);
        // Rows and headers of a shard never overlap and fit in the region.
        for (std::uint64_t r = 0; r < 10; ++r) {
          EXPECT_LE(g.row(r) + RowBytes(dim), g.bytes);
          if (g.inline_headers()) {
            EXPECT_GE(g.row(r), g.header(g.block_of(r)) + sizeof(BlockHeader));
          } else {
            EXPECT_LE(g.row(r) + RowBytes(dim), g.headers_offset);
          }
        }
        for (std::uint64_t b = 0; b < g.blocks(); ++b) {
          EXPECT_LE(g.header(b) + sizeof(BlockHeader), g.bytes);
        }
      }
    }
  }
}

TEST(ShardLayoutTest, SmallRowsAreCheckedInBlocksExceptInTablesPulledByScatteredIds) {
  // Rows of 1 KiB and more: one per block.
  EXPECT_EQ(RowsPerBlock(kLayoutDense, 100, 256, 1), 1u);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 100, 1024, 1), 1u);
  // Smaller rows: about kCheckBlockBytes of them.
  EXPECT_EQ(RowsPerBlock(kLayoutDense, 1000, 64, 1), kCheckBlockBytes / 256);
  EXPECT_EQ(RowsPerBlock(kLayoutDense, 1000, 255, 1), 2u);
  EXPECT_EQ(RowsPerBlock(kLayoutDense, 65535, 1, 1), kCheckBlockBytes / 4);
  // Dense tables are pulled as ranges: blocked whatever their row count
  // (layout version 3 checked those of >= 65536 rows row by row).
  EXPECT_EQ(RowsPerBlock(kLayoutDense, 65536, 1, 1), kCheckBlockBytes / 4);
  EXPECT_EQ(RowsPerBlock(kLayoutDense, 1 << 20, 16, 64), kCheckBlockBytes / 64);
  // Inline tables: blocked while every shard holds at most 64 KiB of rows,
  // one row per block beyond (pulled by scattered ids).
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 256, 64, 1), kCheckBlockBytes / 256);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 257, 64, 1), 1u);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 512, 64, 2), kCheckBlockBytes / 256);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 513, 64, 2), 1u);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 1 << 20, 16, 1), 1u);
  // ... except rows under 64 bytes, blocked to 256 bytes (a 1-float row
  // inline would move 32 bytes for 4 in a range pull).
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 1 << 20, 1, 1), kTinyBlockBytes / 4);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 65536, 15, 1), kTinyBlockBytes / 60);
  EXPECT_EQ(RowsPerBlock(kLayoutInline, 257, 8, 1), kCheckBlockBytes / 32);  // small: blocked
}

TEST(CheckedRowTest, RowAndSeparatelyReadHeaderAgreeOnlyForOneWholeVersion) {
  // A pull READs a row and its header separately: any line mix of two
  // versions, paired with either version's header, must be accepted only
  // when the row bytes are exactly that header's version.
  const std::size_t floats = 48;  // 192 bytes = 3 lines
  std::vector<float> v1(floats, 1.0f), v2(floats, 2.0f);
  BlockHeader h1{}, h2{};
  SealRow(&h1, 1, v1.data(), floats * 4);
  SealRow(&h2, 2, v2.data(), floats * 4);
  EXPECT_TRUE(VerifyRow(h1, v1.data(), floats * 4));
  EXPECT_TRUE(VerifyRow(h2, v2.data(), floats * 4));
  const std::size_t lines = floats * 4 / 64;
  for (unsigned mask = 0; mask < (1u << lines); ++mask) {
    std::vector<float> mix(floats);
    for (std::size_t l = 0; l < lines; ++l) {
      const auto& src = (mask >> l) & 1 ? v2 : v1;
      std::memcpy(mix.data() + l * 16, src.data() + l * 16, 64);
    }
    EXPECT_EQ(VerifyRow(h1, mix.data(), floats * 4), mask == 0) << "mask " << mask;
    EXPECT_EQ(VerifyRow(h2, mix.data(), floats * 4), mask == (1u << lines) - 1) << "mask " << mask;
  }
  // A torn header (version of one, checksum of the other) matches nothing.
  const BlockHeader torn{h2.version, h1.checksum};
  EXPECT_FALSE(VerifyRow(torn, v1.data(), floats * 4));
  EXPECT_FALSE(VerifyRow(torn, v2.data(), floats * 4));
}

TEST(CheckedRowTest, EveryXxh3BuildGivesTheSameChecksums) {
  // BlockChecksum may take either build for long inputs (whichever is faster
  // on the machine): a server and a client that chose differently must still
  // agree on every checksum, for every length and seed.
  std::mt19937_64 rng(7);
  std::vector<std::byte> data(9000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (std::size_t n = 0; n <= data.size(); n += (n < 600 ? 1 : 61)) {
    for (std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{1}, rng()}) {
      for (std::size_t off : {0, 3}) {
        if (off + n > data.size()) continue;
        const std::uint64_t lib = Xxh3LibraryWithSeed(data.data() + off, n, seed);
        ASSERT_EQ(Xxh3ScalarWithSeed(data.data() + off, n, seed), lib)
            << n << " bytes at offset " << off << ", seed " << seed;
        if (Xxh3Avx2Available()) {
          ASSERT_EQ(Xxh3Avx2WithSeed(data.data() + off, n, seed), lib)
              << "avx2: " << n << " bytes at offset " << off << ", seed " << seed;
        }
      }
    }
    ASSERT_EQ(BlockChecksum(n, data.data(), n),
              Xxh3LibraryWithSeed(data.data(), n, n ^ kChecksumSalt))
        << n << " bytes";
  }
  const std::string build = BlockHashBuild();
  EXPECT_TRUE(build == "scalar" || build == "libxxhash" || (build == "avx2" && Xxh3Avx2Available()))
      << build;
}

TEST(CheckedRowTest, LongRowMixedFromTwoVersionsIsRejected) {
  // A 4 KiB row (XXH3's long-input path, the build chosen at run time):
  // any one line of the other version, and random line mixes, fail both
  // versions' headers.
  const std::size_t floats = 1024, lines = floats * 4 / 64;
  std::vector<float> v1(floats), v2(floats);
  for (std::size_t i = 0; i < floats; ++i) {
    v1[i] = static_cast<float>(i);
    v2[i] = static_cast<float>(i) + 0.5f;
  }
  BlockHeader h1{}, h2{};
  SealRow(&h1, 1, v1.data(), floats * 4);
  SealRow(&h2, 2, v2.data(), floats * 4);
  ASSERT_TRUE(VerifyRow(h1, v1.data(), floats * 4));
  ASSERT_TRUE(VerifyRow(h2, v2.data(), floats * 4));
  std::mt19937_64 rng(3);
  for (std::size_t trial = 0; trial < lines + 200; ++trial) {
    std::vector<float> mix = v1;
    std::size_t from_v2 = 0;
    for (std::size_t l = 0; l < lines; ++l) {
      const bool take = trial < lines ? l == trial : (rng() & 1) != 0;
      if (!take) continue;
      std::memcpy(mix.data() + l * 16, v2.data() + l * 16, 64);
      ++from_v2;
    }
    if (from_v2 == 0 || from_v2 == lines) continue;
    EXPECT_FALSE(VerifyRow(h1, mix.data(), floats * 4)) << "trial " << trial;
    EXPECT_FALSE(VerifyRow(h2, mix.data(), floats * 4)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace rdmaps::internal

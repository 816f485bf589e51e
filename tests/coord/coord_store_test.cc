// The embedded coordinators' state file: a round trip keeps everything, and
// every damaged form (each truncation, each flipped byte) is an error, never
// a crash or a silently different store.
#include "src/cluster/coord_store.h"

#include <gtest/gtest.h>

namespace rdmaps::internal {
namespace {

using std::chrono::milliseconds;

CoordStore Sample() {
  CoordStore s;
  auto lease = s.Grant(milliseconds(100), 1000);
  EXPECT_TRUE(lease.ok());
  EXPECT_TRUE(s.CompareAndSwap("a", 0, "x", kNoLease)->swapped);
  EXPECT_TRUE(s.CompareAndSwap("m/1", 0, std::string("\0\xff", 2), lease->id)->swapped);
  EXPECT_TRUE(s.CompareAndSwap("gone", 0, "y", kNoLease)->swapped);
  s.Delete("gone");
  return s;
}

TEST(CoordStoreTest, RoundTripKeepsKeysLeasesAndTombstones) {
  CoordStore s = Sample();
  const std::string bytes = s.EncodeWithBoot("boot-1");
  auto back = ParseCoordStore(bytes, "boot-1", 2000);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->revision(), s.revision());
  EXPECT_EQ(back->Get("m/1").kv->value, std::string("\0\xff", 2));
  EXPECT_EQ(back->LastChange("gone", false), s.LastChange("gone", false));
  EXPECT_EQ(back->EncodeWithBoot("boot-1"), bytes);
  // The lease still runs on the same boot (expires at 1000 + 100 ms).
  EXPECT_FALSE(back->Expire(2000));
  EXPECT_TRUE(back->Get("m/1").kv.has_value());
}

TEST(CoordStoreTest, AnotherBootsLeasesAreExpired) {
  auto back = ParseCoordStore(Sample().EncodeWithBoot("boot-1"), "boot-2", 5);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->Expire(5));
  EXPECT_FALSE(back->Get("m/1").kv.has_value());
  EXPECT_TRUE(back->Get("a").kv.has_value());
}

TEST(CoordStoreTest, EveryTruncationAndByteFlipIsRefusedOrHarmless) {
  const std::string bytes = Sample().EncodeWithBoot("boot-1");
  for (std::size_t n = 1; n < bytes.size(); ++n) {
    auto r = ParseCoordStore(bytes.substr(0, n), "boot-1", 0);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "truncated to " << n;
  }
  EXPECT_FALSE(ParseCoordStore(bytes + "x", "boot-1", 0).ok());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] = static_cast<char>(b[i] ^ 0x41);
    auto r = ParseCoordStore(b, "boot-1", 0);
    if (r.ok()) {
      // A flip inside a value, a time or the boot id may still be a valid
      // store; it must then re-encode to exactly what was parsed.
      EXPECT_EQ(r->EncodeWithBoot("boot-1").size(), b.size()) << "byte " << i;
    }
  }
  EXPECT_TRUE(ParseCoordStore("", "boot-1", 0).ok());  // a new store
}

TEST(CoordStoreTest, TombstonesAreBoundedAndWakeWatchersEarlyWhenDropped) {
  CoordStore s;
  for (std::size_t i = 0; i < kMaxCoordTombstones + 10; ++i) {
    const std::string key = "k" + std::to_string(i);
    ASSERT_TRUE(s.CompareAndSwap(key, 0, "", kNoLease)->swapped);
    s.Delete(key);
  }
  // k0's tombstone was dropped: a watcher of k0 from revision 1 must still
  // be told something may have changed.
  EXPECT_GT(s.LastChange("k0", false), 1);
  EXPECT_LE(s.EncodeWithBoot("b").size(), std::size_t{1} << 20);
}

}  // namespace
}  // namespace rdmaps::internal

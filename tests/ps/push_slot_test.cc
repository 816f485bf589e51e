// The server's check of a push slot (src/ps/push_slot.h): every number of a
// slot is the worker's, so a range that wraps, a row id outside the shard or
// a row count beyond the slot is refused before anything is applied.
#include "src/ps/push_slot.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

namespace rdmaps::internal {
namespace {

constexpr std::uint32_t kSlotBytes = 4096;
constexpr std::uint32_t kDim = 4;

struct Slot {
  SlotHeader header{};
  std::vector<std::byte> payload = std::vector<std::byte>(kSlotBytes - sizeof(SlotHeader));
};

Slot RangeSlot(std::uint64_t first_row, std::uint32_t num_rows) {
  Slot s;
  s.header.seq = 1;
  s.header.kind = static_cast<std::uint32_t>(SlotKind::kRange);
  s.header.first_row = first_row;
  s.header.num_rows = num_rows;
  return s;
}

Slot RowsSlot(const std::vector<std::uint64_t>& ids) {
  Slot s;
  s.header.seq = 1;
  s.header.kind = static_cast<std::uint32_t>(SlotKind::kRows);
  s.header.num_rows = static_cast<std::uint32_t>(ids.size());
  std::memcpy(s.payload.data(), ids.data(), ids.size() * sizeof(std::uint64_t));
  return s;
}

const char* Check(const Slot& s, ShardRange shard = {100, 50}) {
  return CheckDataSlot(s.header, s.payload, {shard, kDim, kSlotBytes});
}

TEST(PushSlotTest, AcceptsRangesAndRowsInsideTheShard) {
  EXPECT_EQ(Check(RangeSlot(100, 50)), nullptr);
  EXPECT_EQ(Check(RangeSlot(149, 1)), nullptr);
  EXPECT_EQ(Check(RowsSlot({100, 149, 120, 120})), nullptr);
}

// Regression: first_row + num_rows wrapped past 2^64 and passed the end
// check (a crash on inline tables, shard memory overwritten on dense ones).
TEST(PushSlotTest, RefusesARangeWhoseEndWrapsPastTwoToTheSixtyFour) {
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  EXPECT_NE(Check(RangeSlot(max, 2)), nullptr);
  EXPECT_NE(Check(RangeSlot(max - 5, 10), {100, max - 100}), nullptr);
}

TEST(PushSlotTest, RefusesRangesAndRowsOutsideTheShard) {
  EXPECT_NE(Check(RangeSlot(99, 1)), nullptr);
  EXPECT_NE(Check(RangeSlot(149, 2)), nullptr);
  EXPECT_NE(Check(RangeSlot(150, 1)), nullptr);
  EXPECT_NE(Check(RowsSlot({100, 150})), nullptr);
  EXPECT_NE(Check(RowsSlot({99})), nullptr);
}

TEST(PushSlotTest, RefusesRowCountsTheSlotCannotHold) {
  EXPECT_NE(Check(RangeSlot(100, 0)), nullptr);
  const std::uint64_t cap = SlotRowCapacity(kSlotBytes, kDim, false);
  EXPECT_EQ(Check(RangeSlot(100, static_cast<std::uint32_t>(cap)), {100, 1000}), nullptr);
  EXPECT_NE(Check(RangeSlot(100, static_cast<std::uint32_t>(cap + 1)), {100, 1000}), nullptr);
  Slot s = RangeSlot(100, 1);
  s.header.num_rows = std::numeric_limits<std::uint32_t>::max();
  EXPECT_NE(Check(s), nullptr);
}

TEST(PushSlotTest, RefusesOtherKindsAndAShortPayload) {
  Slot s = RangeSlot(100, 1);
  s.header.kind = 99;
  EXPECT_NE(Check(s), nullptr);
  s = RangeSlot(100, 1);
  s.payload.resize(8);
  EXPECT_NE(Check(s), nullptr);
}

}  // namespace
}  // namespace rdmaps::internal

#include "src/ps/push_slot.h"

#include <cstring>

#include "src/base/checked.h"

namespace rdmaps::internal {

const char* CheckDataSlot(const SlotHeader& h, std::span<const std::byte> payload,
                          const SlotTable& table) {
  const auto kind = static_cast<SlotKind>(h.kind);
  if (kind != SlotKind::kRange && kind != SlotKind::kRows) return "not a data slot";
  if (table.dim == 0 || table.slot_bytes < sizeof(SlotHeader) ||
      payload.size() < table.slot_bytes - sizeof(SlotHeader)) {
    return "slot smaller than its header";
  }
  const bool with_ids = kind == SlotKind::kRows;
  const std::uint64_t cap = SlotRowCapacity(table.slot_bytes, table.dim, with_ids);
  if (h.num_rows == 0 || h.num_rows > cap) return "row count is 0 or more than a slot holds";
  const std::optional<std::uint64_t> shard_end = CheckedAdd(table.shard.begin, table.shard.count);
  if (!shard_end) return "shard range wraps";
  if (kind == SlotKind::kRange) {
    const std::optional<std::uint64_t> end = CheckedAdd<std::uint64_t>(h.first_row, h.num_rows);
    if (h.first_row < table.shard.begin || !end || *end > *shard_end) {
      return "row range outside this server's shard";
    }
    return nullptr;
  }
  // Row ids may lie unaligned in the slot: copy each.
  for (std::uint32_t i = 0; i < h.num_rows; ++i) {
    std::uint64_t id;
    std::memcpy(&id, payload.data() + std::size_t{i} * sizeof(id), sizeof(id));
    if (id < table.shard.begin || id >= *shard_end) return "row id outside this server's shard";
  }
  return nullptr;
}

}  // namespace rdmaps::internal

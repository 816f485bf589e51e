// Fuzz target: the server's check of a push slot (src/ps/push_slot.h).
// Input: u64 shard begin, u32 shard rows (small), u8 dim, u8 slot lines,
// then the slot (SlotHeader + payload). Oracle: whatever the check accepts
// is applied to a shard of exactly the checked size (ASan catches a row
// outside it), as the server's ApplySlot does.
#include <cstdint>
#include <vector>

#include "src/ps/push_slot.h"
#include "tests/fuzz/fuzz_util.h"

using rdmaps::internal::CheckDataSlot;
using rdmaps::internal::SlotHeader;
using rdmaps::internal::SlotKind;
using rdmaps::internal::SlotTable;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rdmaps::fuzz::Bytes in(data, size);
  SlotTable t;
  t.shard.begin = in.Take<std::uint64_t>();
  t.shard.count = in.Take<std::uint16_t>() % 4096;
  t.dim = 1 + in.Take<std::uint8_t>() % 64;
  t.slot_bytes = 64 * (1 + in.Take<std::uint8_t>() % 64);
  const SlotHeader h = in.Take<SlotHeader>();
  std::vector<std::byte> payload(t.slot_bytes - sizeof(SlotHeader));
  const std::string_view rest = in.Rest();
  if (!rest.empty() && !payload.empty()) {
    std::memcpy(payload.data(), rest.data(), std::min(rest.size(), payload.size()));
  }
  if (CheckDataSlot(h, payload, t) != nullptr) return 0;
  // Accepted: apply it to a shard of exactly shard.count rows.
  std::vector<float> shard(t.shard.count * t.dim);
  const bool rows = h.kind == static_cast<std::uint32_t>(SlotKind::kRows);
  const std::size_t ids_bytes = rows ? std::size_t{h.num_rows} * 8 : 0;
  RDMAPS_FUZZ_ASSERT(ids_bytes + std::size_t{h.num_rows} * t.dim * 4 <= payload.size());
  const auto* grad = reinterpret_cast<const float*>(payload.data() + ids_bytes);
  for (std::uint32_t i = 0; i < h.num_rows; ++i) {
    std::uint64_t row = h.first_row + i;
    if (rows) std::memcpy(&row, payload.data() + std::size_t{i} * 8, 8);
    RDMAPS_FUZZ_ASSERT(row >= t.shard.begin && row - t.shard.begin < t.shard.count);
    float* r = shard.data() + (row - t.shard.begin) * t.dim;
    for (std::uint32_t d = 0; d < t.dim; ++d) r[d] -= 0.0f * grad[std::size_t{i} * t.dim + d];
  }
  return 0;
}

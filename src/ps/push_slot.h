// The server's check of one push slot before it applies it: the slot header
// and payload arrived by a WRITE from a worker and are hostile until this
// says yes (src/ps/wire.h, "Push"). Pure, so that tests and the fuzzer
// (tests/fuzz/push_slot_fuzz.cc) drive it with arbitrary bytes.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "src/ps/wire.h"

namespace rdmaps::internal {

// What a data slot (kRange or kRows) of a table is checked against.
struct SlotTable {
  ShardRange shard;              // the rows this server holds
  std::uint32_t dim = 1;         // floats per row
  std::uint32_t slot_bytes = 0;  // ServerOptions::push_slot_bytes (header included)
};

// nullptr when `h` (kind kRange or kRows) with `payload` (the slot's bytes
// after its header: slot_bytes - sizeof(SlotHeader) of them) may be applied
// to `table`: 1 <= num_rows <= what the slot holds, a range inside the shard
// (first_row + num_rows computed without wrapping), every row id of a kRows
// slot inside the shard. Else a short reason for the log.
const char* CheckDataSlot(const SlotHeader& h, std::span<const std::byte> payload,
                          const SlotTable& table);

}  // namespace rdmaps::internal

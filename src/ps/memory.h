// Page-aligned, zeroed memory for regions that get registered with the
// transport; large allocations are 2 MiB aligned and advised to use huge
// pages (fewer NIC translation misses).
#pragma once

#include <cstddef>
#include <memory>

namespace rdmaps::internal {

struct FreeDeleter {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

// Zeroed, at least 4 KiB aligned; nullptr when out of memory.
AlignedBuffer AllocateRegionMemory(std::size_t bytes);

}  // namespace rdmaps::internal

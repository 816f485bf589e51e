#include "src/ps/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace rdmaps::internal {

void FreeDeleter::operator()(void* p) const { std::free(p); }

AlignedBuffer AllocateRegionMemory(std::size_t bytes) {
  constexpr std::size_t kHuge = 2 << 20;
  const std::size_t align = bytes >= kHuge ? kHuge : 4096;
  std::size_t size = (bytes + align - 1) / align * align;
  if (size == 0) size = align;
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr) return nullptr;
  if (align == kHuge) (void)madvise(p, size, MADV_HUGEPAGE);  // best effort
  std::memset(p, 0, size);
  return AlignedBuffer(static_cast<std::byte*>(p));
}

}  // namespace rdmaps::internal

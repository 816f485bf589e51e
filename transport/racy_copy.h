// Copies between registered memory and a buffer while another thread may be
// storing to the same bytes -- what a NIC's DMA does on every one-sided op.
// The tcp and fake backends copy through these functions only, so that
// ThreadSanitizer can be told (tests/tsan.supp) that this one race is by
// design; any other race in rdmaps is still reported. Readers that need a
// consistent snapshot detect tears themselves (see src/ps/).
#pragma once

#include <cstddef>

namespace rdmaps::transport {

// memcpy(dst, src, n), where src may be concurrently written.
void RacyCopyFrom(void* dst, const void* src, std::size_t n);
// memcpy(dst, src, n), where dst may be concurrently read or written.
void RacyCopyTo(void* dst, const void* src, std::size_t n);

}  // namespace rdmaps::transport

// Copies between registered memory and a buffer while another thread may be
// storing to the same bytes -- what a NIC's DMA does on every one-sided op.
// The tcp and fake backends touch registered memory through these functions
// only. Under ThreadSanitizer the copies are made uninstrumented (a NIC's DMA
// is invisible to TSan too), because a suppression alone is not enough: when
// TSan cannot restore the stack of the earlier access it cannot match a
// suppression and reports the by-design race. Every other race in rdmaps is
// still reported. Readers that need a consistent snapshot detect tears
// themselves (see src/ps/wire.h).
#pragma once

#include <cstddef>

#if defined(__SANITIZE_THREAD__)
#define RDMAPS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMAPS_TSAN 1
#endif
#endif

namespace rdmaps::transport {

// memcpy(dst, src, n), where src may be concurrently written.
void RacyCopyFrom(void* dst, const void* src, std::size_t n);
// memcpy(dst, src, n), where dst may be concurrently read or written.
void RacyCopyTo(void* dst, const void* src, std::size_t n);

}  // namespace rdmaps::transport

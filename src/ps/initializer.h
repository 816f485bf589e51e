// Fills table rows from an Initializer. Row r of table t depends only on
// (initializer, t, r), never on the number of servers: a splitmix64 stream
// seeded from (seed, t, r), Box-Muller for normals. Thread-compatible.
#pragma once

#include <cstdint>

#include "rdmaps/table.h"

namespace rdmaps::internal {

void InitRow(const Initializer& init, std::uint32_t table, std::uint64_t row, float* out,
             std::uint32_t dim);

}  // namespace rdmaps::internal

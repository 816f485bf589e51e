// JSON from config files and the environment (tables files, TF_CONFIG,
// ClusterSpec files), parsed without exceptions and with bounded
// resources: at most kMaxJsonBytes of text nested at most kMaxJsonDepth
// deep (nlohmann's dump() and comparisons recurse once per level, so an
// unbounded nesting would overflow the stack).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

#include "rdmaps/status.h"

namespace rdmaps::internal {

inline constexpr int kMaxJsonDepth = 32;
inline constexpr std::size_t kMaxJsonBytes = std::size_t{16} << 20;

// The JSON value in `text`; InvalidArgument naming `what` and the cause:
// "`what` `invalid`: 'text'" for text that is not JSON, or nested deeper
// than kMaxJsonDepth, or longer than kMaxJsonBytes.
Result<nlohmann::json> ParseJsonLimited(std::string_view text, std::string_view what,
                                        std::string_view invalid = "is not valid JSON");

}  // namespace rdmaps::internal

// Overflow-safe arithmetic and range-checked narrowing for every size,
// offset and count computed from bytes that arrived from the network, a
// config file, the environment or a flag (all hostile until checked).
//
//   std::optional<std::uint64_t> end = CheckedAdd(first_row, num_rows);
//   if (!end || *end > shard_end) return false;
//
//   RDMAPS_ASSIGN_OR_RETURN(std::uint32_t dim,
//                           CheckedNarrow<std::uint32_t>(value, "table #0 \"dim\""));
//
// Built on the compiler's __builtin_*_overflow, so one instruction and a
// branch; no exceptions. Refusals are InvalidArgument naming the field, the
// value and the limit (CheckedNarrow, CheckedFinite, CheckedAtMost).
//
// Thread safety: pure functions.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "rdmaps/status.h"

namespace rdmaps::internal {

// a + b, a * b and a - b, or std::nullopt when the exact result does not fit T.
template <std::integral T>
[[nodiscard]] constexpr std::optional<T> CheckedAdd(T a, T b) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
template <std::integral T>
[[nodiscard]] constexpr std::optional<T> CheckedMul(T a, T b) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
template <std::integral T>
[[nodiscard]] constexpr std::optional<T> CheckedSub(T a, T b) {
  T r;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Chains of the above: CheckedAdd(CheckedMul(a, b), c) stays nullopt once
// any step overflowed.
template <std::integral T>
[[nodiscard]] constexpr std::optional<T> CheckedAdd(std::optional<T> a, T b) {
  return a ? CheckedAdd(*a, b) : std::nullopt;
}
template <std::integral T>
[[nodiscard]] constexpr std::optional<T> CheckedMul(std::optional<T> a, T b) {
  return a ? CheckedMul(*a, b) : std::nullopt;
}

// True when [offset, offset + length) lies inside [0, size) (no wrap).
[[nodiscard]] constexpr bool RangeWithin(std::uint64_t offset, std::uint64_t length,
                                         std::uint64_t size) {
  return length <= size && offset <= size - length;
}

// `value` as a To when it is representable; else InvalidArgument
// "`what` = value is out of range (min..max)".
template <std::integral To, std::integral From>
[[nodiscard]] Result<To> CheckedNarrow(From value, std::string_view what) {
  if (std::in_range<To>(value)) return static_cast<To>(value);
  return InvalidArgumentError(std::string(what) + " = " + std::to_string(value) +
                              " is out of range (" +
                              std::to_string(std::numeric_limits<To>::min()) + ".." +
                              std::to_string(std::numeric_limits<To>::max()) + ")");
}

// InvalidArgument unless value <= limit: "`what` = value exceeds the limit of limit".
template <std::integral T>
[[nodiscard]] Status CheckedAtMost(T value, T limit, std::string_view what) {
  if (value <= limit) return Status::OK();
  return InvalidArgumentError(std::string(what) + " = " + std::to_string(value) +
                              " exceeds the limit of " + std::to_string(limit));
}

// `value` as a float when it is finite and stays finite as a float (1e39
// would become inf); else InvalidArgument naming `what`.
[[nodiscard]] inline Result<float> CheckedFiniteFloat(double value, std::string_view what) {
  const auto max = static_cast<double>(std::numeric_limits<float>::max());
  if (std::isfinite(value) && value <= max && value >= -max) return static_cast<float>(value);
  return InvalidArgumentError(std::string(what) + " = " + std::to_string(value) +
                              " is not a finite 32-bit float (|x| <= 3.4e38)");
}

}  // namespace rdmaps::internal

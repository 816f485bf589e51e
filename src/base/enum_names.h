// Names of enum values, from one table per enum: the printing function
// (FooName), the parser (ParseFoo) and the "a, b or c" list an error message
// offers are all read from it, so a new value is added in one place.
//
//   inline constexpr EnumName<RowLayout> kRowLayoutNames[] = {
//       {RowLayout::kDense, "dense"}, {RowLayout::kInline, "inline"}, ...};
//   NameOf(kRowLayoutNames, RowLayout::kDense)  -> "dense"
//   ValueOf(kRowLayoutNames, "inline")          -> RowLayout::kInline
//   NameList(kRowLayoutNames)                   -> "dense, inline or auto"
//
// The tables are a handful of entries: lookups are linear scans. Pure
// functions on constant data; call them from any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace rdmaps::internal {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value`, or "unknown" for a value the table does not list (a
// cast from an out-of-range integer).
template <typename E, std::size_t N>
const char* NameOf(const EnumName<E> (&names)[N], E value) {
  for (const EnumName<E>& n : names) {
    if (n.value == value) return n.name;
  }
  return "unknown";
}

// The value named `name` exactly (case-sensitive), or nullopt.
template <typename E, std::size_t N>
std::optional<E> ValueOf(const EnumName<E> (&names)[N], std::string_view name) {
  for (const EnumName<E>& n : names) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

// Every name, in table order, as "a, b or c"; each wrapped in `quote`.
template <typename E, std::size_t N>
std::string NameList(const EnumName<E> (&names)[N], std::string_view quote = "") {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? " or " : ", ";
    out.append(quote).append(names[i].name).append(quote);
  }
  return out;
}

}  // namespace rdmaps::internal

// The enum names of rdmaps/table.h (from src/ps/table_names.h) and
// InitializeRows, the servers' initializer for rows a caller holds.
#include "rdmaps/table.h"

#include <string>

#include "src/ps/initializer.h"
#include "src/ps/table_names.h"

namespace rdmaps {
namespace {

template <typename E, std::size_t N>
Result<E> Parse(const internal::EnumName<E> (&names)[N], const char* what, std::string_view name) {
  if (std::optional<E> value = internal::ValueOf(names, name)) return *value;
  return InvalidArgumentError(std::string(what) + " '" + std::string(name) + "' is not " +
                              internal::NameList(names));
}

}  // namespace

const char* InitializerKindName(Initializer::Kind kind) {
  return internal::NameOf(internal::kInitializerKindNames, kind);
}

Result<Initializer::Kind> ParseInitializerKind(std::string_view name) {
  return Parse(internal::kInitializerKindNames, "initializer kind", name);
}

const char* OptimizerKindName(OptimizerOptions::Kind kind) {
  return internal::NameOf(internal::kOptimizerKindNames, kind);
}

Result<OptimizerOptions::Kind> ParseOptimizerKind(std::string_view name) {
  return Parse(internal::kOptimizerKindNames, "optimizer kind", name);
}

const char* RowLayoutName(RowLayout layout) {
  return internal::NameOf(internal::kRowLayoutNames, layout);
}

Result<RowLayout> ParseRowLayout(std::string_view name) {
  return Parse(internal::kRowLayoutNames, "row layout", name);
}

Status InitializeRows(const TableOptions& table, std::uint64_t first_row, std::span<float> out) {
  const std::string who = "InitializeRows(table " + std::to_string(table.id) + " ('" + table.name +
                          "'), first row " + std::to_string(first_row) + ")";
  if (table.dim == 0) return InvalidArgumentError(who + ": the table's dim must be >= 1");
  if (out.size() % table.dim != 0) {
    return InvalidArgumentError(who + ": " + std::to_string(out.size()) +
                                " floats are not whole rows of " + std::to_string(table.dim));
  }
  const std::uint64_t rows = out.size() / table.dim;
  if (first_row > table.rows || rows > table.rows - first_row) {
    return InvalidArgumentError(who + ": " + std::to_string(rows) + " rows run past the table's " +
                                std::to_string(table.rows));
  }
  for (std::uint64_t r = 0; r < rows; ++r) {
    internal::InitRow(table.init, table.id, first_row + r, out.data() + r * table.dim, table.dim);
  }
  return Status::OK();
}

}  // namespace rdmaps

// TableOptimizer: the servers' internal::Optimizer over rows the caller
// holds, with per-row state in a vector laid out as a server's shard state.
#include "rdmaps/table_optimizer.h"

#include <string>

#include "src/ps/common.h"
#include "src/ps/optimizer.h"

namespace rdmaps {

Result<std::unique_ptr<TableOptimizer>> TableOptimizer::Create(const TableOptions& table) {
  RDMAPS_RETURN_IF_ERROR(internal::ValidateTables({table}));
  return std::unique_ptr<TableOptimizer>(new TableOptimizer(
      table, std::make_unique<const internal::Optimizer>(table.optimizer, table.dim)));
}

TableOptimizer::TableOptimizer(const TableOptions& table,
                               std::unique_ptr<const internal::Optimizer> optimizer)
    : table_(table),
      optimizer_(std::move(optimizer)),
      state_floats_(optimizer_->state_floats()),
      state_(table.rows * state_floats_) {
  for (std::uint64_t r = 0; r < table_.rows && state_floats_ > 0; ++r) {
    optimizer_->InitState(state_.data() + r * state_floats_);
  }
}

TableOptimizer::~TableOptimizer() = default;

Status TableOptimizer::Apply(RowRange range, std::span<const float> grads,
                             std::span<float> params) {
  if (range.begin > table_.rows || range.count > table_.rows - range.begin) {
    return InvalidArgumentError("TableOptimizer::Apply: rows [" + std::to_string(range.begin) +
                                ", " + std::to_string(range.begin + range.count) +
                                ") run past table '" + table_.name + "' of " +
                                std::to_string(table_.rows) + " rows");
  }
  const std::uint64_t floats = range.count * table_.dim;
  if (grads.size() != floats || params.size() != floats) {
    return InvalidArgumentError(
        "TableOptimizer::Apply on table '" + table_.name + "': " + std::to_string(range.count) +
        " rows of " + std::to_string(table_.dim) + " floats need " + std::to_string(floats) +
        " gradients and parameters, got " + std::to_string(grads.size()) + " and " +
        std::to_string(params.size()));
  }
  const std::uint32_t dim = table_.dim;
  for (std::uint64_t i = 0; i < range.count; ++i) {
    float* state = state_floats_ ? state_.data() + (range.begin + i) * state_floats_ : nullptr;
    optimizer_->Apply(params.data() + i * dim, state, grads.data() + i * dim);
  }
  return Status::OK();
}

}  // namespace rdmaps

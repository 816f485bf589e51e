// A table's optimizer applied to rows the caller holds, by the code the
// servers run on every push (src/ps/optimizer.cc), with the optimizer state
// (momentum, Adagrad accumulators, Adam's moments and step counts) kept here
// per row and starting where the servers' does. For a program that trains
// without servers but must update exactly as they do: rdmaps-train --local,
// a test comparing a parameter-server run against a local one.
//
//   TableOptions table = ...;  // as given to the servers
//   RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<TableOptimizer> opt, TableOptimizer::Create(table));
//   std::vector<float> w(table.rows * table.dim);
//   RDMAPS_RETURN_IF_ERROR(InitializeRows(table, 0, w));  // the servers' start
//   ...
//   RDMAPS_RETURN_IF_ERROR(opt->Apply(RowRange{0, table.rows}, grads, w));  // one step
//
// The same rows, gradients and order of pushes give the same bits as on a
// server.
//
// Thread safety: Apply() updates the optimizer state; one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"

namespace rdmaps {

namespace internal {
class Optimizer;
}  // namespace internal

class TableOptimizer {
 public:
  // An optimizer for every row of `table` (table.optimizer, table.rows,
  // table.dim), its state as the servers start it. The state takes 0 (SGD),
  // dim (momentum, Adagrad) or 2 * dim + 1 (Adam) floats per row.
  // InvalidArgument for a table the servers would refuse (the same checks).
  static Result<std::unique_ptr<TableOptimizer>> Create(const TableOptions& table);
  ~TableOptimizer();
  TableOptimizer(const TableOptimizer&) = delete;
  TableOptimizer& operator=(const TableOptimizer&) = delete;

  // One optimizer step on the rows of `range`, as a server applies a Push of
  // that range: `params` holds their values and `grads` their gradients,
  // range.count rows of dim floats each (row-major). InvalidArgument, and
  // nothing changes, when the sizes do not match or the range runs past the
  // table.
  Status Apply(RowRange range, std::span<const float> grads, std::span<float> params);

  const TableOptions& table() const { return table_; }

 private:
  TableOptimizer(const TableOptions& table, std::unique_ptr<const internal::Optimizer> optimizer);

  const TableOptions table_;
  const std::unique_ptr<const internal::Optimizer> optimizer_;
  const std::size_t state_floats_;  // Per row.
  std::vector<float> state_;        // table_.rows * state_floats_.
};

}  // namespace rdmaps

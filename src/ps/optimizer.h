// Server-side optimizers: apply one pushed gradient row to one parameter row,
// with the row's optimizer state beside it (server-private memory).
//
// Formulas: see OptimizerOptions in include/rdmaps/table.h. Vectorised with
// Eigen maps over the row; the caller spreads rows over cores.
//
// Thread safety: an Optimizer is immutable after construction; Apply() on
// different rows may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rdmaps/table.h"

namespace rdmaps::internal {

class Optimizer {
 public:
  Optimizer(const OptimizerOptions& options, std::uint32_t dim);

  // Floats of state per row (0 for SGD; Adam keeps m, v and a step counter).
  std::size_t state_floats() const { return state_floats_; }
  // Fills one row's state with its initial value.
  void InitState(float* state) const;
  // w -= update(g, state) for one row of dim floats.
  void Apply(float* w, float* state, const float* g) const;

  const OptimizerOptions& options() const { return options_; }

 private:
  const OptimizerOptions options_;
  const std::uint32_t dim_;
  const std::size_t state_floats_;
};

}  // namespace rdmaps::internal

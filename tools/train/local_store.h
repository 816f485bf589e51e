// Training without parameter servers: a ParameterStore that keeps the
// model's tables in this process, starts them where the servers would
// (rdmaps::InitializeRows) and applies every Push with each table's
// optimizer as the servers do (rdmaps::TableOptimizer, the servers' code).
// A one-worker run through one server and a LocalStore run of the same
// tables and seed therefore hold the same parameters after every step
// (tests/train/local_vs_ps_test.cc).
//
// Thread safety: a LocalStore is used by one thread (the training loop).
#pragma once

#include <memory>
#include <vector>

#include "rdmaps/table.h"
#include "rdmaps/table_optimizer.h"
#include "tools/train/model.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {

class LocalStore : public ParameterStore {
 public:
  // `tables`: what the servers would hold, e.g. ModelTables(spec, ...).
  // InvalidArgument for tables the servers would refuse.
  static Result<std::unique_ptr<LocalStore>> Create(const std::vector<TableOptions>& tables);

  Status Pull(Params<float>& params) override;
  // One optimizer step on every table; InvalidArgument (and no step) when
  // `grads` is not shaped like the tables.
  Status Push(const Params<float>& grads) override;
  Status Clock() override { return Status::OK(); }
  StoreStats stats() const override { return stats_; }

  const Params<float>& params() const { return params_; }

 private:
  LocalStore(Params<float> params, std::vector<std::unique_ptr<TableOptimizer>> optimizers)
      : params_(std::move(params)), optimizers_(std::move(optimizers)) {}

  Params<float> params_;                                           // One flat vector per table.
  const std::vector<std::unique_ptr<TableOptimizer>> optimizers_;  // Per table.
  StoreStats stats_;
};

}  // namespace rdmaps::train

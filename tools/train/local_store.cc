#include "tools/train/local_store.h"

#include <string>

#include "tools/train/tables.h"

namespace rdmaps::train {
namespace {

std::uint64_t ParamBytes(const Params<float>& p) {
  std::uint64_t n = 0;
  for (const auto& t : p) n += t.size() * sizeof(float);
  return n;
}

}  // namespace

Result<std::unique_ptr<LocalStore>> LocalStore::Create(const std::vector<TableOptions>& tables) {
  std::vector<std::unique_ptr<TableOptimizer>> optimizers;
  for (const TableOptions& t : tables) {
    RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<TableOptimizer> o, TableOptimizer::Create(t));
    optimizers.push_back(std::move(o));
  }
  RDMAPS_ASSIGN_OR_RETURN(Params<float> params, InitialParams(tables));
  return std::unique_ptr<LocalStore>(new LocalStore(std::move(params), std::move(optimizers)));
}

Status LocalStore::Pull(Params<float>& params) {
  params = params_;
  ++stats_.pulls;
  stats_.bytes_pulled += ParamBytes(params_);
  return Status::OK();
}

Status LocalStore::Push(const Params<float>& grads) {
  if (grads.size() != params_.size()) {
    return InvalidArgumentError("LocalStore::Push: " + std::to_string(grads.size()) +
                                " gradient tables for " + std::to_string(params_.size()) +
                                " parameter tables; build the gradients with the same model");
  }
  for (std::size_t t = 0; t < grads.size(); ++t) {
    if (grads[t].size() != params_[t].size()) {
      return InvalidArgumentError("LocalStore::Push: gradient table " + std::to_string(t) +
                                  " has " + std::to_string(grads[t].size()) +
                                  " values, the parameters " + std::to_string(params_[t].size()));
    }
  }
  for (std::size_t t = 0; t < grads.size(); ++t) {
    RDMAPS_RETURN_IF_ERROR(
        optimizers_[t]->Apply(RowRange{0, optimizers_[t]->table().rows}, grads[t], params_[t]));
  }
  ++stats_.pushes;
  stats_.bytes_pushed += ParamBytes(grads);
  return Status::OK();
}

}  // namespace rdmaps::train

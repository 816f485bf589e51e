// The model's parameters as rdmaps tables: their shapes, how the servers
// initialise them and which optimizer applies the pushed gradients, plus the
// trainer's choices of optimizer and staleness from its flags. Both stores
// start from these tables: PsStore (the servers hold them) and LocalStore
// (this process holds them and runs the servers' initializer and optimizer
// code through the public API), so --local and a parameter-server run start
// from the same weights and update them alike.
//
// Thread safety: free functions on values; call them from any thread.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "tools/train/model.h"

namespace rdmaps::train {

// The rdmaps tables of `spec`, in ParameterTables order with ids 1, 2, ...
// and names "w0", "b0", ...: Normal(0, init_stddev) seeded from `seed` and
// the table id (zeros where init_stddev is 0), updated with `optimizer`,
// with staleness bound `staleness` (kBsp, s, or kAsp).
std::vector<TableOptions> ModelTables(const ModelSpec& spec, const OptimizerOptions& optimizer,
                                      std::uint64_t seed, std::uint32_t staleness);

// Every row of `tables` as the servers initialise it (rdmaps::InitializeRows):
// one flat vector per table, shaped like Mlp's parameters.
Result<Params<float>> InitialParams(const std::vector<TableOptions>& tables);

// The optimizer of --optimizer=`name` and --lr=`learning_rate`: sgd,
// momentum or adam with their default hyper-parameters (rdmaps-train has
// tuned learning rates for these three only, so it refuses adagrad). A
// learning rate of 0 picks the default: adam 1e-3 for an MLP, 2e-4 for
// softmax regression; momentum 0.01; sgd 0.05. InvalidArgument for another
// name or a negative learning rate.
Result<OptimizerOptions> TrainOptimizer(std::string_view name, float learning_rate, bool softmax);

// "bsp" -> kBsp, "asp" -> kAsp, "3" -> 3; InvalidArgument otherwise.
Result<std::uint32_t> ParseStaleness(std::string_view text);

}  // namespace rdmaps::train

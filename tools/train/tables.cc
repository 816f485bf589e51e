#include "tools/train/tables.h"

#include <charconv>
#include <string>

namespace rdmaps::train {

std::vector<TableOptions> ModelTables(const ModelSpec& spec, const OptimizerOptions& optimizer,
                                      std::uint64_t seed, std::uint32_t staleness) {
  std::vector<TableOptions> out;
  std::uint32_t id = 1;
  for (const TableShape& shape : ParameterTables(spec)) {
    TableOptions t;
    t.id = id;
    t.name = shape.name;
    t.rows = shape.rows;
    t.dim = static_cast<std::uint32_t>(shape.dim);
    t.init = shape.init_stddev > 0
                 ? Initializer::Normal(0.0f, static_cast<float>(shape.init_stddev), seed + id)
                 : Initializer::Zeros();
    t.optimizer = optimizer;
    t.staleness = staleness;
    out.push_back(std::move(t));
    ++id;
  }
  return out;
}

Result<Params<float>> InitialParams(const std::vector<TableOptions>& tables) {
  Params<float> out;
  for (const TableOptions& t : tables) {
    std::vector<float>& values = out.emplace_back(t.rows * t.dim);
    RDMAPS_RETURN_IF_ERROR(InitializeRows(t, 0, values));
  }
  return out;
}

Result<OptimizerOptions> TrainOptimizer(std::string_view name, float learning_rate, bool softmax) {
  const Result<OptimizerOptions::Kind> kind = ParseOptimizerKind(name);
  if (!kind.ok() || *kind == OptimizerOptions::Kind::kAdagrad) {
    return InvalidArgumentError("unknown optimizer '" + std::string(name) +
                                "'; use sgd, momentum or adam");
  }
  if (learning_rate < 0) {
    return InvalidArgumentError("--lr=" + std::to_string(learning_rate) +
                                " is negative; give a positive learning rate or 0 (the default)");
  }
  switch (*kind) {
    case OptimizerOptions::Kind::kSgd:
      return OptimizerOptions::Sgd(learning_rate > 0 ? learning_rate : 0.05f);
    case OptimizerOptions::Kind::kMomentum:
      return OptimizerOptions::Momentum(learning_rate > 0 ? learning_rate : 0.01f);
    case OptimizerOptions::Kind::kAdagrad:
      break;  // Refused above.
    case OptimizerOptions::Kind::kAdam:
      if (learning_rate > 0) return OptimizerOptions::Adam(learning_rate);
      return OptimizerOptions::Adam(softmax ? 2e-4f : 1e-3f);
  }
  return InternalError("TrainOptimizer: unhandled optimizer kind");
}

Result<std::uint32_t> ParseStaleness(std::string_view text) {
  if (text == "bsp") return kBsp;
  if (text == "asp") return kAsp;
  std::uint32_t s = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s);
  if (ec != std::errc() || end != text.data() + text.size() || s == kAsp) {
    return InvalidArgumentError("--staleness=" + std::string(text) +
                                " is not bsp, asp or a staleness bound like 3");
  }
  return s;
}

}  // namespace rdmaps::train

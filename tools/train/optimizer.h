// Optimizers for training without the parameter server (the local loop and
// the tests): SGD, SGD with momentum, and Adam, over Params<float> tables.
// Through the parameter server the same update rules run server-side per
// table; workers only push gradients.
//
// Thread safety: an Optimizer keeps per-parameter state; one thread at a time.
#pragma once

#include <string>
#include <string_view>

#include "rdmaps/status.h"
#include "tools/train/model.h"

namespace rdmaps::train {

enum class OptimizerKind { kSgd, kMomentum, kAdam };

// "sgd", "momentum" or "adam"; InvalidArgument otherwise.
Result<OptimizerKind> ParseOptimizer(std::string_view name);
std::string_view OptimizerName(OptimizerKind kind);

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdam;
  float learning_rate = 1e-3f;
  float momentum = 0.9f;  // kMomentum: v = momentum * v + g; p -= lr * v.
  float beta1 = 0.9f;     // kAdam.
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

class Optimizer {
 public:
  explicit Optimizer(OptimizerOptions options) : options_(options) {}

  const OptimizerOptions& options() const { return options_; }

  // params -= update(grads); tables must have matching sizes.
  void Step(Params<float>& params, const Params<float>& grads);

 private:
  const OptimizerOptions options_;
  long step_ = 0;
  Params<float> m_;  // Momentum velocity, or Adam's first moment.
  Params<float> v_;  // Adam's second moment.
};

}  // namespace rdmaps::train

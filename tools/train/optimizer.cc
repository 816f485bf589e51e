#include "tools/train/optimizer.h"

#include <glog/logging.h>

#include <cmath>

namespace rdmaps::train {

Result<OptimizerKind> ParseOptimizer(std::string_view name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "momentum") return OptimizerKind::kMomentum;
  if (name == "adam") return OptimizerKind::kAdam;
  return InvalidArgumentError("unknown optimizer '" + std::string(name) +
                              "'; use sgd, momentum or adam");
}

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kMomentum:
      return "momentum";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "?";
}

void Optimizer::Step(Params<float>& params, const Params<float>& grads) {
  CHECK_EQ(params.size(), grads.size());
  if (m_.empty()) {
    for (const auto& p : params) {
      m_.emplace_back(p.size(), 0.0f);
      v_.emplace_back(options_.kind == OptimizerKind::kAdam ? p.size() : 0, 0.0f);
    }
  }
  ++step_;
  const float lr = options_.learning_rate;
  // Adam's bias corrections folded into the step size.
  const double c1 = 1.0 - std::pow(static_cast<double>(options_.beta1), static_cast<double>(step_));
  const double c2 = 1.0 - std::pow(static_cast<double>(options_.beta2), static_cast<double>(step_));
  const auto adam_lr = static_cast<float>(lr * std::sqrt(c2) / c1);
  for (std::size_t t = 0; t < params.size(); ++t) {
    CHECK_EQ(params[t].size(), grads[t].size());
    float* p = params[t].data();
    const float* g = grads[t].data();
    float* m = m_[t].data();
    float* v = v_[t].data();
    const std::size_t n = params[t].size();
    switch (options_.kind) {
      case OptimizerKind::kSgd:
        for (std::size_t i = 0; i < n; ++i) p[i] -= lr * g[i];
        break;
      case OptimizerKind::kMomentum:
        for (std::size_t i = 0; i < n; ++i) {
          m[i] = options_.momentum * m[i] + g[i];
          p[i] -= lr * m[i];
        }
        break;
      case OptimizerKind::kAdam:
        for (std::size_t i = 0; i < n; ++i) {
          m[i] = options_.beta1 * m[i] + (1 - options_.beta1) * g[i];
          v[i] = options_.beta2 * v[i] + (1 - options_.beta2) * g[i] * g[i];
          p[i] -= adam_lr * m[i] / (std::sqrt(v[i]) + options_.epsilon);
        }
        break;
    }
  }
}

}  // namespace rdmaps::train

#include "rdmaps/table.h"

namespace rdmaps {

const char* OptimizerKindName(OptimizerOptions::Kind kind) {
  switch (kind) {
    case OptimizerOptions::Kind::kSgd:
      return "sgd";
    case OptimizerOptions::Kind::kMomentum:
      return "momentum";
    case OptimizerOptions::Kind::kAdagrad:
      return "adagrad";
    case OptimizerOptions::Kind::kAdam:
      return "adam";
  }
  return "unknown";
}

}  // namespace rdmaps

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

const char* RowLayoutName(RowLayout layout) {
  switch (layout) {
    case RowLayout::kDense:
      return "dense";
    case RowLayout::kInline:
      return "inline";
    case RowLayout::kAuto:
      return "auto";
  }
  return "unknown";
}

}  // namespace rdmaps

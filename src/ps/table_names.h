// The names of the enums of include/rdmaps/table.h, one table per enum: the
// public *Name and Parse* functions (src/ps/table.cc) and the tables JSON's
// error messages (src/cluster/tables_json.cc) read them.
#pragma once

#include "rdmaps/table.h"
#include "src/base/enum_names.h"

namespace rdmaps::internal {

inline constexpr EnumName<Initializer::Kind> kInitializerKindNames[] = {
    {Initializer::Kind::kZeros, "zeros"},
    {Initializer::Kind::kConstant, "constant"},
    {Initializer::Kind::kUniform, "uniform"},
    {Initializer::Kind::kNormal, "normal"},
};

inline constexpr EnumName<OptimizerOptions::Kind> kOptimizerKindNames[] = {
    {OptimizerOptions::Kind::kSgd, "sgd"},
    {OptimizerOptions::Kind::kMomentum, "momentum"},
    {OptimizerOptions::Kind::kAdagrad, "adagrad"},
    {OptimizerOptions::Kind::kAdam, "adam"},
};

inline constexpr EnumName<RowLayout> kRowLayoutNames[] = {
    {RowLayout::kDense, "dense"},
    {RowLayout::kInline, "inline"},
    {RowLayout::kAuto, "auto"},
};

}  // namespace rdmaps::internal

// Tables: what a parameter server stores, described identically on every
// server and every worker.
//
// A table is a matrix of float32 parameters: `rows` rows of `dim` floats. A
// dense tensor is a table (one row, or a few wide rows); an embedding is a
// table with many rows. Each table has an initialiser (how the servers fill
// it at start-up), an optimizer (how the servers apply pushed gradients) and
// a staleness bound (the consistency model of pulls, see Client).
//
// Rows are range-partitioned across the S servers in contiguous shards: the
// first rows % S servers hold rows / S + 1 rows, the others rows / S (servers
// beyond `rows` hold none). See PartitionOf() in src/ps/wire.h.
//
// These are plain value types, and the functions here are pure: use them
// from any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "rdmaps/status.h"

namespace rdmaps {

// Staleness bound for asynchronous training (ASP): pulls never wait.
inline constexpr std::uint32_t kAsp = std::numeric_limits<std::uint32_t>::max();
// Staleness bound for bulk-synchronous training (BSP).
inline constexpr std::uint32_t kBsp = 0;

// How the servers fill a table at start-up. Row r of table t is a pure
// function of (kind, parameters, seed, t, r): identical whatever the number
// of servers.
struct Initializer {
  enum class Kind : std::uint8_t { kZeros, kConstant, kUniform, kNormal };
  Kind kind = Kind::kZeros;
  float value = 0.0f;  // kConstant
  float low = -0.01f;  // kUniform: [low, high)
  float high = 0.01f;
  float mean = 0.0f;  // kNormal
  float stddev = 0.01f;
  std::uint64_t seed = 1;

  static Initializer Zeros() { return {}; }
  static Initializer Constant(float v) {
    Initializer i;
    i.kind = Kind::kConstant;
    i.value = v;
    return i;
  }
  static Initializer Uniform(float low, float high, std::uint64_t seed = 1) {
    Initializer i;
    i.kind = Kind::kUniform;
    i.low = low;
    i.high = high;
    i.seed = seed;
    return i;
  }
  static Initializer Normal(float mean, float stddev, std::uint64_t seed = 1) {
    Initializer i;
    i.kind = Kind::kNormal;
    i.mean = mean;
    i.stddev = stddev;
    i.seed = seed;
    return i;
  }
};

// "zeros", "constant", "uniform", "normal" (the tables JSON's "init" kinds).
const char* InitializerKindName(Initializer::Kind kind);
// The inverse of InitializerKindName; InvalidArgument listing the names.
Result<Initializer::Kind> ParseInitializerKind(std::string_view name);

// How the servers apply a pushed gradient g to a parameter w. Every push is
// one optimizer step on the rows it carries (pushes from several workers are
// applied one after the other, so for SGD the result is the sum of all
// gradients times the learning rate, in any order).
//   kSgd:      w -= lr * g
//   kMomentum: v = momentum * v + g;  w -= lr * v
//   kAdagrad:  a += g * g;            w -= lr * g / (sqrt(a) + epsilon)
//   kAdam:     t += 1 (per row); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//              w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + epsilon)
// Optimizer state (v, a, m, t) lives on the server beside the rows, is not
// readable by workers, and starts at zero (a starts at initial_accumulator).
struct OptimizerOptions {
  enum class Kind : std::uint8_t { kSgd, kMomentum, kAdagrad, kAdam };
  Kind kind = Kind::kSgd;
  float learning_rate = 0.01f;
  float momentum = 0.9f;             // kMomentum
  float initial_accumulator = 0.0f;  // kAdagrad
  float beta1 = 0.9f;                // kAdam
  float beta2 = 0.999f;              // kAdam
  float epsilon = 1e-8f;             // kAdagrad, kAdam

  static OptimizerOptions Sgd(float lr) {
    OptimizerOptions o;
    o.learning_rate = lr;
    return o;
  }
  static OptimizerOptions Momentum(float lr, float momentum = 0.9f) {
    OptimizerOptions o;
    o.kind = Kind::kMomentum;
    o.learning_rate = lr;
    o.momentum = momentum;
    return o;
  }
  static OptimizerOptions Adagrad(float lr, float epsilon = 1e-8f) {
    OptimizerOptions o;
    o.kind = Kind::kAdagrad;
    o.learning_rate = lr;
    o.epsilon = epsilon;
    return o;
  }
  static OptimizerOptions Adam(float lr, float beta1 = 0.9f, float beta2 = 0.999f,
                               float epsilon = 1e-8f) {
    OptimizerOptions o;
    o.kind = Kind::kAdam;
    o.learning_rate = lr;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.epsilon = epsilon;
    return o;
  }
};

// "sgd", "momentum", "adagrad", "adam".
const char* OptimizerKindName(OptimizerOptions::Kind kind);
// The inverse of OptimizerKindName; InvalidArgument listing the names.
Result<OptimizerOptions::Kind> ParseOptimizerKind(std::string_view name);

// How a server keeps a table's rows (see docs/ps.md, "Row layouts").
enum class RowLayout : std::uint32_t {
  // Rows are checked against checksummed headers, one per block of rows
  // (one row of 1 KiB or more, or about 2 KiB of smaller rows; one row in
  // tables of 65536 rows and more and in inline tables of more than 64 KiB
  // per shard). A pull READs whole blocks.
  // Dense rows, headers apart: a pull lands in the caller's registered
  // buffer (zero-copy, except blocks it wants only in part) and a contiguous
  // range is two READs per server; a scattered row costs a READ of its block
  // and a 16-byte header READ.
  kDense = 0,
  // Each block of rows after its header (padded to 16 bytes): one READ per
  // scattered row or per range (zero-copy by scattered READs for rows of
  // 1 KiB and more, else staged). For tables pulled a few rows at a time:
  // embedding tables pulled by scattered ids, single rows, small ranges.
  kInline = 1,
  // The server picks: kInline when every shard of the table holds at most
  // 64 KiB of rows (then every pull of it is small, where one READ beats
  // two on every transport) or when the table is embedding-shaped (at least
  // 65536 rows of under 1 KiB: pulled by scattered ids, as a rule), else
  // kDense. TableInfo::layout says which.
  kAuto = 2,
};

// "dense", "inline", "auto".
const char* RowLayoutName(RowLayout layout);
// The inverse of RowLayoutName; InvalidArgument listing the names.
Result<RowLayout> ParseRowLayout(std::string_view name);

// The longest table name the server directory carries.
inline constexpr std::size_t kMaxTableNameLength = 31;

struct TableOptions {
  std::uint32_t id = 0;    // Unique per job; Client calls name tables by id.
  std::string name;        // Unique per job, <= kMaxTableNameLength chars.
  std::uint64_t rows = 1;  // >= 1
  std::uint32_t dim = 1;   // floats per row, >= 1
  Initializer init;
  OptimizerOptions optimizer;
  // Pulls of this table at worker clock c see every update pushed at clocks
  // <= c - staleness - 1 (kBsp = 0, kAsp = never wait). A client may tighten
  // it (ClientOptions::staleness_override).
  std::uint32_t staleness = kAsp;
  RowLayout layout = RowLayout::kAuto;
};

// Fills `out` with rows [first_row, first_row + out.size() / table.dim) of
// `table` exactly as the servers initialise them at start-up (the same code,
// so the same bits). For a program that holds a table's rows itself, e.g. a
// baseline trained without servers that must start from the servers'
// weights. InvalidArgument when `out` is not a whole number of rows or the
// rows run past table.rows.
Status InitializeRows(const TableOptions& table, std::uint64_t first_row, std::span<float> out);

// A contiguous run of rows [begin, begin + count).
struct RowRange {
  std::uint64_t begin = 0;
  std::uint64_t count = 0;
};

}  // namespace rdmaps

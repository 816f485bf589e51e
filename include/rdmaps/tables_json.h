// The job's tables as JSON: what rdmaps-server --tables=FILE and
// rdmaps-local --tables=FILE read, and how a worker program describes its
// tables to a launcher.
//
// Thread safety: free functions on values; call them from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rdmaps/cluster.h"
#include "rdmaps/options.h"
#include "rdmaps/status.h"
#include "rdmaps/table.h"

namespace rdmaps {

// Every server and worker of a job needs the same table list. The tools pass
// it as JSON (rdmaps-server --tables=FILE, rdmaps-local --tables=FILE):
//   {"tables": [{"id": 0, "name": "w1", "rows": 784, "dim": 128,
//                "staleness": "bsp" | "asp" | 3,
//                "init": {"kind": "uniform", "low": -0.05, "high": 0.05, "seed": 1},
//                "optimizer": {"kind": "adam", "learning_rate": 0.001}}]}
// "init" kinds: zeros, constant (value), uniform (low, high, seed), normal
// (mean, stddev, seed). "optimizer" kinds: sgd, momentum (momentum), adagrad
// (initial_accumulator, epsilon), adam (beta1, beta2, epsilon). Omitted
// fields take TableOptions' defaults; unknown keys are an error (typos).
Result<std::vector<TableOptions>> ParseTablesJson(std::string_view json);
std::string TablesToJson(const std::vector<TableOptions>& tables);
// Reads and parses a tables file; NotFound / InvalidArgument naming it.
Result<std::vector<TableOptions>> ReadTablesFile(const std::string& path);

// A tables file may also carry the job's checkpoint settings, beside the
// list (docs/ps.md, "Checkpoints"):
//   {"tables": [...],
//    "checkpoint": {"dir": "/shared/ckpt", "every_clocks": 100, "every_seconds": 600,
//                   "keep": 3, "timeout_seconds": 600}}
// Every key is optional; unknown keys, wrong types, negative numbers and
// values out of range (every_seconds and timeout_seconds at most 10 years,
// keep below 2^32, dir at most 4096 bytes) are InvalidArgument naming the
// key. ParseTablesJson checks the object too (and ignores it).
struct CheckpointSettings {
  std::optional<std::string> dir;
  std::optional<std::uint64_t> every_clocks;
  std::optional<std::uint64_t> every_seconds;
  std::optional<std::uint32_t> keep;
  std::optional<std::uint64_t> timeout_seconds;
  // Sets the ServerOptions fields that are given here (checkpoint_dir,
  // checkpoint_every, checkpoint_interval, checkpoint_keep,
  // checkpoint_timeout); rdmaps-server applies its flags over them.
  void ApplyTo(ServerOptions* options) const;
};
Result<CheckpointSettings> ParseCheckpointSettings(std::string_view json);
Result<CheckpointSettings> ReadCheckpointSettingsFile(const std::string& path);

// How a worker program tells rdmaps-local (or rdmaps-server -- CMD) its
// tables when no --tables file is given: the launcher runs the worker
// command once with RDMAPS_DESCRIBE_TABLES=PATH set. A worker program calls
// this right after parsing its flags; when it returns true the tables were
// written to PATH and the program must exit 0 without training:
//   RDMAPS_ASSIGN_OR_RETURN(bool described, DescribeTablesIfAsked(tables, env));
//   if (described) return 0;
inline constexpr char kDescribeTablesEnv[] = "RDMAPS_DESCRIBE_TABLES";
Result<bool> DescribeTablesIfAsked(const std::vector<TableOptions>& tables,
                                   const Environment& env);

}  // namespace rdmaps

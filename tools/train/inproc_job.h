// A whole training job in one process: S parameter servers and W workers
// (threads, each with its own Client and its own connections) over a real
// transport (tcp by default; fake also works). For tests, for the
// consistency study, and for `rdmaps-train --inproc_servers=S
// --inproc_workers=W` on a machine without a launcher. The multi-process
// form is rdmaps-local running rdmaps-train.
//
// Thread safety: RunInProcessJob blocks the caller until every worker and
// server has finished or failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rdmaps/status.h"
#include "rdmaps/table.h"
#include "tools/train/idx.h"
#include "tools/train/trainer.h"

namespace rdmaps::train {

struct InProcessJob {
  int servers = 2;
  int workers = 2;
  std::string transport = "tcp";
  // Applied to every worker; worker_index/num_workers/slow_factor are set
  // per worker from the fields below.
  TrainOptions train;
  OptimizerOptions optimizer = OptimizerOptions::Adam(1e-3f);
  std::uint32_t staleness = 0;  // kBsp, s, or kAsp
  int slow_worker = -1;
  int slow_factor = 1;
  // Only worker 0 evaluates (the others skip evaluation) unless this is set.
  bool evaluate_on_every_worker = false;
  // Checkpoints (ServerOptions of the same names): the servers write one
  // every checkpoint_every clocks to checkpoint_dir; with `resume` they start
  // from the newest complete one there and the workers resume at its clock.
  std::string checkpoint_dir;
  std::uint64_t checkpoint_every = 0;
  bool resume = false;
  // Pull/Barrier waits and connects fail after this long.
  std::chrono::milliseconds wait_timeout{60000};
};

// Runs the job; returns each worker's report (index = worker). The first
// error of any worker or server fails the whole job (the others are
// released: their Clients close, the servers stop).
Result<std::vector<TrainReport>> RunInProcessJob(
    const InProcessJob& job, const Dataset& train, const Dataset& test,
    const std::function<void(int worker, const Progress&)>& on_progress = {});

}  // namespace rdmaps::train

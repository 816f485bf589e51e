// The data-parallel training loop of one worker, independent of where the
// parameters live: each step pulls the parameters from a ParameterStore,
// computes the gradient of a mini-batch of this worker's partition, pushes
// it, and ends the iteration with Clock(). The stores: PsStore (ps_store.h)
// through the parameter servers, LocalStore (local_store.h) in this process
// with the servers' optimizer code (the no-PS baseline).
//
// Partitioning: the training set is shuffled once with the job's seed (the
// same permutation on every worker), and worker w of W trains on samples
// [w*P, (w+1)*P) of it, P = n / W, so every worker runs the same number of
// steps (BSP needs that) and the partitions are disjoint.
//
// Thread safety: Train() runs on the caller's thread; a store is used by one
// thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "rdmaps/status.h"
#include "tools/train/idx.h"
#include "tools/train/model.h"

namespace rdmaps::train {

// Figures a store counts about its traffic and consistency waits.
struct StoreStats {
  std::uint64_t pulls = 0;
  std::uint64_t pushes = 0;
  std::uint64_t bytes_pulled = 0;
  std::uint64_t bytes_pushed = 0;
  std::uint64_t bytes_staged = 0;  // Copied through staging (0: all zero-copy).
  double staleness_mean = 0;       // Worker clock minus the slowest clock seen at pulls.
  std::uint64_t staleness_max = 0;
  double blocked_seconds = 0;  // Time pulls/clocks waited for other workers.
};

// Where a worker's parameters live.
class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  // Fills `params` (shaped like ParameterTables) with the current values.
  virtual Status Pull(Params<float>& params) = 0;
  // Sends the gradient of one mini-batch.
  virtual Status Push(const Params<float>& grads) = 0;
  // Ends this worker's iteration (the consistency clock).
  virtual Status Clock() = 0;
  // Waits for every worker; the default has nobody to wait for.
  virtual Status Barrier() { return Status::OK(); }
  // The clock (= steps done) this worker starts at: 0, or the clock of the
  // checkpoint the servers restored. Train() resumes there.
  virtual std::uint64_t start_clock() const { return 0; }
  // After a server failure (a call failed with Unavailable): connects again
  // once the job's servers have been restarted from their latest checkpoint,
  // after which start_clock() is its clock. The default cannot.
  virtual Status Recover() {
    return NotSupportedError("this parameter store cannot recover from a failure");
  }
  virtual StoreStats stats() const = 0;
};

// How a straggler is emulated.
enum class SlowMode {
  kCompute,  // Really computes the gradient slow_factor times.
  kWait,     // Works once, then waits (slow_factor - 1) x the step's own
             // time (the step minus the time it was blocked on other workers
             // or evaluating): a machine slow_factor times slower at
             // everything, network included.
};

struct TrainOptions {
  ModelSpec model;
  std::size_t batch_size = 64;
  int epochs = 5;
  std::uint64_t seed = 1;
  int worker_index = 0;
  int num_workers = 1;
  // This worker is slow_factor x slower (1: normal).
  int slow_factor = 1;
  SlowMode slow_mode = SlowMode::kCompute;
  // Record test accuracy on the first eval_limit test samples every
  // eval_every_steps steps (0: once per epoch) -- only if `evaluate`.
  bool evaluate = true;
  std::size_t eval_every_steps = 0;
  std::size_t eval_limit = 2000;
  // The accuracy whose first crossing on the curve is reported as
  // time_to_target_seconds (0: none). Training does not stop there: under BSP
  // every worker must run the same number of clocks.
  double target_accuracy = 0;
  // A store call failing with Unavailable (a server died) is followed by
  // store.Recover() and a rewind to its start_clock(), this many times at
  // most (0: the failure ends the run).
  int max_recoveries = 0;
  // Called about every progress_interval with the running figures.
  std::chrono::milliseconds progress_interval{1000};
};

struct Progress {
  int epoch = 0;  // 1-based.
  int epochs = 0;
  std::uint64_t step = 0;
  std::uint64_t total_steps = 0;
  double samples_per_second = 0;
  double loss = 0;  // Moving average of mini-batch losses.
  double elapsed_seconds = 0;
  double eta_seconds = 0;
};

struct EvalPoint {
  double seconds = 0;  // Training time: wall time minus time spent evaluating.
  std::uint64_t step = 0;
  double accuracy = 0;
};

struct TrainReport {
  std::uint64_t steps = 0;
  std::uint64_t samples = 0;
  double wall_seconds = 0;      // Whole loop, evaluation excluded.
  double compute_seconds = 0;   // Forward/backward, straggler emulation included.
  double first_epoch_loss = 0;  // Mean mini-batch loss of the first epoch.
  double last_epoch_loss = 0;   // ... and of the last.
  std::vector<double> epoch_loss;
  std::vector<EvalPoint> curve;
  int recoveries = 0;                  // rewinds to a checkpoint after a server failure
  double time_to_target_seconds = -1;  // When the curve first reached target_accuracy.
  double test_accuracy = -1;           // Full test set, final parameters (-1: not evaluated).
  StoreStats store;
};

// The training-set indices worker `worker` of `workers` trains on: slice
// [worker*P, (worker+1)*P), P = n / workers, of a permutation of [0, n)
// drawn from `seed` (the same on every worker).
std::vector<std::uint32_t> PartitionIndices(std::size_t n, std::uint64_t seed, int worker,
                                            int workers);

// Builds mini-batch inputs: features of d's samples `indices[0..n)` into x
// (n x d.features()) and their labels into y.
void FillBatch(const Dataset& d, const std::uint32_t* indices, std::size_t n, float* x,
               std::uint8_t* y);

// Accuracy of `params` on the first `limit` samples of d (all when 0).
double Evaluate(Mlp<float>& model, const Params<float>& params, const Dataset& d,
                std::size_t limit = 0);

// Trains on this worker's partition of `train` and, if options.evaluate,
// evaluates on `test`. Errors come from the store (network, consistency
// deadline) or from options that cannot work (InvalidArgument).
Result<TrainReport> Train(const TrainOptions& options, const Dataset& train, const Dataset& test,
                          ParameterStore& store,
                          const std::function<void(const Progress&)>& on_progress = {});

}  // namespace rdmaps::train

#include "tools/train/trainer.h"

#include <glog/logging.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <thread>

namespace rdmaps::train {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

std::vector<std::uint32_t> PartitionIndices(std::size_t n, std::uint64_t seed, int worker,
                                            int workers) {
  CHECK_GE(worker, 0);
  CHECK_LT(worker, workers);
  std::vector<std::uint32_t> perm(n);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed));
  const std::size_t part = n / static_cast<std::size_t>(workers);
  const auto first =
      perm.begin() + static_cast<std::ptrdiff_t>(part * static_cast<std::size_t>(worker));
  return std::vector<std::uint32_t>(first, first + static_cast<std::ptrdiff_t>(part));
}

void FillBatch(const Dataset& d, const std::uint32_t* indices, std::size_t n, float* x,
               std::uint8_t* y) {
  const std::size_t f = d.features();
  for (std::size_t i = 0; i < n; ++i) {
    PixelsToFeatures(d.image(indices[i]), f, x + i * f);
    y[i] = d.labels[indices[i]];
  }
}

double Evaluate(Mlp<float>& model, const Params<float>& params, const Dataset& d,
                std::size_t limit) {
  const std::size_t n = limit == 0 ? d.n : std::min(limit, d.n);
  if (n == 0) return 0;
  constexpr std::size_t kChunk = 500;
  std::vector<float> x(kChunk * d.features());
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < n; begin += kChunk) {
    const std::size_t count = std::min(kChunk, n - begin);
    PixelsToFeatures(d.image(begin), count * d.features(), x.data());
    correct += model.CountCorrect(params, x.data(), d.labels.data() + begin, count);
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

Result<TrainReport> Train(const TrainOptions& options, const Dataset& train, const Dataset& test,
                          ParameterStore& store,
                          const std::function<void(const Progress&)>& on_progress) {
  if (options.num_workers < 1 || options.worker_index < 0 ||
      options.worker_index >= options.num_workers) {
    return InvalidArgumentError("worker index " + std::to_string(options.worker_index) +
                                " is outside [0, " + std::to_string(options.num_workers) +
                                "); check the cluster layout");
  }
  if (options.batch_size == 0 || options.epochs < 1 || options.slow_factor < 1) {
    return InvalidArgumentError("batch_size, epochs and slow_factor must be at least 1");
  }
  if (train.features() != static_cast<std::size_t>(options.model.inputs)) {
    return InvalidArgumentError("the data has " + std::to_string(train.features()) +
                                " features, the model expects " +
                                std::to_string(options.model.inputs));
  }
  const std::size_t part = train.n / static_cast<std::size_t>(options.num_workers);
  if (part < options.batch_size) {
    return InvalidArgumentError(
        "each of the " + std::to_string(options.num_workers) + " workers gets " +
        std::to_string(part) + " training samples, fewer than one batch of " +
        std::to_string(options.batch_size) + "; lower --batch_size or raise --train_limit");
  }

  const std::uint64_t steps_per_epoch = part / options.batch_size;
  const std::uint64_t total_steps = steps_per_epoch * static_cast<std::uint64_t>(options.epochs);
  // After a restore: the steps before the checkpoint's clock are done. The
  // data order is a pure function of (seed, worker, epoch), so skipping them
  // (still drawing every epoch's shuffle) gives the batches an uninterrupted
  // run would have used.
  auto check_start = [&](std::uint64_t first) -> Status {
    if (first <= total_steps) return Status::OK();
    return InvalidArgumentError("the servers restored a checkpoint at clock " +
                                std::to_string(first) + ", past this run's " +
                                std::to_string(total_steps) +
                                " steps; raise --epochs or restore an earlier checkpoint");
  };
  std::uint64_t first_step = store.start_clock();
  RDMAPS_RETURN_IF_ERROR(check_start(first_step));
  const std::size_t b = options.batch_size;
  Mlp<float> model(options.model);
  Params<float> params = ZeroParams<float>(options.model);
  Params<float> grads = ZeroParams<float>(options.model);
  std::vector<float> x(b * train.features());
  std::vector<std::uint8_t> y(b);

  TrainReport report;
  const auto start = Clock::now();
  double eval_seconds = 0;
  auto train_seconds = [&] { return SecondsSince(start) - eval_seconds; };
  auto evaluate_now = [&](std::uint64_t step) {
    const auto t = Clock::now();
    const double seconds = train_seconds();
    const double acc = Evaluate(model, params, test, options.eval_limit);
    report.curve.push_back({seconds, step, acc});
    if (options.target_accuracy > 0 && report.time_to_target_seconds < 0 &&
        acc >= options.target_accuracy) {
      report.time_to_target_seconds = seconds;
    }
    eval_seconds += SecondsSince(t);
  };

  // Runs the steps from first_step on (the whole run, or the rest after a
  // rewind to a checkpoint); every epoch's shuffle is drawn again from the
  // start, so the data position is a pure function of the step.
  std::uint64_t step = 0;
  auto run_steps = [&]() -> Status {
    const bool slow_wait = options.slow_factor > 1 && options.slow_mode == SlowMode::kWait;
    double loss_avg = 0;
    bool loss_avg_set = false;
    auto last_progress = Clock::now();
    step = 0;
    report.epoch_loss.clear();
    std::vector<std::uint32_t> mine =
        PartitionIndices(train.n, options.seed, options.worker_index, options.num_workers);
    std::mt19937_64 rng(options.seed * 0x9e3779b97f4a7c15ull +
                        static_cast<std::uint64_t>(options.worker_index) + 1);
    for (int epoch = 1; epoch <= options.epochs; ++epoch) {
      std::shuffle(mine.begin(), mine.end(), rng);
      double epoch_loss = 0;
      std::uint64_t epoch_steps = 0;
      for (std::uint64_t s = 0; s < steps_per_epoch; ++s) {
        if (step < first_step) {  // done before the checkpoint
          ++step;
          continue;
        }
        const auto step_start = Clock::now();
        const double eval_before = eval_seconds;
        const double blocked_before = slow_wait ? store.stats().blocked_seconds : 0.0;
        RDMAPS_RETURN_IF_ERROR(store.Pull(params));
        if (options.evaluate && options.eval_every_steps > 0 &&
            step % options.eval_every_steps == 0) {
          evaluate_now(step);
        }
        const auto t = Clock::now();
        FillBatch(train, mine.data() + s * b, b, x.data(), y.data());
        const float loss = model.ForwardBackward(params, x.data(), y.data(), b, grads);
        if (options.slow_factor > 1 && options.slow_mode == SlowMode::kCompute) {
          for (int k = 1; k < options.slow_factor; ++k) {
            model.ForwardBackward(params, x.data(), y.data(), b, grads);
          }
        }
        report.compute_seconds += SecondsSince(t);
        RDMAPS_RETURN_IF_ERROR(store.Push(grads));
        RDMAPS_RETURN_IF_ERROR(store.Clock());
        if (slow_wait) {
          // Emulates a slower machine (not a synchronisation): this step's own
          // work -- pull, compute, push, clock, minus the time spent waiting
          // for other workers and evaluating -- takes slow_factor times as long.
          const double own = SecondsSince(step_start) - (eval_seconds - eval_before) -
                             (store.stats().blocked_seconds - blocked_before);
          if (own > 0) {
            std::this_thread::sleep_for(
                std::chrono::duration<double>(own * (options.slow_factor - 1)));
          }
        }
        ++step;
        ++epoch_steps;
        epoch_loss += loss;
        loss_avg = loss_avg_set ? 0.95 * loss_avg + 0.05 * loss : loss;
        loss_avg_set = true;
        if (on_progress &&
            (Clock::now() - last_progress >= options.progress_interval || step == total_steps)) {
          last_progress = Clock::now();
          Progress p;
          p.epoch = epoch;
          p.epochs = options.epochs;
          p.step = step;
          p.total_steps = total_steps;
          p.elapsed_seconds = train_seconds();
          p.samples_per_second = static_cast<double>(step * b) / std::max(p.elapsed_seconds, 1e-9);
          p.loss = loss_avg;
          p.eta_seconds = p.elapsed_seconds / static_cast<double>(step) *
                          static_cast<double>(total_steps - step);
          on_progress(p);
        }
      }
      if (epoch_steps == 0) continue;  // the whole epoch was before the checkpoint
      report.epoch_loss.push_back(epoch_loss / static_cast<double>(epoch_steps));
      if (options.evaluate && options.eval_every_steps == 0) {
        RDMAPS_RETURN_IF_ERROR(store.Pull(params));
        evaluate_now(step);
      }
    }
    return Status::OK();
  };
  while (true) {
    const Status st = run_steps();
    if (st.ok()) break;
    const bool server_failure = st.code() == StatusCode::kUnavailable ||
                                st.code() == StatusCode::kCancelled ||
                                st.code() == StatusCode::kIOError;
    if (!server_failure || report.recoveries >= options.max_recoveries) return st;
    LOG(WARNING) << "worker " << options.worker_index << " at step " << step << ": " << st
                 << "; reconnecting to the restarted servers";
    RDMAPS_RETURN_IF_ERROR(store.Recover());
    ++report.recoveries;
    first_step = store.start_clock();
    RDMAPS_RETURN_IF_ERROR(check_start(first_step));
  }
  report.steps = step - first_step;
  report.samples = report.steps * b;
  report.wall_seconds = train_seconds();
  if (!report.epoch_loss.empty()) {
    report.first_epoch_loss = report.epoch_loss.front();
    report.last_epoch_loss = report.epoch_loss.back();
  }
  RDMAPS_RETURN_IF_ERROR(store.Barrier());
  if (options.evaluate) {
    RDMAPS_RETURN_IF_ERROR(store.Pull(params));
    report.test_accuracy = Evaluate(model, params, test);
  }
  report.store = store.stats();
  return report;
}

}  // namespace rdmaps::train

// rdmaps-train: data-parallel training on Fashion-MNIST through the parameter
// server.
//
//   rdmaps-local --servers 2 --workers 4 -- rdmaps-train --model=mlp
//   rdmaps-train --inproc_servers=2 --inproc_workers=4 --model=mlp
//   rdmaps-train --local --model=softmax --epochs=20 --lr=2e-4
//
// Under a launcher, each process finds its role in the cluster layout (see
// include/rdmaps/cluster.h): a worker trains on its own partition, pulls,
// computes a mini-batch gradient, pushes, and calls Clock(); a process whose
// role is "ps" serves the model's tables (so a launcher may start
// rdmaps-train for every role). --inproc_* runs the servers and workers as
// threads of this process over --transport; --local trains without any
// server, starting from the weights the servers would and updating them with
// the servers' optimizer code (LocalStore). Progress goes to stderr, the final figures to stdout
// (text, or JSON with --output=json).
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "rdmaps/cluster.h"
#include "rdmaps/server.h"
#include "rdmaps/tables_json.h"
#include "tools/common/exit.h"
#include "tools/common/flags.h"
#include "tools/train/idx.h"
#include "tools/train/inproc_job.h"
#include "tools/train/local_store.h"
#include "tools/train/model.h"
#include "tools/train/ps_store.h"
#include "tools/train/tables.h"
#include "tools/train/trainer.h"

DEFINE_string(model, "mlp", "softmax (regression) or mlp");
DEFINE_string(hidden, "128", "MLP hidden layer widths, comma-separated (1 or 2 layers)");
DEFINE_string(optimizer, "adam", "sgd, momentum or adam");
DEFINE_double(lr, 0,
              "learning rate (0: 1e-3 for mlp, 2e-4 for softmax with adam; 0.05 sgd; "
              "0.01 momentum)");
DEFINE_int32(batch_size, 64, "mini-batch size per worker");
DEFINE_int32(epochs, 0,
             "passes over the training set (each worker over its partition; "
             "0: 8 for mlp, 20 for softmax)");
DEFINE_string(staleness, "bsp", "consistency: bsp (= 0), asp, or a staleness bound s");
DEFINE_uint64(seed, 1, "seed for initialisation, partitioning and shuffling");
DEFINE_int32(slow_worker, -1, "index of a worker to slow down (-1: none)");
DEFINE_int32(slow_factor, 1, "the slow worker is this many times slower");
DEFINE_string(slow_mode, "compute",
              "compute (really k x the gradient work) or wait (sleep k-1 x the step's own time, "
              "blocking excluded)");
DEFINE_uint64(train_limit, 0, "use only the first N training samples (0: all)");
DEFINE_uint64(test_limit, 0, "use only the first N test samples (0: all)");
DEFINE_string(data_dir, rdmaps::train::kDefaultFashionMnistDir,
              "folder with the Fashion-MNIST IDX files");
DEFINE_string(output, "text", "text or json");
DEFINE_bool(local, false, "train in this process without a parameter server");
DEFINE_int32(eval_every, 0, "record test accuracy every N steps (0: every epoch)");
DEFINE_uint64(eval_limit, 2000, "test samples used for the accuracy curve");
DEFINE_double(target_accuracy, 0, "report the time to reach this curve accuracy (0: none)");
DEFINE_bool(progress, true, "print a progress line to stderr");
DEFINE_string(transport, "",
              "tcp, verbs, fake or auto (empty: the layout's, else auto; "
              "--inproc_* defaults to tcp)");
DEFINE_int32(inproc_servers, 0, "run this many servers as threads of this process");
DEFINE_int32(inproc_workers, 0, "run this many workers as threads of this process");
DEFINE_int32(wait_timeout_ms, 60000,
             "pull (staleness) and barrier deadline; also the start-up (rendezvous and "
             "connect) deadline unless the launcher sets RDMAPS_STARTUP_TIMEOUT_S");
DEFINE_bool(print_tables, false, "print the model's tables as JSON and exit");
DEFINE_string(checkpoint_dir, "", "servers run by this tool write checkpoints to this folder");
DEFINE_uint64(checkpoint_every, 0, "... one every this many steps (clocks; 0: none)");
DEFINE_int32(max_recoveries, 0,
             "after a server failure, reconnect to the restarted servers and rewind to their "
             "checkpoint this many times (rdmaps-local --restart_servers restarts them)");
DEFINE_bool(resume, false,
            "servers run by this tool start from the newest complete checkpoint in "
            "--checkpoint_dir; workers resume at its step, with the data order of an "
            "uninterrupted run");

namespace rdmaps::train {
namespace {

// Wider layers than this are a typo (a 784 x 65536 layer is 200 MB).
constexpr int kMaxHiddenWidth = 1 << 16;

Result<ModelSpec> ModelFromFlags() {
  ModelSpec spec;
  if (FLAGS_model == "softmax") return spec;
  if (FLAGS_model != "mlp") {
    return InvalidArgumentError("--model=" + FLAGS_model + " is unknown; use softmax or mlp");
  }
  std::stringstream ss(FLAGS_hidden);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int width = 0;
    try {
      width = std::stoi(item);
    } catch (const std::exception&) {
      width = 0;
    }
    if (width <= 0) {
      return InvalidArgumentError("--hidden='" + FLAGS_hidden + "': width '" + item +
                                  "' is not a positive integer; e.g. 128 or 256,128");
    }
    if (width > kMaxHiddenWidth) {
      return InvalidArgumentError("--hidden='" + FLAGS_hidden + "': width " + item +
                                  " exceeds the limit of " + std::to_string(kMaxHiddenWidth));
    }
    spec.hidden.push_back(width);
  }
  if (spec.hidden.empty() || spec.hidden.size() > 2) {
    return InvalidArgumentError("--hidden=" + FLAGS_hidden + ": give 1 or 2 layer widths");
  }
  return spec;
}

void PrintProgress(const std::string& who, const Progress& p) {
  static const bool tty = isatty(STDERR_FILENO) != 0;
  char line[256];
  std::snprintf(
      line, sizeof(line), "%sepoch %d/%d step %llu/%llu  %.0f samples/s  loss %.4f  ETA %.0fs",
      who.c_str(), p.epoch, p.epochs, static_cast<unsigned long long>(p.step),
      static_cast<unsigned long long>(p.total_steps), p.samples_per_second, p.loss, p.eta_seconds);
  if (tty) {
    std::fprintf(stderr, "\r%-90s", line);
    if (p.step == p.total_steps) std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "%s\n", line);
  }
}

nlohmann::json ReportJson(const TrainOptions& o, const TrainReport& r, const std::string& mode) {
  nlohmann::json j;
  j["worker"] = o.worker_index;
  j["workers"] = o.num_workers;
  j["mode"] = mode;
  j["model"] = FLAGS_model;
  j["steps"] = r.steps;
  j["samples"] = r.samples;
  j["wall_seconds"] = r.wall_seconds;
  j["compute_seconds"] = r.compute_seconds;
  j["first_epoch_loss"] = r.first_epoch_loss;
  j["last_epoch_loss"] = r.last_epoch_loss;
  j["epoch_loss"] = r.epoch_loss;
  j["test_accuracy"] = r.test_accuracy;
  j["time_to_target_seconds"] = r.time_to_target_seconds;
  const double t = std::max(r.wall_seconds, 1e-9);
  j["pulls_per_second"] = static_cast<double>(r.store.pulls) / t;
  j["pushes_per_second"] = static_cast<double>(r.store.pushes) / t;
  j["bytes_pulled"] = r.store.bytes_pulled;
  j["bytes_pushed"] = r.store.bytes_pushed;
  j["bytes_staged"] = r.store.bytes_staged;
  j["staleness_mean"] = r.store.staleness_mean;
  j["staleness_max"] = r.store.staleness_max;
  j["blocked_seconds"] = r.store.blocked_seconds;
  nlohmann::json curve = nlohmann::json::array();
  for (const EvalPoint& e : r.curve) curve.push_back({e.seconds, e.step, e.accuracy});
  j["curve"] = curve;  // [train seconds, step, accuracy]
  return j;
}

void PrintText(const TrainOptions& o, const TrainReport& r, const std::string& mode,
               const std::string& who) {
  const double t = std::max(r.wall_seconds, 1e-9);
  std::printf("%smode %s, %llu steps, %llu samples in %.1f s (%.0f samples/s)\n", who.c_str(),
              mode.c_str(), static_cast<unsigned long long>(r.steps),
              static_cast<unsigned long long>(r.samples), r.wall_seconds,
              static_cast<double>(r.samples) / t);
  std::printf("%sloss: first epoch %.4f, last epoch %.4f\n", who.c_str(), r.first_epoch_loss,
              r.last_epoch_loss);
  std::printf("%spulls %.1f/s, pushes %.1f/s, moved %.1f MB pulled + %.1f MB pushed\n", who.c_str(),
              static_cast<double>(r.store.pulls) / t, static_cast<double>(r.store.pushes) / t,
              static_cast<double>(r.store.bytes_pulled) / 1e6,
              static_cast<double>(r.store.bytes_pushed) / 1e6);
  std::printf("%sstaleness mean %.2f max %llu, blocked %.2f s\n", who.c_str(),
              r.store.staleness_mean, static_cast<unsigned long long>(r.store.staleness_max),
              r.store.blocked_seconds);
  if (r.time_to_target_seconds >= 0) {
    std::printf("%sreached %.1f %% after %.1f s\n", who.c_str(), 100 * FLAGS_target_accuracy,
                r.time_to_target_seconds);
  }
  if (r.test_accuracy >= 0) {
    std::printf("%stest accuracy %.2f %%\n", who.c_str(), 100 * r.test_accuracy);
  }
  (void)o;
}

std::string StalenessName(std::uint32_t s) {
  if (s == kBsp) return "bsp";
  if (s == kAsp) return "asp";
  return "ssp" + std::to_string(s);
}

// Text: one block per worker report plus, for several, a summary line.
// JSON: worker 0's report, with every worker's under "workers".
void PrintReports(const TrainOptions& o, const std::vector<TrainReport>& reports,
                  const std::string& mode) {
  if (FLAGS_output == "json") {
    TrainOptions first = o;
    first.worker_index = reports.size() == 1 ? o.worker_index : 0;
    nlohmann::json j = ReportJson(first, reports[0], mode);
    if (reports.size() > 1) {
      nlohmann::json all = nlohmann::json::array();
      for (std::size_t w = 0; w < reports.size(); ++w) {
        TrainOptions ow = o;
        ow.worker_index = static_cast<int>(w);
        all.push_back(ReportJson(ow, reports[w], mode));
      }
      j["workers"] = all;
    }
    std::cout << j.dump() << std::endl;
    return;
  }
  for (std::size_t w = 0; w < reports.size(); ++w) {
    const int index = reports.size() == 1 ? o.worker_index : static_cast<int>(w);
    const std::string who = o.num_workers > 1 ? "[w" + std::to_string(index) + "] " : "";
    PrintText(o, reports[w], mode, who);
  }
}

// This process is a parameter server of the job: serve the model's tables
// until every worker has said goodbye.
Status Serve(const ClusterOptions& lo, ClusterLayout layout, const std::string& transport,
             const std::vector<TableOptions>& tables) {
  ServerOptions so = ServerOptions::FromCluster(layout);
  so.transport.transport = transport;
  so.tables = tables;
  so.checkpoint_dir = FLAGS_checkpoint_dir;
  so.checkpoint_every = FLAGS_checkpoint_every;
  if (FLAGS_resume) so.restore = "latest";
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(so));
  RDMAPS_ASSIGN_OR_RETURN(layout, CompleteCluster(std::move(layout), server->address(), lo));
  LOG(INFO) << "ps" << so.server_index << " serving " << tables.size() << " tables at "
            << server->address();
  return server->Run();
}

Status Run() {
  RDMAPS_ASSIGN_OR_RETURN(ModelSpec spec, ModelFromFlags());
  // (A double beyond the float range would become inf, or be undefined.)
  if (!(std::fabs(FLAGS_lr) <= std::numeric_limits<float>::max())) {
    return InvalidArgumentError("--lr=" + std::to_string(FLAGS_lr) +
                                " is not a finite 32-bit float (|lr| <= 3.4e38)");
  }
  if (FLAGS_wait_timeout_ms <= 0 || FLAGS_inproc_servers < 0 || FLAGS_inproc_workers < 0 ||
      FLAGS_eval_every < 0) {
    return InvalidArgumentError(
        "--wait_timeout_ms must be positive and --inproc_servers, --inproc_workers, "
        "--eval_every non-negative (got " +
        std::to_string(FLAGS_wait_timeout_ms) + ", " + std::to_string(FLAGS_inproc_servers) + ", " +
        std::to_string(FLAGS_inproc_workers) + ", " + std::to_string(FLAGS_eval_every) + ")");
  }
  RDMAPS_ASSIGN_OR_RETURN(
      const OptimizerOptions opt,
      TrainOptimizer(FLAGS_optimizer, static_cast<float>(FLAGS_lr), spec.hidden.empty()));
  if (FLAGS_output != "text" && FLAGS_output != "json") {
    return InvalidArgumentError("--output=" + FLAGS_output + " is unknown; use text or json");
  }
  if (FLAGS_slow_mode != "compute" && FLAGS_slow_mode != "wait") {
    return InvalidArgumentError("--slow_mode=" + FLAGS_slow_mode +
                                " is unknown; use compute or wait");
  }
  if ((FLAGS_checkpoint_every > 0 || FLAGS_resume) && FLAGS_checkpoint_dir.empty()) {
    return InvalidArgumentError("--checkpoint_every and --resume need --checkpoint_dir");
  }
  const bool softmax = spec.hidden.empty();
  if (FLAGS_epochs == 0) FLAGS_epochs = softmax ? 20 : 8;
  if (FLAGS_batch_size <= 0 || FLAGS_epochs <= 0 || FLAGS_slow_factor <= 0) {
    return InvalidArgumentError("--batch_size, --epochs and --slow_factor must be positive");
  }
  TrainOptions o;
  o.model = spec;
  o.batch_size = static_cast<std::size_t>(FLAGS_batch_size);
  o.epochs = FLAGS_epochs;
  o.seed = FLAGS_seed;
  o.eval_every_steps = static_cast<std::size_t>(FLAGS_eval_every);
  o.eval_limit = FLAGS_eval_limit;
  o.target_accuracy = FLAGS_target_accuracy;
  o.slow_mode = FLAGS_slow_mode == "wait" ? SlowMode::kWait : SlowMode::kCompute;
  o.max_recoveries = std::max(0, FLAGS_max_recoveries);

  RDMAPS_ASSIGN_OR_RETURN(const std::uint32_t staleness, ParseStaleness(FLAGS_staleness));
  const std::vector<TableOptions> tables = ModelTables(spec, opt, FLAGS_seed, staleness);
  if (FLAGS_print_tables) {
    std::cout << TablesToJson(tables) << std::endl;
    return Status::OK();
  }
  // A launcher (rdmaps-local, rdmaps-server -- CMD) asking for our tables.
  const Environment env = CurrentEnvironment();
  RDMAPS_ASSIGN_OR_RETURN(const bool described, DescribeTablesIfAsked(tables, env));
  if (described) return Status::OK();
  RDMAPS_ASSIGN_OR_RETURN(Dataset train, LoadFashionMnist(FLAGS_data_dir, Split::kTrain));
  RDMAPS_ASSIGN_OR_RETURN(Dataset test, LoadFashionMnist(FLAGS_data_dir, Split::kTest));
  Truncate(train, FLAGS_train_limit);
  Truncate(test, FLAGS_test_limit);
  std::function<void(const Progress&)> progress;

  if (FLAGS_local) {
    RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<LocalStore> store, LocalStore::Create(tables));
    if (FLAGS_slow_worker == 0) o.slow_factor = FLAGS_slow_factor;
    if (FLAGS_progress) progress = [](const Progress& p) { PrintProgress("", p); };
    RDMAPS_ASSIGN_OR_RETURN(TrainReport report, Train(o, train, test, *store, progress));
    PrintReports(o, {report}, "local");
    return Status::OK();
  }

  if (FLAGS_inproc_servers > 0 || FLAGS_inproc_workers > 0) {
    InProcessJob job;
    job.servers = std::max(1, FLAGS_inproc_servers);
    job.workers = std::max(1, FLAGS_inproc_workers);
    job.transport = FLAGS_transport.empty() ? "tcp" : FLAGS_transport;
    job.train = o;
    job.optimizer = opt;
    job.staleness = staleness;
    job.slow_worker = FLAGS_slow_worker;
    job.slow_factor = FLAGS_slow_factor;
    job.wait_timeout = std::chrono::milliseconds(FLAGS_wait_timeout_ms);
    job.checkpoint_dir = FLAGS_checkpoint_dir;
    job.checkpoint_every = FLAGS_checkpoint_every;
    job.resume = FLAGS_resume;
    std::function<void(int, const Progress&)> worker_progress;
    if (FLAGS_progress) {
      worker_progress = [](int w, const Progress& p) {
        if (w == 0) PrintProgress("[w0] ", p);
      };
    }
    RDMAPS_ASSIGN_OR_RETURN(std::vector<TrainReport> reports,
                            RunInProcessJob(job, train, test, worker_progress));
    o.num_workers = job.workers;
    PrintReports(o, reports, StalenessName(staleness));
    return Status::OK();
  }

  // Under a launcher (or the loopback default): our role from the layout.
  ClusterOptions lo;
  lo.default_role = Role::kWorker;
  lo.startup_timeout = std::chrono::milliseconds(FLAGS_wait_timeout_ms);
  RDMAPS_ASSIGN_OR_RETURN(ClusterLayout layout, ResolveCluster(lo, env));
  std::string transport = FLAGS_transport;
  if (transport.empty()) transport = layout.transport.empty() ? "auto" : layout.transport;
  if (layout.role == Role::kServer) {
    return Serve(lo, std::move(layout), transport, tables);
  }
  if (layout.role == Role::kEvaluator) {
    std::printf("%s: an evaluator is not part of the training cluster; nothing to do\n",
                layout.name().c_str());
    return Status::OK();
  }
  RDMAPS_ASSIGN_OR_RETURN(layout, CompleteCluster(std::move(layout), "", lo));
  if (layout.role == Role::kScheduler) return Status::OK();  // The rendezvous is done.
  LOG(INFO) << "worker " << layout.index << " of " << layout.num_workers << ", "
            << layout.num_servers << " servers, layout from " << layout.source;
  ClientOptions co = ClientOptions::FromCluster(layout);
  co.transport.transport = transport;
  co.tables = tables;
  co.staleness_override = staleness;
  // connect_timeout: the layout's start-up deadline (FromCluster).
  co.wait_timeout = std::chrono::milliseconds(FLAGS_wait_timeout_ms);
  RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<PsStore> store, PsStore::Connect(co, spec));
  o.worker_index = layout.index;
  o.num_workers = layout.num_workers;
  o.evaluate = layout.index == 0;
  if (FLAGS_slow_worker == o.worker_index) o.slow_factor = FLAGS_slow_factor;
  const std::string who = "[w" + std::to_string(o.worker_index) + "] ";
  if (FLAGS_progress) progress = [who](const Progress& p) { PrintProgress(who, p); };
  Result<TrainReport> report = Train(o, train, test, *store, progress);
  // Report before saying goodbye: once every worker has closed, the servers
  // exit and a launcher may stop whatever is still running.
  if (report.ok()) PrintReports(o, {*report}, StalenessName(staleness));
  std::fflush(stdout);
  const Status closed = store->Close();
  RDMAPS_RETURN_IF_ERROR(report.status());
  RDMAPS_RETURN_IF_ERROR(closed);
  return Status::OK();
}

}  // namespace
}  // namespace rdmaps::train

int main(int argc, char** argv) {
  gflags::SetUsageMessage("data-parallel Fashion-MNIST training through rdmaps");
  rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // Exit 2 for a configuration error, 1 for any other (tools/common/exit.h).
  return rdmaps::tools::GuardedMain("rdmaps-train", [] {
    return rdmaps::tools::ReportStatus("rdmaps-train", rdmaps::train::Run());
  });
}

// cluster_test_worker: the worker program of the launch tests. It finds its
// layout like any rdmaps worker (rdmaps-local's RDMAPS_*, TF_CONFIG, mpirun's
// ranks, ...), pushes +1 to every element of table "sum" in each of
// --iterations BSP iterations, and at the end checks that every element
// equals num_workers * iterations: no push lost or applied twice, whatever
// launched it. Exit 0 when the sum is right, 1 when it is not or on any
// error (printed).
//
// Fault knob: --die_at=N --die_worker=W: worker W kills itself with SIGKILL
// after iteration N (a crashed worker).
//
// Drill gates: --pause_at=N[,M...] --gate_dir=D: before iteration N the
// worker waits (at most --timeout_ms) until the file D/resume-N exists, so
// a drill can do something (kill a server, wait for a state) while the job
// is known to be unfinished, and then let it go on.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/cluster.h"
#include "rdmaps/tables_json.h"

DEFINE_int32(iterations, 5, "BSP iterations");
DEFINE_uint64(rows, 10, "rows of table \"sum\"");
DEFINE_uint32(dim, 4, "floats per row");
DEFINE_int32(die_at, -1, "SIGKILL this process after this iteration (-1: never)");
DEFINE_int32(die_worker, 0, "which worker --die_at and --stop_at apply to");
DEFINE_int32(stop_at, -1, "SIGSTOP this process after this iteration (-1: never): a hung peer");
DEFINE_int32(timeout_ms, 20000, "start-up, connect and wait deadlines");
DEFINE_int32(num_servers, 0, "rank-based launchers: the first N ranks serve");
DEFINE_string(rendezvous, "", "rank-based launchers: HOST:PORT or file:PATH");
DEFINE_string(pause_at, "", "drill gates: iterations (comma-separated) to wait before");
DEFINE_string(gate_dir, "", "drill gates: wait before iteration N until GATE_DIR/resume-N exists");

namespace {

int Fail(const rdmaps::Status& s, const char* what) {
  std::printf("FAILED %s: %s\n", what, s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

std::vector<int> PauseIterations() {
  std::vector<int> out;
  std::stringstream in(FLAGS_pause_at);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(std::atoi(item.c_str()));
  }
  return out;
}

// A drill gate: until GATE_DIR/resume-<it> exists, at most --timeout_ms.
rdmaps::Status WaitAtGate(int it) {
  const std::string path = FLAGS_gate_dir + "/resume-" + std::to_string(it);
  std::printf("paused before iteration %d\n", it);
  std::fflush(stdout);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(FLAGS_timeout_ms);
  while (access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return rdmaps::TimedOutError("no " + path + " within --timeout_ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return rdmaps::Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  // With TZ unset glibc re-reads the zone (and frees/strdups its name) on
  // every localtime call glog makes per log line; naming the system zone
  // once makes that a no-op (and keeps TSan from flagging glibc's
  // internally locked tzset). Before any thread starts.
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  using namespace rdmaps;

  TableOptions sum;
  sum.id = 0;
  sum.name = "sum";
  sum.rows = FLAGS_rows;
  sum.dim = FLAGS_dim;
  sum.optimizer = OptimizerOptions::Sgd(1.0f);  // w -= 1 * (-1)
  sum.staleness = kBsp;
  const std::vector<TableOptions> tables = {sum};

  Environment env = CurrentEnvironment();
  auto described = DescribeTablesIfAsked(tables, env);
  if (!described.ok()) return Fail(described.status(), "describing tables");
  if (*described) return 0;

  ClusterOptions lo;
  lo.num_servers = FLAGS_num_servers;
  lo.rendezvous = FLAGS_rendezvous;
  lo.startup_timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  auto layout = ResolveWorkerCluster(lo, env);
  if (!layout.ok()) return Fail(layout.status(), "resolving the layout");
  if (layout->role != Role::kWorker) {
    return Fail(InvalidArgumentError("resolved to " + layout->name()), "layout");
  }

  ClientOptions co = ClientOptions::FromCluster(*layout);  // tcp unless the layout says
  co.tables = tables;
  co.wait_timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  auto client = Client::Connect(co);
  if (!client.ok()) return Fail(client.status(), "connecting");
  std::printf("%s connected to %zu servers (layout from %s)\n", layout->name().c_str(),
              layout->servers.size(), layout->source.c_str());
  std::fflush(stdout);

  const std::size_t n = FLAGS_rows * FLAGS_dim;
  std::vector<float> grads(n, -1.0f), out(n, 0.0f);
  const std::vector<int> pauses = PauseIterations();
  for (int it = 0; it < FLAGS_iterations; ++it) {
    if (std::find(pauses.begin(), pauses.end(), it) != pauses.end()) {
      if (Status g = WaitAtGate(it); !g.ok()) return Fail(g, "drill gate");
    }
    Status s = (*client)->Push(0, RowRange{0, FLAGS_rows}, grads);
    if (!s.ok()) return Fail(s, "push");
    auto c = (*client)->Clock();
    if (!c.ok()) return Fail(c.status(), "clock");
    // A BSP pull at every iteration keeps the workers in lock step.
    s = (*client)->Pull(0, RowRange{0, FLAGS_rows}, out);
    if (!s.ok()) return Fail(s, "pull");
    std::printf("iteration %d done\n", it);
    std::fflush(stdout);
    if (it == FLAGS_die_at && layout->index == FLAGS_die_worker) {
      std::printf("dying now (--die_at)\n");
      std::fflush(stdout);
      raise(SIGKILL);
    }
    if (it == FLAGS_stop_at && layout->index == FLAGS_die_worker) {
      std::printf("stopping now (--stop_at)\n");
      std::fflush(stdout);
      raise(SIGSTOP);
    }
  }
  const float want = static_cast<float>(layout->num_workers * FLAGS_iterations);
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i] != want) {
      std::printf("FAILED sum check: element %zu is %g, want %g\n", i, out[i], want);
      return 1;
    }
  }
  Status closed = (*client)->Close();
  if (!closed.ok()) return Fail(closed, "close");
  std::printf("%s: sum ok (%g = %d workers x %d iterations)\n", layout->name().c_str(), want,
              layout->num_workers, FLAGS_iterations);
  return 0;
}

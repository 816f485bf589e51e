// A downstream program, built against the installed package with the public
// headers only: one server and one worker in this process over tcp loopback,
// options made from the cluster layout in one call. It never touches glog, so
// the library must stay quiet on stderr (run_downstream.cmake checks: no
// "Logging before InitGoogleLogging", no INFO line, in fact nothing at all);
// then a log sink must receive the library's INFO lines once asked for.
#include <rdmaps/client.h>
#include <rdmaps/cluster.h>
#include <rdmaps/log.h>
#include <rdmaps/server.h>
#include <rdmaps/status.h>
#include <rdmaps/version.h>

#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

int Fail(const rdmaps::Status& s, const char* what) {
  std::cout << "FAILED " << what << ": " << s << "\n";
  return 1;
}

// Resolves the worker's layout from explicit options, as a launcher-less
// program would, and connects with the options the layout decides.
// The job secret both sides prove they know (one process: generated here).
const std::string& JobSecret() {
  static const std::string secret = rdmaps::GenerateJobSecret();
  return secret;
}

rdmaps::Result<std::unique_ptr<rdmaps::Client>> ConnectWorker(const std::string& server) {
  rdmaps::ClusterOptions cluster;
  cluster.job_token = JobSecret();
  cluster.role = "worker";
  cluster.task_index = 0;
  cluster.ps_hosts = server;
  cluster.num_workers = 1;
  RDMAPS_ASSIGN_OR_RETURN(rdmaps::ClusterLayout layout,
                          rdmaps::ResolveWorkerCluster(cluster, rdmaps::CurrentEnvironment()));
  return rdmaps::Client::Connect(rdmaps::ClientOptions::FromCluster(layout));
}

}  // namespace

int main() {
  using namespace rdmaps;
  ClusterOptions cluster;
  cluster.job_token = JobSecret();
  cluster.role = "ps";
  cluster.task_index = 0;
  cluster.ps_hosts = "127.0.0.1:0";
  cluster.num_workers = 1;
  auto layout = ResolveCluster(cluster, CurrentEnvironment());
  if (!layout.ok()) return Fail(layout.status(), "resolving the server's layout");
  ServerOptions so = ServerOptions::FromCluster(*layout);
  TableOptions sum;
  sum.name = "sum";
  sum.rows = 8;
  sum.dim = 4;
  sum.optimizer = OptimizerOptions::Sgd(1.0f);
  sum.staleness = kBsp;
  so.tables = {sum};
  so.exit_when_workers_done = false;
  auto server = Server::Start(so);
  if (!server.ok()) return Fail(server.status(), "starting the server");
  std::thread serve([&] { (void)(*server)->Run(); });

  // Quiet: connect, push, pull with the default logging.
  int rc = 0;
  {
    auto client = ConnectWorker((*server)->address());
    if (!client.ok()) return Fail(client.status(), "connecting");
    std::vector<float> grads(8 * 4, -1.0f), out(8 * 4, 0.0f);
    Status s = (*client)->Push(0, RowRange{0, 8}, grads);
    if (s.ok()) s = (*client)->Clock().status();
    if (s.ok()) s = (*client)->Pull(0, RowRange{0, 8}, out);
    if (!s.ok()) return Fail(s, "push, clock, pull");
    for (float v : out) {
      if (v != 1.0f) rc = Fail(InternalError("pulled " + std::to_string(v)), "checking");
    }
    if (Status c = (*client)->Close(); !c.ok()) return Fail(c, "closing");
  }

  // Routed: with a sink that asks for INFO, resolving a layout and starting
  // a second server log what they decided.
  std::mutex mu;
  std::vector<std::string> lines;
  SetMinLogSeverity(LogSeverity::kInfo);
  SetLogSink([&](LogSeverity severity, std::string_view file, int line, std::string_view message) {
    std::lock_guard<std::mutex> lock(mu);
    lines.push_back(std::string(LogSeverityName(severity)) + " " + std::string(file) + ":" +
                    std::to_string(line) + " " + std::string(message));
  });
  auto relayout = ResolveCluster(cluster, CurrentEnvironment());
  if (!relayout.ok()) return Fail(relayout.status(), "resolving again");
  auto second = Server::Start(so);
  if (!second.ok()) return Fail(second.status(), "starting a second server");
  (*second)->Stop();
  SetLogSink(nullptr);
  SetMinLogSeverity(LogSeverity::kWarning);
  int info_lines = 0;
  for (const std::string& l : lines) {
    std::cout << "sink: " << l << "\n";
    if (l.starts_with("INFO ") && (l.find("rdmaps layout: using options") != l.npos ||
                                   l.find("ps server 0/1 listening on") != l.npos)) {
      ++info_lines;
    }
  }
  if (info_lines != 2) rc = Fail(InternalError("missing INFO lines"), "the log sink");

  (*server)->Stop();
  serve.join();
  std::cout << "rdmaps " << Version() << "\n";
  return rc;
}

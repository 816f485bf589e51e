#include "tools/train/inproc_job.h"

#include <glog/logging.h>

#include <memory>
#include <mutex>
#include <thread>

#include "rdmaps/client.h"
#include "rdmaps/cluster.h"
#include "rdmaps/server.h"
#include "tools/train/ps_store.h"
#include "tools/train/tables.h"

namespace rdmaps::train {

Result<std::vector<TrainReport>> RunInProcessJob(
    const InProcessJob& job, const Dataset& train, const Dataset& test,
    const std::function<void(int worker, const Progress&)>& on_progress) {
  if (job.servers < 1 || job.workers < 1) {
    return InvalidArgumentError("an in-process job needs at least one server and one worker");
  }
  const std::vector<TableOptions> tables =
      ModelTables(job.train.model, job.optimizer, job.train.seed, job.staleness);
  // Its servers listen on real ports: a fresh secret keeps other users out.
  const std::string token = GenerateJobSecret();

  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < job.servers; ++i) {
    ServerOptions so;
    so.transport.transport = job.transport;
    so.transport.job_token = token;
    so.listen_address =
        job.transport == "fake" ? "train-inproc-ps" + std::to_string(i) + ":0" : "127.0.0.1:0";
    so.server_index = static_cast<std::uint32_t>(i);
    so.num_servers = static_cast<std::uint32_t>(job.servers);
    so.num_workers = static_cast<std::uint32_t>(job.workers);
    so.tables = tables;
    so.apply_threads = 1;  // Servers and workers share the machine's cores.
    so.checkpoint_dir = job.checkpoint_dir;
    so.checkpoint_every = job.checkpoint_every;
    if (job.resume) so.restore = "latest";
    RDMAPS_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::Start(so));
    addresses.push_back(server->address());
    servers.push_back(std::move(server));
  }

  std::vector<TrainReport> reports(static_cast<std::size_t>(job.workers));
  std::vector<Status> statuses(static_cast<std::size_t>(job.workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < job.workers; ++w) {
    threads.emplace_back([&, w] {
      const auto wi = static_cast<std::size_t>(w);
      ClientOptions co;
      co.transport.transport = job.transport;
      co.transport.job_token = token;
      co.worker_id = static_cast<std::uint32_t>(w);
      co.num_workers = static_cast<std::uint32_t>(job.workers);
      co.servers = addresses;
      co.tables = tables;
      co.staleness_override = job.staleness;
      co.connect_timeout = job.wait_timeout;
      co.wait_timeout = job.wait_timeout;
      Result<std::unique_ptr<PsStore>> store = PsStore::Connect(co, job.train.model);
      if (!store.ok()) {
        statuses[wi] = store.status().WithContext("worker " + std::to_string(w));
        return;
      }
      TrainOptions o = job.train;
      o.worker_index = w;
      o.num_workers = job.workers;
      o.slow_factor = w == job.slow_worker ? job.slow_factor : 1;
      o.evaluate = job.train.evaluate && (w == 0 || job.evaluate_on_every_worker);
      std::function<void(const Progress&)> progress;
      if (on_progress) progress = [&, w](const Progress& p) { on_progress(w, p); };
      Result<TrainReport> r = Train(o, train, test, **store, progress);
      // Close (goodbye) either way, so that nobody waits for this worker.
      const Status closed = (*store)->Close();
      if (!r.ok()) {
        statuses[wi] = r.status().WithContext("worker " + std::to_string(w));
        return;
      }
      reports[wi] = std::move(*r);
      if (!closed.ok()) statuses[wi] = closed.WithContext("worker " + std::to_string(w));
    });
  }
  for (std::thread& t : threads) t.join();
  for (auto& s : servers) s->Stop();
  for (const Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return reports;
}

}  // namespace rdmaps::train

// An in-process replicated cluster for ps tests: per shard a backup, then its
// primary, both deciding through one embedded failover decider, and workers
// that follow it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/failover.h"
#include "rdmaps/server.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {

struct ReplicatedCluster {
  std::string transport;
  std::shared_ptr<FailoverDecider> decider = NewEmbeddedFailoverDecider();
  std::vector<std::unique_ptr<Server>> primaries, backups;
  std::vector<std::string> addresses;  // the primaries' at start
  std::vector<std::unique_ptr<Client>> clients;
  // Each worker op's timeout (ClientOptions::wait_timeout).
  std::chrono::milliseconds wait_timeout = std::chrono::seconds(20);

  // Worker w of W, following this cluster's decider.
  ClientOptions WorkerOptions(std::uint32_t w, std::uint32_t W) const {
    ClientOptions o = MakeClientOptions(transport, w, W, addresses);
    o.failover = decider;
    o.wait_timeout = wait_timeout;
    return o;
  }

  // S shards for W workers: per shard a backup, then its primary. `edit`,
  // when given, changes each server's options (of both roles) before it
  // starts. Fatal gtest failures on error (check HasFatalFailure()).
  void StartShards(std::uint32_t S, std::uint32_t W, const std::vector<TableOptions>& tables,
                   const std::function<void(ServerOptions&)>& edit = nullptr) {
    for (std::uint32_t i = 0; i < S; ++i) {
      ServerOptions b = Options(i, S, W, tables, edit);
      b.replica_role = ReplicaRole::kBackup;
      auto backup = Server::Start(b);
      ASSERT_TRUE(backup.ok()) << backup.status();
      ServerOptions p = Options(i, S, W, tables, edit);
      p.backup_address = (*backup)->address();
      auto primary = Server::Start(p);
      ASSERT_TRUE(primary.ok()) << primary.status();
      addresses.push_back((*primary)->address());
      backups.push_back(std::move(backup).value());
      primaries.push_back(std::move(primary).value());
    }
  }

  // Connects workers [clients.size(), clients.size() + n) of W; `edit`
  // changes each one's options.
  void ConnectWorkers(std::uint32_t n, std::uint32_t W,
                      const std::function<void(ClientOptions&)>& edit = nullptr) {
    const auto first = static_cast<std::uint32_t>(clients.size());
    for (std::uint32_t w = first; w < first + n; ++w) {
      ClientOptions o = WorkerOptions(w, W);
      if (edit) edit(o);
      auto cl = Client::Connect(o);
      ASSERT_TRUE(cl.ok()) << cl.status();
      clients.push_back(std::move(cl).value());
    }
  }

 private:
  ServerOptions Options(std::uint32_t i, std::uint32_t S, std::uint32_t W,
                        const std::vector<TableOptions>& tables,
                        const std::function<void(ServerOptions&)>& edit) const {
    ServerOptions o = MakeServerOptions(transport, i, S, W, tables);
    o.replicas = 2;
    o.failover = decider;
    o.exit_when_workers_done = false;
    if (edit) edit(o);
    return o;
  }
};

}  // namespace rdmaps::testing

// Starts a small in-process cluster (servers + clients) for ps tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/server.h"
#include "tests/vm/verbs_test_env.h"

namespace rdmaps::testing {

// A fresh directory /tmp/NAME-XXXXXX, removed with all it holds when the
// scope ends (a failed ASSERT included). path is empty, and the test has
// failed, when it could not be made.
struct ScopedTempDir {
  std::string path;
  explicit ScopedTempDir(const std::string& name = "rdmaps-test") {
    std::string tmpl = "/tmp/" + name + "-XXXXXX";
    const char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl;
    if (p) path = p;
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
};

struct Cluster {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::string> addresses;
};

// Push slots the cluster's servers applied, summed.
inline std::uint64_t PushesApplied(const Cluster& c) {
  std::uint64_t n = 0;
  for (const auto& s : c.servers) n += s->stats().pushes_applied;
  return n;
}

// Where servers listen. fake: a name, "fake:0" picks a fresh one; verbs: the
// RDMA device's address (RDMAPS_TEST_VERBS_ADDR, which the VM harness
// exports, else the first ACTIVE device's IPv4 address; tests skip where
// there is none).
inline std::string ListenAddress(const std::string& transport) {
  if (transport == "fake") return "fake:0";
  if (transport == "verbs") {
    const std::string a = VerbsTestAddress(nullptr);
    return (a.empty() ? std::string("127.0.0.1") : a) + ":0";
  }
  return "127.0.0.1:0";
}

inline ServerOptions MakeServerOptions(const std::string& transport, std::uint32_t index,
                                       std::uint32_t num_servers, std::uint32_t num_workers,
                                       const std::vector<TableOptions>& tables) {
  ServerOptions o;
  o.transport.transport = transport;
  o.transport.job_token = "ps-test";
  o.listen_address = ListenAddress(transport);
  o.server_index = index;
  o.num_servers = num_servers;
  o.num_workers = num_workers;
  o.tables = tables;
  o.push_slots = 8;
  o.push_slot_bytes = 16 * 1024;
  o.apply_threads = 1;
  return o;
}

inline ClientOptions MakeClientOptions(const std::string& transport, std::uint32_t worker,
                                       std::uint32_t num_workers,
                                       const std::vector<std::string>& addresses) {
  ClientOptions o;
  o.transport.transport = transport;
  o.transport.job_token = "ps-test";
  o.worker_id = worker;
  o.num_workers = num_workers;
  o.servers = addresses;
  // rxe inside an emulated VM sets up connections slowly.
  o.connect_timeout = std::chrono::seconds(transport == "verbs" ? 60 : 10);
  o.wait_timeout = std::chrono::seconds(20);
  o.staging_bytes = 64 * 1024;
  return o;
}

// Servers first, then clients (Connect needs the servers listening).
inline Cluster StartCluster(const std::string& transport, std::uint32_t num_servers,
                            std::uint32_t num_workers, const std::vector<TableOptions>& tables,
                            std::uint32_t push_slots = 8,
                            std::function<void(ClientOptions&)> tweak = nullptr) {
  Cluster c;
  for (std::uint32_t i = 0; i < num_servers; ++i) {
    auto o = MakeServerOptions(transport, i, num_servers, num_workers, tables);
    o.push_slots = push_slots;
    auto s = Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return c;
    c.addresses.push_back((*s)->address());
    c.servers.push_back(std::move(s).value());
  }
  for (std::uint32_t w = 0; w < num_workers; ++w) {
    auto co = MakeClientOptions(transport, w, num_workers, c.addresses);
    if (tweak) tweak(co);
    auto cl = Client::Connect(co);
    EXPECT_TRUE(cl.ok()) << cl.status();
    if (!cl.ok()) return c;
    c.clients.push_back(std::move(cl).value());
  }
  return c;
}

inline TableOptions MakeTable(std::uint32_t id, const std::string& name, std::uint64_t rows,
                              std::uint32_t dim, std::uint32_t staleness = kAsp,
                              Initializer init = Initializer::Zeros(),
                              OptimizerOptions opt = OptimizerOptions::Sgd(1.0f)) {
  TableOptions t;
  t.id = id;
  t.name = name;
  t.rows = rows;
  t.dim = dim;
  t.layout = RowLayout::kDense;  // the tests written for dense rows stay dense
  t.staleness = staleness;
  t.init = init;
  t.optimizer = opt;
  return t;
}

// MakeTable with RowLayout::kInline.
inline TableOptions InlineTable(std::uint32_t id, const std::string& name, std::uint64_t rows,
                                std::uint32_t dim, Initializer init = Initializer::Zeros()) {
  TableOptions t = MakeTable(id, name, rows, dim, kAsp, init);
  t.layout = RowLayout::kInline;
  return t;
}

}  // namespace rdmaps::testing

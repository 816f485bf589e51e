// ServerOptions / ClientOptions::FromCluster: what a resolved layout decides
// reaches the options, and nothing else changes.
#include "rdmaps/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdmaps/cluster.h"

namespace rdmaps {
namespace {

using ::testing::ElementsAre;

Environment RdmapsLocalEnv(const char* role, const char* index) {
  return {{"RDMAPS_ROLE", role},
          {"RDMAPS_TASK_INDEX", index},
          {"RDMAPS_PS_HOSTS", "127.0.0.1:4001,127.0.0.1:4002"},
          {"RDMAPS_NUM_WORKERS", "3"},
          {"RDMAPS_TRANSPORT", "fake"},
          {"RDMAPS_JOB_TOKEN", "secret"}};
}

TEST(OptionsFromClusterTest, ClientTakesTheWorkersPlaceInTheLayout) {
  auto layout = ResolveWorkerCluster({}, RdmapsLocalEnv("worker", "2"));
  ASSERT_TRUE(layout.ok()) << layout.status();
  const ClientOptions o = ClientOptions::FromCluster(*layout);
  EXPECT_EQ(o.transport.transport, "fake");
  EXPECT_EQ(o.transport.job_token, "secret");
  EXPECT_EQ(o.worker_id, 2u);
  EXPECT_EQ(o.num_workers, 3u);
  EXPECT_THAT(o.servers, ElementsAre("127.0.0.1:4001", "127.0.0.1:4002"));
  const ClientOptions defaults;
  EXPECT_TRUE(o.tables.empty());
  // A worker waits for its servers as long as the job's start-up lasts.
  EXPECT_EQ(o.connect_timeout, ClusterOptions{}.startup_timeout);
  EXPECT_EQ(o.wait_timeout, defaults.wait_timeout);
  EXPECT_EQ(o.staging_bytes, defaults.staging_bytes);
  EXPECT_EQ(o.transport.op_timeout, defaults.transport.op_timeout);
}

TEST(OptionsFromClusterTest, ServerTakesItsIndexAndListenAddress) {
  auto layout = ResolveCluster({}, RdmapsLocalEnv("ps", "1"));
  ASSERT_TRUE(layout.ok()) << layout.status();
  const ServerOptions o = ServerOptions::FromCluster(*layout);
  EXPECT_EQ(o.transport.transport, "fake");
  EXPECT_EQ(o.transport.job_token, "secret");
  EXPECT_EQ(o.listen_address, "127.0.0.1:4002");
  EXPECT_EQ(o.server_index, 1u);
  EXPECT_EQ(o.num_servers, 2u);
  EXPECT_EQ(o.num_workers, 3u);
  const ServerOptions defaults;
  EXPECT_TRUE(o.tables.empty());
  EXPECT_EQ(o.push_slots, defaults.push_slots);
  EXPECT_EQ(o.push_slot_bytes, defaults.push_slot_bytes);
}

TEST(OptionsFromClusterTest, ALayoutWithoutTransportKeepsTheDefault) {
  Environment env = RdmapsLocalEnv("worker", "0");
  env.erase("RDMAPS_TRANSPORT");
  auto layout = ResolveWorkerCluster({}, env);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(ClientOptions::FromCluster(*layout).transport.transport, TransportOptions{}.transport);
}

TEST(OptionsFromClusterTest, UnassignedServerIndexStaysZero) {
  ClusterLayout layout;
  layout.role = Role::kServer;
  layout.index = -1;  // ps-lite, before the scheduler assigns it
  layout.num_servers = 2;
  layout.num_workers = 1;
  EXPECT_EQ(ServerOptions::FromCluster(layout).server_index, 0u);
  EXPECT_EQ(ServerOptions::FromCluster(layout).listen_address, ServerOptions{}.listen_address);
}

}  // namespace
}  // namespace rdmaps

// Which coordinator a process uses: explicit options win, else
// RDMAPS_COORDINATOR and friends; the default prefix follows the launcher's
// job (the same in every rank, different between jobs); ResolveCluster
// carries it in the layout.
#include <gtest/gtest.h>

#include "rdmaps/cluster.h"
#include "src/cluster/coordinator.h"

namespace rdmaps::internal {
namespace {

TEST(CoordinatorConfigTest, EnvironmentNamesTheCoordinator) {
  Environment env{{"RDMAPS_COORDINATOR", "etcd://10.0.0.5:2379"},
                  {"RDMAPS_ETCD_USER", "rdmaps"},
                  {"RDMAPS_ETCD_PASSWORD_FILE", "/run/pw"}};
  auto c = ResolveCoordinator({}, env, "Slurm-job 1234 step 0");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address, "etcd://10.0.0.5:2379");
  EXPECT_EQ(c->job_prefix, "rdmaps/Slurm-job-1234-step-0/");
  EXPECT_EQ(c->etcd_user, "rdmaps");
  EXPECT_EQ(c->etcd_password_file, "/run/pw");
  auto no_launcher = ResolveCoordinator({}, env, "");
  EXPECT_EQ(no_launcher->job_prefix, "rdmaps/job/");
  env["RDMAPS_COORDINATOR_PREFIX"] = "team-a/run-7/";
  EXPECT_EQ(ResolveCoordinator({}, env, "x")->job_prefix, "team-a/run-7/");
  env["RDMAPS_COORDINATOR_PREFIX"] = "bad prefix";
  EXPECT_EQ(ResolveCoordinator({}, env, "x").status().code(), StatusCode::kInvalidArgument);
}

TEST(CoordinatorConfigTest, ExplicitOptionsWinAndNoneIsEmpty) {
  CoordinatorConfig mine;
  mine.address = "memory:test";
  Environment env{{"RDMAPS_COORDINATOR", "etcd://h:1"}};
  EXPECT_EQ(ResolveCoordinator(mine, env, "")->address, "memory:test");
  EXPECT_EQ(ResolveCoordinator({}, {}, "")->address, "");
}

TEST(CoordinatorConfigTest, ResolveClusterCarriesIt) {
  Environment env{{"RDMAPS_ROLE", "ps"},
                  {"RDMAPS_TASK_INDEX", "0"},
                  {"RDMAPS_PS_HOSTS", "127.0.0.1:7000"},
                  {"RDMAPS_NUM_WORKERS", "1"},
                  {"RDMAPS_INSECURE", "1"},
                  {"RDMAPS_COORDINATOR", "dir:/tmp/x/coord"},
                  {"RDMAPS_COORDINATOR_PREFIX", "rdmaps/local/"}};
  auto layout = ResolveCluster({}, env);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->coordinator.address, "dir:/tmp/x/coord");
  EXPECT_EQ(layout->coordinator.job_prefix, "rdmaps/local/");
  EXPECT_NE(layout->ToString().find("coordinator: dir:/tmp/x/coord"), std::string::npos);
  env.erase("RDMAPS_COORDINATOR");
  EXPECT_EQ(ResolveCluster({}, env)->coordinator.address, "");
}

}  // namespace
}  // namespace rdmaps::internal

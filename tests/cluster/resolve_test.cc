// The layout resolver: every source, its precedence, Slurm node lists, and
// every malformed case (each must be InvalidArgument quoting the culprit).
#include "src/cluster/resolve.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace rdmaps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void ExpectInvalid(const Result<ClusterLayout>& r, const std::string& quoted) {
  ASSERT_FALSE(r.ok()) << r->ToString();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(quoted));
}

// --- Slurm node lists -----------------------------------------------------

TEST(SlurmNodeListTest, ExpandsRangesListsAndKeepsZeroPadding) {
  auto r = internal::ExpandSlurmNodeList("node[01-03,7],gpu5");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, ElementsAre("node01", "node02", "node03", "node7", "gpu5"));
}

TEST(SlurmNodeListTest, PlainNamesAndPaddingAcrossWidths) {
  EXPECT_THAT(*internal::ExpandSlurmNodeList("a,b"), ElementsAre("a", "b"));
  EXPECT_THAT(*internal::ExpandSlurmNodeList("n[098-101]"),
              ElementsAre("n098", "n099", "n100", "n101"));
  EXPECT_THAT(*internal::ExpandSlurmNodeList("n[9-10]"), ElementsAre("n9", "n10"));
}

// A product past the limit is refused before any name is built (the fuzzer
// found one of many groups that took seconds to reach the limit name by
// name); one exactly at the limit still expands.
TEST(SlurmNodeListTest, AProductPastTheLimitIsRefusedUpFront) {
  auto r = internal::ExpandSlurmNodeList(
      "node[02-20](gp)node[02-20](gp)node[02-20](gp)node[02-20](gp)node[02-20](gp)node[02-20]");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("expands to more than 65536 nodes"));
  auto many = internal::ExpandSlurmNodeList("a[0-255]b[0-255]");
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->size(), internal::kMaxSlurmNodes);
  EXPECT_FALSE(internal::ExpandSlurmNodeList("a[0-255]b[0-255],c").ok());
}

TEST(SlurmNodeListTest, SeveralBracketGroupsExpandAsAProduct) {
  EXPECT_THAT(*internal::ExpandSlurmNodeList("r[1-2]n[1,3]"),
              ElementsAre("r1n1", "r1n3", "r2n1", "r2n3"));
  EXPECT_THAT(*internal::ExpandSlurmNodeList("rack[1-2]-gpu"),
              ElementsAre("rack1-gpu", "rack2-gpu"));
}

TEST(SlurmNodeListTest, MalformedListsAreRejectedQuotingThePart) {
  struct Case {
    const char* list;
    const char* quoted;
  } cases[] = {
      {"node[01-03", "unmatched '['"}, {"node01]", "unbalanced"},
      {"node[3-1]", "'3-1' runs backwards"}, {"node[a-b]", "'a-b'"},
      {"node[]", "empty brackets"},        {"a,,b", "empty name"},
      {"", "empty"},                       {"n[1-2,]", "''"},
      {"n[[1]]", "unbalanced"},
  };
  for (const auto& c : cases) {
    auto r = internal::ExpandSlurmNodeList(c.list);
    ASSERT_FALSE(r.ok()) << c.list;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.list;
    EXPECT_THAT(r.status().message(), HasSubstr(c.quoted)) << c.list;
  }
}

// --- host:port ----------------------------------------------------------

// host:port itself (the cases that were here): tests/base/host_port_test.cc.
TEST(HostListTest, RejectsEmptyEntries) {
  auto list = internal::ParseHostList("a:1,,b:2", "--ps_hosts");
  ASSERT_FALSE(list.ok());
  EXPECT_THAT(list.status().message(), HasSubstr("empty entry"));
}

// --- Source 1: explicit options ------------------------------------------

TEST(ExplicitLayoutTest, FlagsGiveTheWholeLayout) {
  ClusterOptions o;
  o.role = "ps";
  o.task_index = 1;
  o.ps_hosts = "h1:7000,h2:7000";
  o.worker_hosts = "w1:0,w2:0,w3:0";
  auto r = ResolveCluster(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "options");
  EXPECT_EQ(r->role, Role::kServer);
  EXPECT_EQ(r->index, 1);
  EXPECT_THAT(r->servers, ElementsAre("h1:7000", "h2:7000"));
  EXPECT_EQ(r->num_workers, 3);
  EXPECT_EQ(r->listen_address, "h2:7000");
  EXPECT_FALSE(r->needs_rendezvous);
  EXPECT_EQ(r->name(), "ps1");
}

TEST(ExplicitLayoutTest, WorkerCountInsteadOfAddresses) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 2;
  o.ps_hosts = "h1:7000";
  o.num_workers = 3;
  auto r = ResolveCluster(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->role, Role::kWorker);
  EXPECT_EQ(r->num_workers, 3);
  EXPECT_TRUE(r->workers.empty());
}

TEST(ExplicitLayoutTest, WinsOverEverySourceInTheEnvironment) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 0;
  o.ps_hosts = "h1:7000";
  o.num_workers = 1;
  Environment env = {{"TF_CONFIG", "not even json"},
                     {"RDMAPS_ROLE", "ps"},
                     {"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "2"}};
  auto r = ResolveCluster(o, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "options");
}

TEST(ExplicitLayoutTest, MalformedCases) {
  ClusterOptions base;
  base.role = "ps";
  base.task_index = 0;
  base.ps_hosts = "h1:7000,h2:7000";
  base.num_workers = 2;

  {
    auto o = base;
    o.task_index = 2;
    ExpectInvalid(ResolveCluster(o, {}), "ps task index 2 is out of range");
  }
  {
    auto o = base;
    o.role = "worker";
    o.task_index = 5;
    ExpectInvalid(ResolveCluster(o, {}), "worker task index 5 is out of range");
  }
  {
    auto o = base;
    o.ps_hosts = "h1:7000,h1:7000";
    ExpectInvalid(ResolveCluster(o, {}), "duplicate address 'h1:7000'");
  }
  {
    auto o = base;
    o.worker_hosts = "w:1,w:2,w:3";
    ExpectInvalid(ResolveCluster(o, {}), "3 worker addresses but num_workers=2");
  }
  {
    auto o = base;
    o.num_servers = 3;
    ExpectInvalid(ResolveCluster(o, {}), "counts disagree: 2 ps addresses");
  }
  {
    auto o = base;
    o.role = "janitor";
    ExpectInvalid(ResolveCluster(o, {}), "unknown role 'janitor'");
  }
  {
    auto o = base;
    o.task_index = -1;
    ExpectInvalid(ResolveCluster(o, {}), "needs --role and --task_index");
  }
  {
    auto o = base;
    o.ps_hosts = "";
    ExpectInvalid(ResolveCluster(o, {}), "needs --ps_hosts");
  }
  {
    auto o = base;
    o.ps_hosts = "h1:7000,h2";
    ExpectInvalid(ResolveCluster(o, {}), "'h2' has no port");
  }
  {
    auto o = base;
    o.num_workers = 0;
    ExpectInvalid(ResolveCluster(o, {}), "no workers");
  }
}

class ClusterSpecFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    path_ = ::testing::TempDir() + "cluster_spec_" + std::to_string(getpid()) + ".json";
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
};

TEST_F(ClusterSpecFileTest, ReadsTensorFlowClusterSpec) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 1;
  o.cluster_spec = Write(R"({"ps": ["a:1", "b:1"], "worker": ["c:0", "d:0"]})");
  auto r = ResolveCluster(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "cluster_spec");
  EXPECT_THAT(r->servers, ElementsAre("a:1", "b:1"));
  EXPECT_EQ(r->num_workers, 2);
  EXPECT_EQ(r->index, 1);
}

TEST_F(ClusterSpecFileTest, BadJsonIsQuoted) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 0;
  o.cluster_spec = Write(R"({"ps": ["a:1",)");
  ExpectInvalid(ResolveCluster(o, {}), "is not valid JSON: '{\"ps\": [\"a:1\",'");
}

TEST_F(ClusterSpecFileTest, WrongTypesAreQuoted) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 0;
  o.cluster_spec = Write(R"({"ps": "a:1", "worker": ["c:0"]})");
  ExpectInvalid(ResolveCluster(o, {}), "\"ps\" must be a list");
  o.cluster_spec = Write(R"({"ps": [7], "worker": ["c:0"]})");
  ExpectInvalid(ResolveCluster(o, {}), "entry '7'");
  o.cluster_spec = Write(R"({"worker": ["c:0"]})");
  ExpectInvalid(ResolveCluster(o, {}), "no \"ps\" job");
}

TEST_F(ClusterSpecFileTest, MissingFileIsNotFound) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 0;
  o.cluster_spec = "/nonexistent/spec.json";
  auto r = ResolveCluster(o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/spec.json"));
}

// --- Source 2: RDMAPS_* ---------------------------------------------------

TEST(RdmapsEnvLayoutTest, ReadsWhatRdmapsLocalSets) {
  Environment env = {{"RDMAPS_ROLE", "worker"},
                     {"RDMAPS_TASK_INDEX", "2"},
                     {"RDMAPS_PS_HOSTS", "127.0.0.1:4001,127.0.0.1:4002"},
                     {"RDMAPS_NUM_WORKERS", "3"},
                     {"RDMAPS_TRANSPORT", "tcp"},
                     {"RDMAPS_JOB_TOKEN", "secret"},
                     {"TF_CONFIG", "{}"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "RDMAPS_*");
  EXPECT_EQ(r->role, Role::kWorker);
  EXPECT_EQ(r->index, 2);
  EXPECT_EQ(r->num_servers, 2);
  EXPECT_EQ(r->num_workers, 3);
  EXPECT_EQ(r->transport, "tcp");
  EXPECT_EQ(r->job_token, "secret");
}

TEST(RdmapsEnvLayoutTest, Malformed) {
  ExpectInvalid(ResolveCluster({}, {{"RDMAPS_ROLE", "worker"}}),
                "RDMAPS_TASK_INDEX and RDMAPS_PS_HOSTS must be set");
  ExpectInvalid(ResolveCluster({}, {{"RDMAPS_ROLE", "worker"},
                                   {"RDMAPS_TASK_INDEX", "x"},
                                   {"RDMAPS_PS_HOSTS", "a:1"}}),
                "RDMAPS_TASK_INDEX='x'");
  ExpectInvalid(ResolveCluster({}, {{"RDMAPS_ROLE", "worker"},
                                   {"RDMAPS_TASK_INDEX", "1"},
                                   {"RDMAPS_PS_HOSTS", "a:1"},
                                   {"RDMAPS_NUM_WORKERS", "1"}}),
                "worker task index 1 is out of range");
}

// --- Source 3: TF_CONFIG --------------------------------------------------

TEST(TfConfigLayoutTest, PsTask) {
  Environment env = {
      {"TF_CONFIG",
       R"({"cluster": {"ps": ["ps0:2222", "ps1:2222"], "worker": ["w0:2222", "w1:2222"]},
           "task": {"type": "ps", "index": 1}})"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "TF_CONFIG");
  EXPECT_EQ(r->role, Role::kServer);
  EXPECT_EQ(r->index, 1);
  EXPECT_EQ(r->listen_address, "ps1:2222");
  EXPECT_EQ(r->num_workers, 2);
}

TEST(TfConfigLayoutTest, ChiefCountsAsWorkerZero) {
  std::string cluster =
      R"("cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w0:1", "w1:1"]})";
  auto chief = ResolveCluster({}, {{"TF_CONFIG", "{" + cluster +
                                                    R"(, "task": {"type": "chief", "index": 0}})"}});
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_EQ(chief->role, Role::kWorker);
  EXPECT_EQ(chief->index, 0);
  EXPECT_EQ(chief->num_workers, 3);
  EXPECT_THAT(chief->workers, ElementsAre("c:1", "w0:1", "w1:1"));
  auto w1 = ResolveCluster({}, {{"TF_CONFIG", "{" + cluster +
                                                 R"(, "task": {"type": "worker", "index": 1}})"}});
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->index, 2);
}

TEST(TfConfigLayoutTest, Malformed) {
  ExpectInvalid(ResolveCluster({}, {{"TF_CONFIG", "{\"cluster\": "}}),
                "TF_CONFIG is not a JSON object: '{\"cluster\": '");
  ExpectInvalid(ResolveCluster({}, {{"TF_CONFIG", R"({"task": {"type": "ps"}})"}}),
                "no \"cluster\"");
  ExpectInvalid(ResolveCluster({}, {{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}})"}}),
                "no \"task\"");
  ExpectInvalid(
      ResolveCluster({}, {{"TF_CONFIG",
                          R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                              "task": {"type": "master", "index": 0}})"}}),
      "task type 'master'");
  ExpectInvalid(
      ResolveCluster({}, {{"TF_CONFIG",
                          R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                              "task": {"type": "ps", "index": 1}})"}}),
      "ps task index 1 is out of range");
  ExpectInvalid(
      ResolveCluster({}, {{"TF_CONFIG",
                          R"({"cluster": {"ps": ["a:1", "a:1"], "worker": ["b:1"]},
                              "task": {"type": "ps", "index": 0}})"}}),
      "duplicate address 'a:1'");
  ExpectInvalid(
      ResolveCluster({}, {{"TF_CONFIG",
                          R"({"cluster": {"worker": ["b:1"]},
                              "task": {"type": "worker", "index": 0}})"}}),
      "no \"ps\" job");
  ExpectInvalid(
      ResolveCluster({}, {{"TF_CONFIG",
                          R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]},
                              "task": {"type": "worker", "index": [0]}})"}}),
      "\"index\" '[0]'");
}

// --- Source 4: ps-lite DMLC_* ------------------------------------------------

Environment Dmlc(const char* role) {
  return {{"DMLC_ROLE", role},
          {"DMLC_PS_ROOT_URI", "10.1.2.3"},
          {"DMLC_PS_ROOT_PORT", "9000"},
          {"DMLC_NUM_SERVER", "2"},
          {"DMLC_NUM_WORKER", "4"},
          {"DMLC_NODE_HOST", "10.1.2.9"}};
}

TEST(DmlcLayoutTest, NeedsARendezvousAtTheScheduler) {
  auto r = ResolveCluster({}, Dmlc("server"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "DMLC");
  EXPECT_EQ(r->role, Role::kServer);
  EXPECT_EQ(r->index, -1);
  EXPECT_TRUE(r->needs_rendezvous);
  EXPECT_EQ(r->rendezvous, "10.1.2.3:9000");
  EXPECT_EQ(r->advertise_host, "10.1.2.9");
  EXPECT_EQ(r->num_servers, 2);
  EXPECT_EQ(r->num_workers, 4);
  auto s = ResolveCluster({}, Dmlc("scheduler"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->role, Role::kScheduler);
}

TEST(DmlcLayoutTest, Malformed) {
  Environment env = Dmlc("worker");
  env.erase("DMLC_NUM_WORKER");
  ExpectInvalid(ResolveCluster({}, env), "DMLC_NUM_WORKER is not");
  env = Dmlc("worker");
  env["DMLC_PS_ROOT_PORT"] = "http";
  ExpectInvalid(ResolveCluster({}, env), "DMLC_PS_ROOT_PORT='http'");
  env = Dmlc("worker");
  env["DMLC_NUM_SERVER"] = "0";
  ExpectInvalid(ResolveCluster({}, env), "DMLC_NUM_SERVER=0");
  ExpectInvalid(ResolveCluster({}, Dmlc("boss")), "unknown role 'boss'");
  ClusterOptions o;
  o.num_servers = 3;
  ExpectInvalid(ResolveCluster(o, Dmlc("worker")), "counts disagree: DMLC_NUM_SERVER=2");
}

// --- Source 5: rank-based launchers ------------------------------------------

TEST(RankLayoutTest, OpenMpiSingleNodeUsesLoopback) {
  ClusterOptions o;
  o.num_servers = 2;
  Environment env = {{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "5"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "5"}};
  auto r = ResolveCluster(o, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "Open MPI");
  EXPECT_EQ(r->role, Role::kWorker);
  EXPECT_EQ(r->index, 1);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->num_workers, 3);
  EXPECT_EQ(r->rendezvous, "127.0.0.1:" + std::to_string(kDefaultRendezvousPort));
  EXPECT_EQ(r->advertise_host, "127.0.0.1");
}

TEST(RankLayoutTest, FirstRanksServe) {
  ClusterOptions o;
  o.num_servers = 2;
  o.rendezvous = "root:1234";
  Environment env = {{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}};
  auto r = ResolveCluster(o, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "MPICH");
  EXPECT_EQ(r->role, Role::kServer);
  EXPECT_EQ(r->index, 1);
  EXPECT_EQ(r->rendezvous, "root:1234");
}

TEST(RankLayoutTest, RdmapsVariablesStandInForOptions) {
  Environment env = {{"PMI_RANK", "1"},
                     {"PMI_SIZE", "4"},
                     {"RDMAPS_NUM_SERVERS", "2"},
                     {"RDMAPS_RENDEZVOUS", "file:/shared/rdzv"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_servers, 2);
  EXPECT_EQ(r->role, Role::kServer);
  EXPECT_EQ(r->rendezvous, "file:/shared/rdzv");
  ClusterOptions o;
  o.num_servers = 1;  // options win
  o.rendezvous = "h:1";
  auto r2 = ResolveCluster(o, env);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->num_servers, 1);
  EXPECT_EQ(r2->rendezvous, "h:1");
  env["RDMAPS_NUM_SERVERS"] = "two";
  ExpectInvalid(ResolveCluster({}, env), "RDMAPS_NUM_SERVERS='two'");
}

TEST(RankLayoutTest, MultiNodeMpiWithoutRendezvousSaysHowToFixIt) {
  Environment env = {{"OMPI_COMM_WORLD_RANK", "0"},
                     {"OMPI_COMM_WORLD_SIZE", "8"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  ExpectInvalid(ResolveCluster({}, env), "--rendezvous=HOST:PORT");
}

TEST(RankLayoutTest, TorchrunUsesMasterPortPlusOne) {
  Environment env = {{"RANK", "2"},
                     {"WORLD_SIZE", "3"},
                     {"MASTER_ADDR", "m.example"},
                     {"MASTER_PORT", "29500"},
                     {"LOCAL_WORLD_SIZE", "1"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "torchrun");
  EXPECT_EQ(r->rendezvous, "m.example:29501");
  EXPECT_EQ(r->role, Role::kWorker);
  EXPECT_EQ(r->index, 1);
  env.erase("MASTER_ADDR");
  ExpectInvalid(ResolveCluster({}, env), "MASTER_ADDR");
}

TEST(RankLayoutTest, SlurmRootIsTheFirstNode) {
  Environment env = {{"SLURM_PROCID", "0"},
                     {"SLURM_NTASKS", "6"},
                     {"SLURM_JOB_NODELIST", "node[01-03,7],gpu5"},
                     {"SLURM_JOB_ID", "12345"},
                     {"SLURMD_NODENAME", "node01"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "Slurm");
  EXPECT_EQ(r->role, Role::kServer);
  // (12345 x 97 + step 0) mod 1000 = 465.
  EXPECT_EQ(r->rendezvous, "node01:" + std::to_string(kDefaultRendezvousPort + 465));
  EXPECT_EQ(r->advertise_host, "node01");
  EXPECT_EQ(r->listen_address, "node01:0");
}

TEST(RankLayoutTest, InnermostLauncherWins) {
  // mpirun inside an sbatch script: every process inherits SLURM_PROCID=0.
  Environment env = {{"SLURM_PROCID", "0"},          {"SLURM_NTASKS", "1"},
                     {"SLURM_JOB_NODELIST", "n1"},   {"OMPI_COMM_WORLD_RANK", "2"},
                     {"OMPI_COMM_WORLD_SIZE", "3"},  {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "Open MPI");
  EXPECT_EQ(r->rank, 2);
}

TEST(RankLayoutTest, Malformed) {
  ExpectInvalid(ResolveCluster({}, {{"PMI_RANK", "4"}, {"PMI_SIZE", "4"}}),
                "PMI_RANK=4 PMI_SIZE=4 is out of range");
  ExpectInvalid(ResolveCluster({}, {{"PMI_RANK", "x"}, {"PMI_SIZE", "4"}}), "PMI_RANK='x'");
  ClusterOptions o;
  o.num_servers = 2;
  ExpectInvalid(ResolveCluster(o, {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}}), "leaves no worker");
  o.num_workers = 5;
  ExpectInvalid(ResolveCluster(o, {{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALNRANKS", "4"}}),
                "counts disagree");
  ExpectInvalid(ResolveCluster({}, {{"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "2"},
                                   {"SLURM_JOB_NODELIST", "node[1-"}}),
                "unmatched '['");
  ExpectInvalid(ResolveCluster({}, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}),
                "SLURM_JOB_NODELIST");
}

// --- Source 6: loopback ----------------------------------------------------

TEST(LoopbackLayoutTest, NothingSetMeansOneMachine) {
  ClusterOptions o;
  o.default_role = Role::kServer;
  auto r = ResolveCluster(o, {{"HOME", "/root"}, {"RANK", "1"}});  // RANK alone is not a launcher
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "loopback");
  EXPECT_EQ(r->role, Role::kServer);
  EXPECT_THAT(r->servers, ElementsAre("127.0.0.1:" + std::to_string(kDefaultServerPort)));
  EXPECT_EQ(r->listen_address, r->servers[0]);
  EXPECT_EQ(r->num_workers, 1);
  EXPECT_THAT(r->ToString(), HasSubstr("loopback"));
}

TEST(LayoutTest, CompleteLayoutIsANoOpWithoutRendezvous) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 0;
  o.ps_hosts = "h:1";
  o.num_workers = 1;
  auto r = ResolveWorkerCluster(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->servers, ElementsAre("h:1"));
}

}  // namespace
}  // namespace rdmaps

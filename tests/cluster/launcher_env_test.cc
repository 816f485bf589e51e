// What the layout resolver makes of real launchers' environments on a real
// cluster's first minute: srun's own PMI (--mpi=pmi2) is Slurm, not MPICH;
// two steps of one allocation meet at different rendezvous ports; a job of
// several nodes never advertises a loopback address (Debian's
// "127.0.1.1 hostname"), with an NCCL-style interface choice
// (RDMAPS_IFNAME); the launcher's start-up deadline reaches the workers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "rdmaps/options.h"
#include "src/cluster/interfaces.h"
#include "src/cluster/resolve.h"

namespace rdmaps {
namespace {

using internal::ChooseInterfaceAddress;
using internal::IsLoopbackAddress;
using internal::NetInterface;
using ::testing::HasSubstr;

void ExpectCode(const Status& s, StatusCode code, const std::string& part) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(s.message(), HasSubstr(part));
}

// srun --mpi=pmi2 on two nodes, task 1 of 3.
Environment SrunPmi2(const std::string& step) {
  return {{"SLURM_PROCID", "1"},
          {"SLURM_NTASKS", "3"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURMD_NODENAME", "n2"},
          {"SLURM_JOB_ID", "77"},
          {"SLURM_STEP_ID", step},
          {"PMI_RANK", "1"},
          {"PMI_SIZE", "3"},
          {"PMI_FD", "5"},
          {"SLURM_MPI_TYPE", "pmi2"}};
}

TEST(SlurmLauncherTest, SrunsOwnPmiIsSlurmNotMpich) {
  auto r = ResolveCluster({}, SrunPmi2("0"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "Slurm");
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->role, Role::kWorker);
  EXPECT_THAT(r->rendezvous, HasSubstr("n1:"));
  EXPECT_EQ(r->advertise_host, "n2");
}

TEST(SlurmLauncherTest, MpichsMpiexecInsideAnAllocationIsStillMpich) {
  // hydra sets MPI_LOCALNRANKS; the batch step's SLURM_PROCID=0 is inherited.
  Environment env = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "n1"},
                     {"PMI_RANK", "0"},     {"PMI_SIZE", "3"},     {"MPI_LOCALNRANKS", "3"}};
  auto r = ResolveCluster({}, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, "MPICH");
}

TEST(SlurmLauncherTest, TwoStepsOfOneAllocationMeetAtDifferentPorts) {
  auto step0 = ResolveCluster({}, SrunPmi2("0"));
  auto step1 = ResolveCluster({}, SrunPmi2("1"));
  ASSERT_TRUE(step0.ok() && step1.ok());
  EXPECT_NE(step0->rendezvous, step1->rendezvous);
  Environment old_name = SrunPmi2("1");
  old_name.erase("SLURM_STEP_ID");
  old_name["SLURM_STEPID"] = "1";  // what older srun versions set
  auto r = ResolveCluster({}, old_name);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rendezvous, step1->rendezvous);
  for (int step = 0; step < 50; ++step) {
    const int port = internal::SlurmRendezvousPort(
        {{"SLURM_JOB_ID", "4294967"}, {"SLURM_STEP_ID", std::to_string(step)}});
    EXPECT_GE(port, kDefaultRendezvousPort);
    EXPECT_LT(port, kDefaultRendezvousPort + 1000);
  }
}

const std::vector<NetInterface> kInterfaces = {{"lo", "127.0.0.1"},
                                               {"docker0", "172.17.0.1"},
                                               {"eth0", "10.0.0.1"},
                                               {"eth0.100", "10.0.1.1"},
                                               {"ib0", "10.1.0.1"}};

TEST(InterfaceChoiceTest, ReadsLikeNcclSocketIfname) {
  auto pick = [](const char* spec) {
    auto r = ChooseInterfaceAddress(spec, kInterfaces);
    return r.ok() ? *r : r.status().ToString();
  };
  EXPECT_EQ(pick(""), "10.1.0.1");     // InfiniBand first
  EXPECT_EQ(pick("eth"), "10.0.0.1");  // a prefix
  EXPECT_EQ(pick("eth0.1"), "10.0.1.1");
  EXPECT_EQ(pick("=eth0"), "10.0.0.1");   // exact
  EXPECT_EQ(pick("eth,ib"), "10.0.0.1");  // in the list's order
  EXPECT_EQ(pick("nope,ib"), "10.1.0.1");
  EXPECT_EQ(pick("^lo,docker"), "10.0.0.1");  // exclusions
  EXPECT_EQ(pick("^=lo"), "172.17.0.1");
  EXPECT_THAT(pick("=eth"), HasSubstr("matches no interface"));
  EXPECT_THAT(pick("=eth"), HasSubstr("eth0 10.0.0.1"));  // lists what there is
  EXPECT_THAT(pick("^"), HasSubstr("names no interface"));
  const std::vector<NetInterface> only_lo = {{"lo", "127.0.0.1"}};
  auto r = ChooseInterfaceAddress("", only_lo);
  ExpectCode(r.status(), StatusCode::kNotFound, "other than loopback");
  auto v6 = ChooseInterfaceAddress("", {{"lo", "::1", true}, {"eth1", "fd00::2", true}});
  EXPECT_EQ(v6.ok() ? *v6 : "", "fd00::2");
}

TEST(InterfaceChoiceTest, LoopbackAddressesAndNames) {
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.1.1"));
  EXPECT_TRUE(IsLoopbackAddress("::1"));
  EXPECT_TRUE(IsLoopbackAddress("localhost"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackAddress("192.0.2.7"));
}

TEST(InterfaceChoiceTest, ThisHostHasInterfacesWithAddresses) {
  auto list = internal::ListInterfaces();
  ASSERT_TRUE(list.ok()) << list.status();
  bool lo = false;
  for (const NetInterface& i : *list) lo = lo || i.address == "127.0.0.1";
  EXPECT_TRUE(lo);
}

// A node whose name is a loopback address (Debian's /etc/hosts maps the
// host name to 127.0.1.1) in a job of two nodes.
Environment TwoNodesNamed(const std::string& node) {
  return {{"SLURM_PROCID", "1"},
          {"SLURM_NTASKS", "2"},
          {"SLURM_JOB_NODELIST", "a,b"},
          {"SLURMD_NODENAME", node}};
}

TEST(AdvertiseTest, AMultiNodeJobNeverAdvertisesALoopbackName) {
  auto r = ResolveCluster({}, TwoNodesNamed("localhost"));
  if (r.ok()) {
    EXPECT_FALSE(IsLoopbackAddress(r->advertise_host)) << r->ToString();
    EXPECT_FALSE(r->listen_address.starts_with("localhost")) << r->ToString();
  } else {  // a host with nothing but lo
    ExpectCode(r.status(), StatusCode::kNotFound, "loopback");
  }
}

TEST(AdvertiseTest, IfnameChoosesTheInterface) {
  Environment env = TwoNodesNamed("b");
  env["RDMAPS_IFNAME"] = "lo";
  ExpectCode(ResolveCluster({}, env).status(), StatusCode::kInvalidArgument,
             "chose the loopback address 127.0.0.1");
  env["RDMAPS_IFNAME"] = "no-such-interface";
  ExpectCode(ResolveCluster({}, env).status(), StatusCode::kNotFound, "matches no interface");
  env["RDMAPS_IFNAME"] = "^lo";
  auto list = internal::ListInterfaces();
  ASSERT_TRUE(list.ok());
  auto expected = ChooseInterfaceAddress("^lo", *list);
  auto r = ResolveCluster({}, env);
  ASSERT_EQ(r.ok(), expected.ok()) << r.status();
  if (r.ok()) {
    EXPECT_EQ(r->advertise_host, *expected);
    EXPECT_FALSE(IsLoopbackAddress(r->advertise_host));
  }
}

TEST(AdvertiseTest, AnExplicitLoopbackAddressInAMultiNodeJobIsRefused) {
  ClusterOptions o;
  o.advertise_host = "127.0.0.1";
  ExpectCode(ResolveCluster(o, TwoNodesNamed("b")).status(), StatusCode::kInvalidArgument,
             "loopback address");
  // On one node it is what the job needs.
  auto one = ResolveCluster(
      o, {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a"}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->advertise_host, "127.0.0.1");
}

TEST(AdvertiseTest, ALoopbackServerBesideOtherHostsIsRefused) {
  ClusterOptions o;
  o.role = "worker";
  o.task_index = 0;
  o.ps_hosts = "127.0.0.1:7470,10.0.0.2:7470";
  o.num_workers = 1;
  ExpectCode(ResolveCluster(o, {}).status(), StatusCode::kInvalidArgument,
             "ps0 has the loopback address");
  o.ps_hosts = "127.0.0.1:7470,127.0.0.1:7471";  // one machine: fine
  EXPECT_TRUE(ResolveCluster(o, {}).ok());
}

TEST(StartupTimeoutTest, TheLaunchersDeadlineReachesTheWorker) {
  Environment env = {{"RDMAPS_ROLE", "worker"},
                     {"RDMAPS_TASK_INDEX", "0"},
                     {"RDMAPS_PS_HOSTS", "127.0.0.1:7470"},
                     {"RDMAPS_NUM_WORKERS", "1"},
                     {"RDMAPS_STARTUP_TIMEOUT_S", "7"}};
  ClusterOptions o;
  o.startup_timeout = std::chrono::seconds(60);
  auto r = ResolveWorkerCluster(o, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->startup_timeout, std::chrono::seconds(7));
  EXPECT_EQ(ClientOptions::FromCluster(*r).connect_timeout, std::chrono::seconds(7));
  env.erase("RDMAPS_STARTUP_TIMEOUT_S");
  r = ResolveWorkerCluster(o, env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ClientOptions::FromCluster(*r).connect_timeout, std::chrono::seconds(60));
  for (const char* bad : {"0", "x", "-1", "99999999999"}) {
    env["RDMAPS_STARTUP_TIMEOUT_S"] = bad;
    ExpectCode(ResolveCluster(o, env).status(), StatusCode::kInvalidArgument,
               "RDMAPS_STARTUP_TIMEOUT_S='" + std::string(bad) + "'");
  }
}

// As Kubeflow's TFJob writes it: string indices, a chief, and an Evaluator
// replica outside the cluster spec.
TEST(TfJobTest, StringIndicesChiefAndEvaluator) {
  const std::string cluster =
      R"("cluster": {"ps": ["job-ps-0.job:2222", "job-ps-1.job:2222"],
                     "chief": ["job-chief-0.job:2222"],
                     "worker": ["job-worker-0.job:2222", "job-worker-1.job:2222"]})";
  auto tf = [&](const char* type, const char* index) {
    return Environment{{"TF_CONFIG", "{" + cluster + R"(, "task": {"type": ")" + type +
                                         R"(", "index": ")" + index + R"("}})"}};
  };
  auto ps = ResolveCluster({}, tf("ps", "1"));
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->role, Role::kServer);
  EXPECT_EQ(ps->listen_address, "job-ps-1.job:2222");
  auto worker = ResolveCluster({}, tf("worker", "1"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->name(), "worker2");  // chief is worker 0
  EXPECT_EQ(worker->num_workers, 3);
  EXPECT_THAT(worker->source_detail, HasSubstr("task worker:1"));
  auto evaluator = ResolveCluster({}, tf("evaluator", "0"));
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  EXPECT_EQ(evaluator->role, Role::kEvaluator);
  EXPECT_EQ(evaluator->name(), "evaluator0");
}

}  // namespace
}  // namespace rdmaps

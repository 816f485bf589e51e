// The shell commands of README.md and docs/deploying.md that run on one
// machine, run as written (docs/deploying.md lists which commands are run by
// which test). Training commands get --epochs=1 --train_limit/--test_limit
// appended so the job takes seconds; nothing else is changed. The by-hand
// two-server form runs both "nodes" on 127.0.0.1 with ports picked free at
// run time. Label slow: real jobs that train.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "tests/cluster/proc.h"

namespace {

using rdmaps::testing::Proc;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kLocal = RDMAPS_LOCAL_BIN;
const std::string kServer = RDMAPS_SERVER_BIN;
const std::string kTrain = RDMAPS_TRAIN_BIN;
const std::string kPerf = RDMAPS_PERF_BIN;
// What keeps a documented training run short.
const std::vector<std::string> kShort = {"--epochs=1", "--train_limit=3000", "--test_limit=500",
                                         "--progress=false"};
// Variables of an enclosing job must not reach the launches.
const std::vector<std::string> kForeign = {"SLURM_JOB_ID",
                                           "SLURM_PROCID",
                                           "PMI_RANK",
                                           "RANK",
                                           "WORLD_SIZE",
                                           "TF_CONFIG",
                                           "OMPI_COMM_WORLD_RANK",
                                           "RDMAPS_ROLE",
                                           "RDMAPS_NUM_SERVERS",
                                           "RDMAPS_JOB_SECRET",
                                           "RDMAPS_JOB_SECRET_FILE",
                                           "DMLC_ROLE"};

bool HaveDataset() {
  const std::string d = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte";
  return fs::exists(d + ".gz") || fs::exists(d);
}

std::vector<std::string> Cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string TempDir() {
  std::string t = ::testing::TempDir() + "rdmaps-doc-XXXXXX";
  if (::mkdtemp(t.data()) == nullptr) return "";
  return t;
}

// A port free at this moment (the kernel's choice for port 0).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  ::close(fd);
  return port;
}

class DocumentedCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDataset())
      GTEST_SKIP() << "needs Fashion-MNIST (Debian package dataset-fashion-mnist)";
  }
};

// README "Quick start" and "Run" (rdmaps-local ... --model=mlp).
TEST_F(DocumentedCommandsTest, ReadmeLocalCluster) {
  Proc p(Cat({kLocal, "--servers", "2", "--workers", "4", "--", kTrain, "--model=mlp"}, kShort), {},
         std::chrono::seconds(150), kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("job done in"));
}

// README: the same under SSP with a straggler.
TEST_F(DocumentedCommandsTest, ReadmeSspWithAStraggler) {
  Proc p(Cat({kLocal, "--servers", "2", "--workers", "4", "--", kTrain, "--staleness=3",
              "--slow_worker=1", "--slow_factor=4"},
             kShort),
         {}, std::chrono::seconds(150), kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
}

// docs/deploying.md "Your first job": its output lines as shown there.
TEST_F(DocumentedCommandsTest, DeployingFirstJob) {
  Proc p(Cat({kLocal, "--servers", "2", "--workers", "3", "--", kTrain, "--model=mlp"}, kShort), {},
         std::chrono::seconds(150), kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("[rdmaps-local] servers ready: 127.0.0.1:"));
  EXPECT_THAT(p.out(), HasSubstr("ps0: every worker finished; exiting"));
  EXPECT_THAT(p.out(), HasSubstr("[rdmaps-local] job done in"));
}

// README "Several machines" and docs/deploying.md "Servers and workers by
// hand": the secret file made by the documented pipeline, two servers and
// four workers started by hand, both "nodes" being 127.0.0.1.
TEST_F(DocumentedCommandsTest, ByHandTwoServersFourWorkersWithASecretFile) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  const std::string secret = dir + "/.rdmaps-job-secret";
  ASSERT_EQ(std::system(("/bin/sh -c \"(umask 077; head -c 32 /dev/urandom | od -An -tx1 | "
                         "tr -d ' \\\\n' > " +
                         secret + ")\"")
                            .c_str()),
            0);
  struct stat st {};
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string value;
  std::ifstream(secret) >> value;
  EXPECT_TRUE(std::regex_match(value, std::regex("[0-9a-f]{64}"))) << "'" << value << "'";

  // tables.json: the worker program's own tables.
  const std::string tables = dir + "/tables.json";
  ASSERT_EQ(std::system((kTrain + " --model=mlp --print_tables > " + tables).c_str()), 0);

  const std::string ps =
      "127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.1:" + std::to_string(FreePort());
  const std::map<std::string, std::string> env = {{"RDMAPS_JOB_SECRET_FILE", secret}};
  std::vector<std::unique_ptr<Proc>> servers, workers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<Proc>(
        std::vector<std::string>{kServer, "--tables=" + tables, "--transport=tcp", "--role=ps",
                                 "--task_index=" + std::to_string(i), "--ps_hosts=" + ps,
                                 "--num_workers=4"},
        env, std::chrono::seconds(150), kForeign));
  }
  for (int i = 0; i < 4; ++i) {
    auto wenv = env;
    wenv["RDMAPS_ROLE"] = "worker";
    wenv["RDMAPS_TASK_INDEX"] = std::to_string(i);
    wenv["RDMAPS_PS_HOSTS"] = ps;
    wenv["RDMAPS_NUM_WORKERS"] = "4";
    wenv["RDMAPS_TRANSPORT"] = "tcp";
    workers.push_back(
        std::make_unique<Proc>(Cat({kTrain}, kShort), wenv, std::chrono::seconds(150), kForeign));
  }
  for (auto& w : workers) EXPECT_EQ(w->Wait(), 0) << w->out();
  for (auto& s : servers) EXPECT_EQ(s->Wait(), 0) << s->out();
  fs::remove_all(dir);
}

// docs/deploying.md, the ps-lite form: a scheduler that hosts the
// rendezvous, two servers with a fixed --listen port (picked free here),
// four workers; "..." is the same four DMLC_ variables. The secret is
// derived from the per-user key (here a key file of the test's own).
TEST_F(DocumentedCommandsTest, PsLiteSchedulerServersAndWorkers) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  const std::string tables = dir + "/tables.json";
  ASSERT_EQ(std::system((kTrain + " --model=mlp --print_tables > " + tables).c_str()), 0);
  const std::map<std::string, std::string> dmlc = {
      {"DMLC_PS_ROOT_URI", "127.0.0.1"},
      {"DMLC_PS_ROOT_PORT", std::to_string(FreePort())},
      {"DMLC_NUM_SERVER", "2"},
      {"DMLC_NUM_WORKER", "4"},
      {"RDMAPS_KEY_FILE", dir + "/key"}};
  auto with_role = [&](const char* role) {
    auto e = dmlc;
    e["DMLC_ROLE"] = role;
    return e;
  };
  std::vector<std::unique_ptr<Proc>> procs;
  procs.push_back(std::make_unique<Proc>(std::vector<std::string>{kServer}, with_role("scheduler"),
                                         std::chrono::seconds(150), kForeign));
  for (int i = 0; i < 2; ++i) {
    procs.push_back(std::make_unique<Proc>(
        std::vector<std::string>{kServer, "--tables=" + tables,
                                 "--listen=127.0.0.1:" + std::to_string(FreePort())},
        with_role("server"), std::chrono::seconds(150), kForeign));
  }
  for (int i = 0; i < 4; ++i) {
    procs.push_back(std::make_unique<Proc>(Cat({kTrain}, kShort), with_role("worker"),
                                           std::chrono::seconds(150), kForeign));
  }
  for (auto& p : procs) EXPECT_EQ(p->Wait(), 0) << p->out();
  fs::remove_all(dir);
}

// docs/deploying.md, torchrun on two nodes, both on 127.0.0.1 (each "node"
// gives its --node_rank; Debian's torch 1.13 also needs --redirects=1
// --tee=1 --log_dir, as that section says). Two ranks per node instead of
// four keep the machine's load down; the rendezvous is at MASTER_PORT+1.
TEST_F(DocumentedCommandsTest, TorchrunTwoNodes) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed.run' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "torch.distributed.run not found: apt-get install python3-torch";
  }
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  const std::string tables = dir + "/tables.json";
  ASSERT_EQ(std::system((kTrain + " --model=mlp --print_tables > " + tables).c_str()), 0);
  int port = 0;
  for (int tries = 0; tries < 50 && port == 0; ++tries) {
    const int p = FreePort();
    // MASTER_PORT+1 must be free too (the rendezvous).
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<std::uint16_t>(p + 1));
    if (p > 0 && p < 65535 && ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
      port = p;
    }
    ::close(fd);
  }
  ASSERT_NE(port, 0);
  std::vector<std::unique_ptr<Proc>> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(std::make_unique<Proc>(
        Cat({"torchrun", "--no_python", "--redirects=1", "--tee=1",
             "--log_dir=" + dir + "/logs" + std::to_string(node), "--nnodes=2",
             "--nproc_per_node=2", "--node_rank=" + std::to_string(node), "--master_addr=127.0.0.1",
             "--master_port=" + std::to_string(port), kServer, "--num_servers=2",
             "--tables=" + tables, "--", kTrain},
            kShort),
        std::map<std::string, std::string>{}, std::chrono::seconds(150), kForeign));
  }
  for (auto& n : nodes) EXPECT_EQ(n->Wait(), 0) << n->out();
  fs::remove_all(dir);
}

// README "Benchmarks": the rdmaps-perf line (-n bounds the iterations).
TEST(DocumentedPerfCommandTest, ReadmeRdmapsPerfLoopback) {
  Proc p({kPerf, "--transport=tcp", "--loopback", "--op=read", "-s", "64,4K,1M", "-n", "20"});
  EXPECT_EQ(p.Wait(), 0) << p.out();
  for (const char* size : {" 64 ", " 4096 ", " 1048576 "}) {
    EXPECT_THAT(p.out(), HasSubstr(size)) << p.out();
  }
}

}  // namespace

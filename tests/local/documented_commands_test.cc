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

// README "Benchmarks": the rdmaps-perf line (-n bounds the iterations).
TEST(DocumentedPerfCommandTest, ReadmeRdmapsPerfLoopback) {
  Proc p({kPerf, "--transport=tcp", "--loopback", "--op=read", "-s", "64,4K,1M", "-n", "20"});
  EXPECT_EQ(p.Wait(), 0) << p.out();
  for (const char* size : {" 64 ", " 4096 ", " 1048576 "}) {
    EXPECT_THAT(p.out(), HasSubstr(size)) << p.out();
  }
}

}  // namespace

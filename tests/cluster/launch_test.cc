// Real launches: rdmaps-local, mpirun and rdmaps-server as child processes
// of this test, running cluster_test_worker (which checks that every push
// arrived exactly once), and the fault drills: a worker killed, a server
// killed, a worker that never starts. Every child runs under a hang guard
// (tests/cluster/proc.h): a launch that does not end is killed and the test
// fails; nothing here measures time.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/cluster/proc.h"

namespace {

using rdmaps::testing::Proc;
using ::testing::HasSubstr;

const std::string kLocal = RDMAPS_LOCAL_BIN;
const std::string kServer = RDMAPS_SERVER_BIN;
const std::string kWorker = CLUSTER_TEST_WORKER_BIN;

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "rdmaps_launch_XXXXXX";
  char* d = mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  return tmpl;
}

TEST(LaunchTest, LocalTwoServersThreeWorkers) {
  Proc p(
      {kLocal, "--servers=2", "--workers=3", "--transport=tcp", "--", kWorker, "--iterations=5"});
  int rc = p.Wait();
  EXPECT_EQ(rc, 0) << p.out();
  EXPECT_EQ(CountOf(p.out(), "sum ok (15 = 3 workers x 5 iterations)"), 3) << p.out();
  EXPECT_THAT(p.out(),
              HasSubstr("[worker2] worker2 connected to 2 servers (layout from RDMAPS_*)"));
  EXPECT_THAT(p.out(), HasSubstr("[ps1] "));
  EXPECT_THAT(p.out(), HasSubstr("job done"));
}

TEST(LaunchTest, TfConfigDrivenJob) {
  // rdmaps-local gives every process, servers included, its own TF_CONFIG.
  Proc p({kLocal, "--servers=2", "--workers=2", "--transport=tcp", "--layout_env=tf_config", "--",
          kWorker, "--iterations=3"});
  int rc = p.Wait();
  EXPECT_EQ(rc, 0) << p.out();
  EXPECT_EQ(CountOf(p.out(), "(layout from TF_CONFIG)"), 2) << p.out();
  EXPECT_EQ(CountOf(p.out(), "sum ok (6 = 2 workers x 3 iterations)"), 2) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("layout from TF_CONFIG, 2 ps, 2 workers"));  // servers
}

TEST(LaunchTest, OpenMpiJob) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "mpirun not found: apt-get install openmpi-bin";
  }
  std::string dir = TempDir();
  // Every rank runs rdmaps-server; ranks 2-4 become workers and exec the
  // worker, which needs no layout flags: RDMAPS_NUM_SERVERS and
  // RDMAPS_RENDEZVOUS reach every rank through mpirun -x.
  // clang-format off
  std::vector<std::string> argv = {"mpirun", "--oversubscribe", "--allow-run-as-root",
                                   "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include",
                                   "lo", "-x", "RDMAPS_NUM_SERVERS", "-x", "RDMAPS_RENDEZVOUS",
                                   "-np", "5", kServer, "--transport=tcp",
                                   "--startup_timeout_s=30", "--", kWorker, "--iterations=4"};
  // clang-format on
  Proc p(argv, {{"RDMAPS_NUM_SERVERS", "2"}, {"RDMAPS_RENDEZVOUS", "file:" + dir + "/rendezvous"}});
  int rc = p.Wait();
  EXPECT_EQ(rc, 0) << p.out();
  EXPECT_EQ(CountOf(p.out(), "sum ok (12 = 3 workers x 4 iterations)"), 3) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("layout from Open MPI"));
  EXPECT_THAT(p.out(), HasSubstr("rendezvous complete: 2 ps + 3 workers"));
  std::filesystem::remove_all(dir);
}

TEST(LaunchTest, PrintLayoutShowsTheResolvedLayoutAndExits) {
  Proc p({kServer, "--print_layout"},
         {{"TF_CONFIG",
           R"({"cluster": {"ps": ["10.0.0.1:7470", "10.0.0.2:7470"], "worker": ["w:0"]},
               "task": {"type": "ps", "index": 1}})"}});
  EXPECT_EQ(p.Wait(), 0) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("layout from TF_CONFIG"));
  EXPECT_THAT(p.out(), HasSubstr("this process: ps1, listens on 10.0.0.2:7470"));
}

TEST(LaunchTest, ServerReportsReadinessToSystemdAndStopsCleanlyOnSigterm) {
  std::string dir = TempDir();
  std::string sock = dir + "/notify";
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  std::string tables = dir + "/tables.json";
  std::ofstream(tables) << R"([{"name": "w", "rows": 8, "dim": 2}])";

  Proc p({kServer, "--tables=" + tables, "--role=ps", "--task_index=0", "--ps_hosts=127.0.0.1:0",
          "--num_workers=1", "--transport=tcp", "--startup_timeout_s=60",
          "--secret_file=" + dir + "/secret"},
         {{"NOTIFY_SOCKET", sock}});
  pollfd pf{fd, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, 30000), 1) << "no sd_notify datagram";
  char buf[512] = {};
  ASSERT_GT(recv(fd, buf, sizeof(buf) - 1, 0), 0);
  EXPECT_THAT(std::string(buf), HasSubstr("READY=1"));
  ASSERT_TRUE(p.WaitFor("ready: listening on 127.0.0.1:"));
  kill(p.pid(), SIGTERM);
  EXPECT_EQ(p.Wait(), 0) << p.out();  // not 143, and no glog crash dump
  EXPECT_THAT(p.out(), HasSubstr("received SIGTERM: draining and stopping"));
  EXPECT_THAT(p.out(), ::testing::Not(HasSubstr("*** SIGTERM")));
  close(fd);
  std::filesystem::remove_all(dir);
}

TEST(LaunchTest, CtrlCStopsEveryProcess) {
  Proc p({kLocal, "--servers=2", "--workers=2", "--transport=tcp", "--grace_s=5", "--", kWorker,
          "--iterations=1000000"});
  ASSERT_TRUE(p.WaitFor("iteration 1 done"));
  kill(p.pid(), SIGINT);
  EXPECT_EQ(p.Wait(), 128 + SIGINT) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("received SIGINT; stopping every process"));
  // The servers got the SIGINT too and drained cleanly.
  EXPECT_EQ(CountOf(p.out(), "received SIGINT: draining and stopping"), 2) << p.out();
  EXPECT_EQ(CountOf(p.out(), "stopped by signal; exiting cleanly"), 2) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("worker0 (pid"));
  EXPECT_THAT(p.out(), HasSubstr("worker1 (pid"));
}

TEST(LaunchFaultTest, ServerStartupDeadlineNamesMissingWorkers) {
  std::string dir = TempDir();
  std::string tables = dir + "/tables.json";
  std::ofstream(tables) << R"([{"name": "w", "rows": 8, "dim": 2}])";
  Proc p({kServer, "--tables=" + tables, "--role=ps", "--task_index=0", "--ps_hosts=127.0.0.1:0",
          "--num_workers=2", "--transport=tcp", "--startup_timeout_s=1",
          "--secret_file=" + dir + "/secret"});
  EXPECT_EQ(p.Wait(), 3) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("0 of 2 workers connected"));
  EXPECT_THAT(p.out(), HasSubstr("workers never connected: [0, 1]"));
  std::filesystem::remove_all(dir);
}

TEST(LaunchFaultTest, ServerNamesAWorkerThatDiedAndExits4) {
  // No launcher in between: the server itself must notice.
  std::string dir = TempDir();
  std::string tables = dir + "/tables.json";
  std::ofstream(tables) << R"([{"name": "sum", "rows": 10, "dim": 4, "staleness": "bsp",
                               "optimizer": {"kind": "sgd", "learning_rate": 1}}])";
  // Started by hand: the server writes a secret, the worker reads it.
  const std::string secret = dir + "/secret";
  Proc server({kServer, "--tables=" + tables, "--role=ps", "--task_index=0",
               "--ps_hosts=127.0.0.1:0", "--num_workers=1", "--transport=tcp",
               "--secret_file=" + secret});
  const std::string ready = "ready: listening on ";
  ASSERT_TRUE(server.WaitFor(ready));
  ASSERT_TRUE(server.WaitFor(" (layout"));
  auto at = server.out().find(ready) + ready.size();
  std::string address = server.out().substr(at, server.out().find(' ', at) - at);
  Proc worker({kWorker, "--iterations=5", "--die_at=1", "--die_worker=0"},
              {{"RDMAPS_ROLE", "worker"},
               {"RDMAPS_TASK_INDEX", "0"},
               {"RDMAPS_PS_HOSTS", address},
               {"RDMAPS_NUM_WORKERS", "1"},
               {"RDMAPS_TRANSPORT", "tcp"},
               {"RDMAPS_JOB_SECRET_FILE", secret}});
  EXPECT_EQ(worker.Wait(), 128 + SIGKILL) << worker.out();
  EXPECT_THAT(server.out(), HasSubstr("RDMAPS_JOB_SECRET_FILE=" + secret));
  EXPECT_EQ(server.Wait(), 4) << server.out();
  EXPECT_THAT(server.out(), HasSubstr("workers disconnected without closing (crashed?): [0]"));
  std::filesystem::remove_all(dir);
}

TEST(LaunchFaultTest, KilledWorkerStopsTheJobWithItsExitCode) {
  Proc p({kLocal, "--servers=2", "--workers=3", "--transport=tcp", "--grace_s=5", "--", kWorker,
          "--iterations=1000", "--die_at=1", "--die_worker=1"});
  EXPECT_EQ(p.Wait(), 128 + SIGKILL) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("worker1 killed by SIGKILL; stopping the job"));
  EXPECT_EQ(CountOf(p.out(), "sum ok"), 0);
}

TEST(LaunchFaultTest, KilledServerStopsTheJob) {
  Proc p({kLocal, "--servers=2", "--workers=2", "--transport=tcp", "--grace_s=5", "--", kWorker,
          "--iterations=1000000"});
  ASSERT_TRUE(p.WaitFor("[rdmaps-local] ps1 pid="));
  auto at = p.out().find("[rdmaps-local] ps1 pid=") + std::strlen("[rdmaps-local] ps1 pid=");
  pid_t ps1 = static_cast<pid_t>(std::stol(p.out().substr(at)));
  ASSERT_TRUE(p.WaitFor("iteration 1 done"));
  kill(ps1, SIGKILL);
  int rc = p.Wait();
  EXPECT_NE(rc, 0) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("ps1 (pid " + std::to_string(ps1) + ") killed by SIGKILL"));
  EXPECT_THAT(p.out(), HasSubstr("stopping the job"));
  EXPECT_EQ(CountOf(p.out(), "sum ok"), 0);
}

TEST(LaunchFaultTest, MissingWorkerEndsAtTheStartupDeadlineNamingIt) {
  Proc p({kLocal, "--servers=2", "--workers=3", "--transport=tcp", "--omit_worker=2",
          "--startup_timeout_s=4", "--grace_s=5", "--", kWorker, "--iterations=3",
          "--timeout_ms=8000"});
  EXPECT_EQ(p.Wait(), 3) << p.out();  // rdmaps-server's start-up exit code
  EXPECT_THAT(p.out(), HasSubstr("worker2 not started (--omit_worker)"));
  EXPECT_THAT(p.out(), HasSubstr("2 of 3 workers connected"));
  EXPECT_THAT(p.out(), HasSubstr("workers never connected: [2]"));
}

TEST(LaunchFaultTest, ServerRetriesAnUnresolvableOwnAddressUntilTheStartupDeadline) {
  // A Kubernetes ps pod starts before its own headless-service name
  // resolves: rdmaps-server must keep trying, not exit at once.
  std::string dir = TempDir();
  std::string tables = dir + "/tables.json";
  std::ofstream(tables) << R"([{"name": "w", "rows": 8, "dim": 2}])";
  Proc p({kServer, "--tables=" + tables, "--transport=tcp", "--startup_timeout_s=2"},
         {{"TF_CONFIG", R"({"cluster": {"ps": ["rdmaps-ps-0.rdmaps.invalid:2222"],
                                         "worker": ["rdmaps-worker-0.rdmaps.invalid:2222"]},
                            "task": {"type": "ps", "index": "0"}})"}});
  EXPECT_EQ(p.Wait(), 3) << p.out();
  EXPECT_THAT(p.out(), HasSubstr("trying again until the start-up deadline"));
  EXPECT_THAT(p.out(), ::testing::ContainsRegex("after ([2-9]|[1-9][0-9]+) attempts"));
  std::filesystem::remove_all(dir);
}

}  // namespace

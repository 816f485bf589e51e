// The real launchers from Debian, started by this test: a one-node Slurm
// (munged, slurmctld and slurmd with a slurm.conf of free ports in a temp
// dir) with srun, srun --mpi=pmi2 and sbatch running two job steps at once;
// torchrun (python3-torch's torch.distributed.run); MPICH's mpiexec; Open
// MPI's mpirun; and a job shaped like Kubeflow's TFJob (TF_CONFIG with ps,
// chief, worker and evaluator tasks and string indices). In each a job
// trains (rdmaps-train, a tiny config) and every rank exits 0, and a killed
// rank ends the job, named, long before any wait timeout: the workers wait
// up to 60 s for their peers while the hang guard of each launch is 40 s.
//
// A launcher that is not installed skips its cases with the package to
// install. Labelled slow (plain build only): real daemons and interpreters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cluster/proc.h"

namespace {

using rdmaps::testing::Proc;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kServer = RDMAPS_SERVER_BIN;
const std::string kTrain = RDMAPS_TRAIN_BIN;
const std::string kWorker = CLUSTER_TEST_WORKER_BIN;
// A killed rank must end its launch well within this; the peers' wait
// timeout is 60 s.
constexpr std::chrono::seconds kFaultGuard{40};
// Launcher variables of an enclosing job (CI inside Slurm, say) must not
// reach the launches of this test.
const std::vector<std::string> kForeign = {"SLURM_JOB_ID",       "SLURM_PROCID",
                                           "SLURM_NTASKS",       "SLURM_STEP_ID",
                                           "SLURM_JOB_NODELIST", "PMI_RANK",
                                           "PMI_SIZE",           "RANK",
                                           "WORLD_SIZE",         "OMPI_COMM_WORLD_RANK",
                                           "TF_CONFIG",          "RDMAPS_ROLE",
                                           "RDMAPS_NUM_SERVERS", "RDMAPS_RENDEZVOUS",
                                           "DMLC_ROLE"};

bool Have(const std::string& program) {
  return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

// A port nothing listens on now (bound and closed: the kernel does not hand
// it out again at once).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(sa);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "rdmaps_launchers_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  chmod(tmpl.c_str(), 0711);  // munged checks the socket's directory
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// rdmaps-train, small enough to take a fraction of a second per worker.
std::vector<std::string> TinyTrain() {
  return {kTrain,
          "--model=softmax",
          "--epochs=1",
          "--train_limit=1024",
          "--test_limit=256",
          "--progress=false",
          "--wait_timeout_ms=60000"};
}

// cluster_test_worker whose worker 1 kills itself after iteration 1.
std::vector<std::string> DyingWorker() {
  return {kWorker, "--iterations=1000", "--die_at=1", "--die_worker=1", "--timeout_ms=60000"};
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every worker of a TinyTrain job reported (rdmaps-train prints "[wI] mode
// ..." at the end of a worker's training).
void ExpectTrained(const std::string& out, int workers) {
  for (int w = 0; w < workers; ++w) {
    EXPECT_THAT(out, HasSubstr("[w" + std::to_string(w) + "] mode bsp")) << out;
  }
  EXPECT_THAT(out, HasSubstr("[w0] test accuracy"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("rdmaps-train: ")));  // its error prefix
}

// The killed worker 1 is named by rdmaps (a server or a peer), not only by
// the launcher.
void ExpectWorker1Named(const std::string& out) {
  EXPECT_TRUE(std::regex_search(out, std::regex("worker 1 (died|disconnected without Close)")))
      << out;
}

class LaunchersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    tables_ = dir_ + "/tables.json";
    Proc describe(TinyTrain(), {{"RDMAPS_DESCRIBE_TABLES", tables_}});
    ASSERT_EQ(describe.Wait(), 0) << describe.out();
    dying_tables_ = dir_ + "/sum.json";
    std::ofstream(dying_tables_) << R"([{"name": "sum", "rows": 10, "dim": 4, "staleness": "bsp",
                                        "optimizer": {"kind": "sgd", "learning_rate": 1}}])";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  std::string tables_;
  std::string dying_tables_;
};

// ---- MPICH -----------------------------------------------------------------

TEST_F(LaunchersTest, MpichTrainsWithNumServersOnTheCommandLine) {
  if (!Have("mpiexec.mpich")) GTEST_SKIP() << "mpiexec.mpich not found: apt-get install mpich";
  // As docs/deploying.md: the flag reaches the worker ranks' command.
  Proc p(Concat({"mpiexec.mpich", "-n", "4", kServer, "--num_servers=2", "--tables=" + tables_,
                 "--transport=tcp", "--"},
                TinyTrain()),
         {{"RDMAPS_RENDEZVOUS", "file:" + dir_ + "/rdzv"}}, Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  ExpectTrained(p.out(), 2);
  EXPECT_THAT(p.out(), HasSubstr("using MPICH"));
}

TEST_F(LaunchersTest, MpichKilledRankEndsTheJobNamed) {
  if (!Have("mpiexec.mpich")) GTEST_SKIP() << "mpiexec.mpich not found: apt-get install mpich";
  Proc p(Concat({"mpiexec.mpich", "-env", "RDMAPS_NUM_SERVERS", "2", "-n", "5", kServer,
                 "--tables=" + dying_tables_, "--transport=tcp", "--"},
                DyingWorker()),
         {{"RDMAPS_RENDEZVOUS", "file:" + dir_ + "/rdzv"}}, kFaultGuard, kForeign);
  EXPECT_NE(p.Wait(), 0) << p.out();
  // MPICH's hydra kills every rank as soon as one dies, which may come
  // before a server logs the death: then hydra's own report names the dead
  // rank (its PID and host, after the rank said "dying now").
  const std::string out = p.out();
  if (out.find("BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES") == std::string::npos) {
    ExpectWorker1Named(out);
  } else {
    EXPECT_THAT(out, HasSubstr("dying now")) << out;
  }
}

// ---- Open MPI --------------------------------------------------------------

std::vector<std::string> OpenMpi(int np) {
  return {"mpirun.openmpi",
          "--oversubscribe",
          "--mca",
          "btl",
          "self,tcp",
          "--mca",
          "btl_tcp_if_include",
          "lo",
          "-x",
          "RDMAPS_RENDEZVOUS",
          "-np",
          std::to_string(np)};
}
// Open MPI refuses root without this (CI runs as root).
const std::map<std::string, std::string> kOmpiRoot = {{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                      {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};

TEST_F(LaunchersTest, OpenMpiTrainsWithNumServersOnTheCommandLine) {
  if (!Have("mpirun.openmpi"))
    GTEST_SKIP() << "mpirun.openmpi not found: apt-get install openmpi-bin";
  auto env = kOmpiRoot;
  env["RDMAPS_RENDEZVOUS"] = "file:" + dir_ + "/rdzv";
  Proc p(Concat(OpenMpi(4),
                Concat({kServer, "--num_servers=2", "--tables=" + tables_, "--transport=tcp", "--"},
                       TinyTrain())),
         env, Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  ExpectTrained(p.out(), 2);
  EXPECT_THAT(p.out(), HasSubstr("using Open MPI"));
}

TEST_F(LaunchersTest, OpenMpiKilledRankEndsTheJobNamed) {
  if (!Have("mpirun.openmpi"))
    GTEST_SKIP() << "mpirun.openmpi not found: apt-get install openmpi-bin";
  auto env = kOmpiRoot;
  env["RDMAPS_RENDEZVOUS"] = "file:" + dir_ + "/rdzv";
  env["RDMAPS_NUM_SERVERS"] = "2";
  Proc p(Concat(Concat(OpenMpi(5), {"-x", "RDMAPS_NUM_SERVERS"}),
                Concat({kServer, "--tables=" + dying_tables_, "--transport=tcp", "--"},
                       DyingWorker())),
         env, kFaultGuard, kForeign);
  EXPECT_NE(p.Wait(), 0) << p.out();
  ExpectWorker1Named(p.out());
}

// ---- torchrun ----------------------------------------------------------------

// A port P with P + 1 free too (torchrun's store takes P, rdmaps' rendezvous
// P + 1).
int FreePortPair() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int p = FreePort();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<std::uint16_t>(p + 1));
    const bool free = p < 65535 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
    close(fd);
    if (free) return p;
  }
  ADD_FAILURE() << "no two consecutive free ports";
  return 0;
}

bool HaveTorch() {
  return std::system("/usr/bin/python3 -c 'import torch.distributed.run' >/dev/null 2>&1") == 0;
}

// torchrun as Debian 12 ships it (torch 1.13 on Python 3.11): its parser of
// --redirects/--tee turns the default "0" into None and fails, so they are
// given as 1 (stdout to --log_dir, and on to the console).
std::vector<std::string> Torchrun(const std::string& log_dir, int nproc, int master_port) {
  return {"/usr/bin/python3",
          "-m",
          "torch.distributed.run",
          "--no_python",
          "--redirects=1",
          "--tee=1",
          "--log_dir=" + log_dir,
          "--nnodes=1",
          "--nproc_per_node=" + std::to_string(nproc),
          "--master_addr=127.0.0.1",
          "--master_port=" + std::to_string(master_port)};
}

TEST_F(LaunchersTest, TorchrunTrainsWithNumServersOnTheCommandLine) {
  if (!HaveTorch())
    GTEST_SKIP() << "torch.distributed.run not found: apt-get install python3-torch";
  // The rendezvous is at MASTER_PORT + 1.
  Proc p(Concat(Torchrun(dir_ + "/logs", 4, FreePortPair()),
                Concat({kServer, "--num_servers=2", "--tables=" + tables_, "--transport=tcp", "--"},
                       TinyTrain())),
         {}, Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  ExpectTrained(p.out(), 2);
  EXPECT_THAT(p.out(), HasSubstr("using torchrun"));
}

TEST_F(LaunchersTest, TorchrunKilledRankEndsTheJobNamed) {
  if (!HaveTorch())
    GTEST_SKIP() << "torch.distributed.run not found: apt-get install python3-torch";
  Proc p(Concat(Torchrun(dir_ + "/logs", 5, FreePortPair()),
                Concat({kServer, "--num_servers=2", "--tables=" + dying_tables_, "--transport=tcp",
                        "--"},
                       DyingWorker())),
         {}, kFaultGuard, kForeign);
  EXPECT_NE(p.Wait(), 0) << p.out();
  ExpectWorker1Named(p.out());
}

// ---- A TFJob-shaped TF_CONFIG job ---------------------------------------------

// What Kubeflow's TFJob gives each pod: the cluster without the evaluator,
// the task's index as a string.
std::string TfJobConfig(const std::vector<std::string>& ps, const std::string& type, int index) {
  std::string c = R"({"cluster": {"ps": [")" + ps[0] + R"(", ")" + ps[1] +
                  R"("], "chief": ["127.0.0.2:2222"], "worker": ["127.0.0.3:2222", )"
                  R"("127.0.0.4:2222"]}, "task": {"type": ")" +
                  type + R"(", "index": ")" + std::to_string(index) +
                  R"("}, "environment": "cloud"})";
  return c;
}

struct TfJob {
  std::vector<std::unique_ptr<Proc>> ps, workers;
  std::unique_ptr<Proc> evaluator;
};

TfJob StartTfJob(const std::string& tables, const std::vector<std::string>& worker_command,
                 std::chrono::seconds guard) {
  const std::vector<std::string> ps = {"127.0.0.1:" + std::to_string(FreePort()),
                                       "127.0.0.1:" + std::to_string(FreePort())};
  TfJob job;
  for (int i = 0; i < 2; ++i) {
    job.ps.push_back(std::make_unique<Proc>(
        std::vector<std::string>{kServer, "--tables=" + tables, "--transport=tcp"},
        std::map<std::string, std::string>{{"TF_CONFIG", TfJobConfig(ps, "ps", i)},
                                           {"RDMAPS_TRANSPORT", "tcp"}},
        guard, kForeign));
  }
  const std::pair<const char*, int> tasks[] = {{"chief", 0}, {"worker", 0}, {"worker", 1}};
  for (const auto& [type, index] : tasks) {
    job.workers.push_back(std::make_unique<Proc>(
        worker_command,
        std::map<std::string, std::string>{{"TF_CONFIG", TfJobConfig(ps, type, index)},
                                           {"RDMAPS_TRANSPORT", "tcp"}},
        guard, kForeign));
  }
  job.evaluator = std::make_unique<Proc>(
      worker_command,
      std::map<std::string, std::string>{{"TF_CONFIG", TfJobConfig(ps, "evaluator", 0)},
                                         {"RDMAPS_TRANSPORT", "tcp"}},
      guard, kForeign);
  return job;
}

TEST_F(LaunchersTest, TfJobShapedJobTrainsAndTheEvaluatorExitsZero) {
  TfJob job = StartTfJob(tables_, TinyTrain(), Proc::kDefaultGuard);
  for (std::size_t w = 0; w < job.workers.size(); ++w) {
    EXPECT_EQ(job.workers[w]->Wait(), 0) << "worker " << w << ":\n" << job.workers[w]->out();
    EXPECT_THAT(job.workers[w]->out(), HasSubstr("[w" + std::to_string(w) + "] mode bsp"));
  }
  EXPECT_THAT(job.workers[0]->out(), HasSubstr("(task chief:0)"));
  EXPECT_THAT(job.workers[2]->out(), HasSubstr("worker2 of 2 ps + 3 workers"));
  for (auto& ps : job.ps) {
    EXPECT_EQ(ps->Wait(), 0) << ps->out();
    EXPECT_THAT(ps->out(), HasSubstr("every worker finished"));
  }
  EXPECT_EQ(job.evaluator->Wait(), 0) << job.evaluator->out();
  EXPECT_THAT(job.evaluator->out(), HasSubstr("evaluator0: an evaluator is not part"));
}

TEST_F(LaunchersTest, TfJobKilledWorkerIsNamedByTheServersAndItsPeers) {
  TfJob job = StartTfJob(dying_tables_, DyingWorker(), kFaultGuard);
  EXPECT_EQ(job.workers[1]->Wait(), 128 + SIGKILL) << job.workers[1]->out();  // worker 1
  for (int w : {0, 2}) {
    EXPECT_EQ(job.workers[w]->Wait(), 1) << job.workers[w]->out();
    EXPECT_THAT(job.workers[w]->out(), HasSubstr("worker 1 died")) << job.workers[w]->out();
  }
  for (auto& ps : job.ps) {
    EXPECT_EQ(ps->Wait(), 4) << ps->out();
    EXPECT_THAT(ps->out(), HasSubstr("workers disconnected without closing (crashed?): [1]"));
  }
  EXPECT_EQ(job.evaluator->Wait(), 1) << job.evaluator->out();  // cluster_test_worker: not a worker
}

// ---- The explicit forms of docs/deploying.md ----------------------------------

TEST_F(LaunchersTest, PlainTcpExplicitListsTrain) {
  // "Plain TCP on a few machines", on one: the same lists everywhere.
  const std::string ps =
      "127.0.0.1:" + std::to_string(FreePort()) + ",127.0.0.1:" + std::to_string(FreePort());
  // No launcher, no job to derive a secret from: the same one in a file only
  // this user can read, as the docs say.
  const std::string secret_file = dir_ + "/job-secret";
  {
    std::ofstream(secret_file) << "explicit-lists-" << FreePort();
    ASSERT_EQ(::chmod(secret_file.c_str(), 0600), 0);
  }
  std::vector<std::unique_ptr<Proc>> servers, workers;
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<Proc>(
        std::vector<std::string>{kServer, "--tables=" + tables_, "--transport=tcp", "--role=ps",
                                 "--task_index=" + std::to_string(i), "--ps_hosts=" + ps,
                                 "--num_workers=2"},
        std::map<std::string, std::string>{{"RDMAPS_JOB_SECRET_FILE", secret_file}},
        Proc::kDefaultGuard, kForeign));
  }
  for (int i = 0; i < 2; ++i) {
    workers.push_back(std::make_unique<Proc>(
        TinyTrain(),
        std::map<std::string, std::string>{{"RDMAPS_ROLE", "worker"},
                                           {"RDMAPS_TASK_INDEX", std::to_string(i)},
                                           {"RDMAPS_PS_HOSTS", ps},
                                           {"RDMAPS_NUM_WORKERS", "2"},
                                           {"RDMAPS_TRANSPORT", "tcp"},
                                           {"RDMAPS_JOB_SECRET_FILE", secret_file}},
        Proc::kDefaultGuard, kForeign));
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(workers[i]->Wait(), 0) << workers[i]->out();
    EXPECT_THAT(workers[i]->out(), HasSubstr("[w" + std::to_string(i) + "] mode bsp"));
  }
  for (auto& s : servers) EXPECT_EQ(s->Wait(), 0) << s->out();
}

TEST_F(LaunchersTest, OpenMpiWithAHostfileAndAnExplicitRendezvous) {
  if (!Have("mpirun.openmpi"))
    GTEST_SKIP() << "mpirun.openmpi not found: apt-get install openmpi-bin";
  // "Open MPI, several nodes", with a hostfile of this one node.
  std::ofstream(dir_ + "/hosts") << "localhost slots=8\n";
  auto env = kOmpiRoot;
  Proc p(Concat({"mpirun.openmpi", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
                 "-np", "4", "--hostfile", dir_ + "/hosts", "-x", "RDMAPS_NUM_SERVERS=2", "-x",
                 "RDMAPS_RENDEZVOUS=127.0.0.1:" + std::to_string(FreePort()), kServer,
                 "--tables=" + tables_, "--transport=tcp", "--"},
                TinyTrain()),
         env, Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  ExpectTrained(p.out(), 2);
}

// ---- Slurm -----------------------------------------------------------------

// munged, slurmctld and slurmd for one node, in a temp dir; every Slurm
// command the tests run gets SLURM_CONF pointing at it.
class Slurm {
 public:
  static bool Installed(std::string* why) {
    for (const char* p : {"munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo"}) {
      if (!Have(p) && !std::filesystem::exists(std::string("/usr/sbin/") + p)) {
        *why = std::string(p) + " not found: apt-get install slurm-wlm munge";
        return false;
      }
    }
    return true;
  }

  explicit Slurm(const std::string& dir) : dir_(dir) {
    std::filesystem::create_directories(dir_ + "/state");
    std::filesystem::create_directories(dir_ + "/spool");
    {
      std::ofstream key(dir_ + "/munge.key", std::ios::binary);
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::vector<char> buf(1024);
      rnd.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      key.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    }
    chmod((dir_ + "/munge.key").c_str(), 0600);
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    const passwd* pw = getpwuid(getuid());
    const std::string user = pw ? pw->pw_name : "root";
    const unsigned cpus = std::max(8u, std::thread::hardware_concurrency());
    std::ofstream(dir_ + "/slurm.conf")
        << "ClusterName=rdmapstest\n"
        // Job ids (and so rendezvous ports) apart from another instance's.
        << "FirstJobId=" << 1000 + getpid() % 100000 << "\n"
        << "SlurmctldHost=" << host << "(127.0.0.1)\n"
        << "SlurmctldPort=" << FreePort() << "\nSlurmdPort=" << FreePort() << "\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << dir_ << "/munge.sock\n"
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSwitchType=switch/none\n"
        << "MpiDefault=none\nSlurmUser=" << user << "\nSlurmdUser=" << user << "\n"
        << "StateSaveLocation=" << dir_ << "/state\nSlurmdSpoolDir=" << dir_ << "/spool\n"
        << "SlurmctldPidFile=" << dir_ << "/slurmctld.pid\nSlurmdPidFile=" << dir_
        << "/slurmd.pid\n"
        << "SlurmctldLogFile=" << dir_ << "/slurmctld.log\nSlurmdLogFile=" << dir_
        << "/slurmd.log\n"
        << "SchedulerType=sched/builtin\nSelectType=select/linear\n"
        << "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        << "JobCompType=jobcomp/none\nReturnToService=2\nSlurmdParameters=config_overrides\n"
        << "NodeName=" << host << " NodeAddr=127.0.0.1 CPUs=" << cpus << " State=UNKNOWN\n"
        << "PartitionName=debug Nodes=" << host << " Default=YES MaxTime=INFINITE State=UP\n";
    env_ = {{"SLURM_CONF", dir_ + "/slurm.conf"}};
    munged_ = std::make_unique<Proc>(
        std::vector<std::string>{
            "/usr/sbin/munged", "-F", "-f", "--key-file=" + dir_ + "/munge.key",
            "--socket=" + dir_ + "/munge.sock", "--log-file=" + dir_ + "/munged.log",
            "--pid-file=" + dir_ + "/munged.pid", "--seed-file=" + dir_ + "/munged.seed"},
        env_, std::chrono::seconds(600));
    if (!PollUntil([&] { return std::filesystem::exists(dir_ + "/munge.sock"); })) {
      error_ = "munged did not create its socket: " + munged_->out();
      return;
    }
    slurmctld_ = std::make_unique<Proc>(std::vector<std::string>{"/usr/sbin/slurmctld", "-D", "-i"},
                                        env_, std::chrono::seconds(600));
    slurmd_ = std::make_unique<Proc>(std::vector<std::string>{"/usr/sbin/slurmd", "-D"}, env_,
                                     std::chrono::seconds(600));
    // Ready when the node is idle.
    if (!PollUntil([&] {
          Proc sinfo({"sinfo", "-h", "-o", "%T"}, env_, std::chrono::seconds(10));
          return sinfo.Wait() == 0 && sinfo.out().find("idle") != std::string::npos;
        })) {
      error_ = "the node did not become idle; slurmctld.log:\n" +
               ReadFile(dir_ + "/slurmctld.log") + "\nslurmd.log:\n" +
               ReadFile(dir_ + "/slurmd.log");
    }
  }
  ~Slurm() {
    for (Proc* p : {slurmd_.get(), slurmctld_.get(), munged_.get()}) {
      if (!p) continue;
      kill(p->pid(), SIGTERM);
      p->Wait();
    }
  }

  const std::string& error() const { return error_; }
  std::map<std::string, std::string> env(std::map<std::string, std::string> more = {}) const {
    more.insert(env_.begin(), env_.end());
    return more;
  }

 private:
  template <typename Pred>
  static bool PollUntil(Pred ready) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    auto pause = std::chrono::milliseconds(10);
    while (!ready()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(250));
    }
    return true;
  }

  std::string dir_;
  std::string error_;
  std::map<std::string, std::string> env_;
  std::unique_ptr<Proc> munged_, slurmctld_, slurmd_;
};

class SlurmTest : public LaunchersTest {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (!Slurm::Installed(&why)) {
      skip_ = why;
      return;
    }
    slurm_dir_ = MakeTempDir();
    slurm_ = new Slurm(slurm_dir_);
  }
  static void TearDownTestSuite() {
    delete slurm_;
    slurm_ = nullptr;
    if (!slurm_dir_.empty()) std::filesystem::remove_all(slurm_dir_);
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(slurm_->error().empty()) << slurm_->error();
    LaunchersTest::SetUp();
  }

  static inline std::string skip_;
  static inline std::string slurm_dir_;
  static inline Slurm* slurm_ = nullptr;
};

TEST_F(SlurmTest, SrunTrainsAsDocumented) {
  // docs/deploying.md: RDMAPS_NUM_SERVERS and srun --kill-on-bad-exit=1.
  Proc p(Concat({"srun", "--kill-on-bad-exit=1", "-n", "4", kServer, "--tables=" + tables_,
                 "--transport=tcp", "--startup_timeout_s=60", "--"},
                TinyTrain()),
         slurm_->env({{"RDMAPS_NUM_SERVERS", "2"}}), Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  ExpectTrained(p.out(), 2);
  EXPECT_THAT(p.out(), HasSubstr("using Slurm"));
}

TEST_F(SlurmTest, SrunWithPmi2IsSlurmNotMpich) {
  Proc p(Concat({"srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "4", kServer,
                 "--num_servers=2", "--tables=" + tables_, "--transport=tcp", "--"},
                TinyTrain()),
         slurm_->env(), Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out();
  ExpectTrained(p.out(), 2);
  EXPECT_THAT(p.out(), HasSubstr("using Slurm"));
  EXPECT_THAT(p.out(), ::testing::Not(HasSubstr("using MPICH")));
}

TEST_F(SlurmTest, SbatchRunsTwoConcurrentStepsThatDoNotMeet) {
  // Two steps of one allocation at once, each its own rdmaps job: they must
  // not share a rendezvous port.
  const std::string script = dir_ + "/job.sh";
  std::string step;
  for (const auto& a : Concat({"srun", "--exact", "-n", "4", kServer, "--num_servers=2",
                               "--tables=" + tables_, "--transport=tcp", "--"},
                              TinyTrain())) {
    step += " '" + a + "'";
  }
  std::ofstream(script) << "#!/bin/bash\n"
                        << step << " > " << dir_ << "/step0.out 2>&1 & s0=$!\n"
                        << step << " > " << dir_ << "/step1.out 2>&1 & s1=$!\n"
                        << "wait $s0; a=$?; wait $s1; b=$?\n"
                        << "echo \"steps: $a $b\"; exit $((a + b))\n";
  chmod(script.c_str(), 0755);
  Proc p({"sbatch", "--wait", "-n", "8", "-o", dir_ + "/job.out", script}, slurm_->env(),
         Proc::kDefaultGuard, kForeign);
  EXPECT_EQ(p.Wait(), 0) << p.out() << ReadFile(dir_ + "/job.out") << ReadFile(dir_ + "/step0.out")
                         << ReadFile(dir_ + "/step1.out");
  EXPECT_THAT(ReadFile(dir_ + "/job.out"), HasSubstr("steps: 0 0"));
  const std::string s0 = ReadFile(dir_ + "/step0.out"), s1 = ReadFile(dir_ + "/step1.out");
  ExpectTrained(s0, 2);
  ExpectTrained(s1, 2);
  std::smatch m0, m1;
  const std::regex rdzv("rendezvous at (127\\.0\\.0\\.1:[0-9]+)");
  ASSERT_TRUE(std::regex_search(s0, m0, rdzv)) << s0;
  ASSERT_TRUE(std::regex_search(s1, m1, rdzv)) << s1;
  EXPECT_NE(m0[1].str(), m1[1].str());
}

TEST_F(SlurmTest, KilledRankEndsTheJobNamed) {
  Proc p(Concat({"srun", "--kill-on-bad-exit=1", "-n", "5", kServer, "--num_servers=2",
                 "--tables=" + dying_tables_, "--transport=tcp", "--"},
                DyingWorker()),
         slurm_->env(), kFaultGuard, kForeign);
  EXPECT_NE(p.Wait(), 0) << p.out();
  ExpectWorker1Named(p.out());
}

}  // namespace

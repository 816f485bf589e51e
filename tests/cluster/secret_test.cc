// Where the job secret comes from (src/cluster/secret.h): the order of the
// sources, the permission checks on secret and key files, the per-user key
// created once even when many ranks start together, and derivation from
// each launcher's job identity.
#include "src/cluster/secret.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "rdmaps/cluster.h"

namespace rdmaps::internal {
namespace {

using ::testing::HasSubstr;

class SecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rdmaps-secret-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  // A Slurm job step's environment, with the per-user key in our directory.
  Environment SlurmEnv(const std::string& job = "4242") {
    return {{"SLURM_JOB_ID", job}, {"SLURM_STEP_ID", "0"}, {"RDMAPS_KEY_FILE", dir_ + "/key"}};
  }
  Result<JobSecret> Resolve(const Environment& env, ClusterOptions o = {}) {
    ClusterLayout layout;
    layout.rendezvous = "node1:29400";
    return ResolveJobSecret(o, env, layout);
  }

  std::string dir_;
};

TEST_F(SecretTest, SourcesInOrder) {
  const std::string file = WriteFile("s", "from-file\n", 0600);
  Environment env = SlurmEnv();
  env["RDMAPS_JOB_SECRET"] = "from-env";
  env["RDMAPS_JOB_SECRET_FILE"] = file;
  ClusterOptions o;
  o.job_token = "from-options";
  EXPECT_EQ(Resolve(env, o)->value, "from-options");
  auto r = Resolve(env);
  EXPECT_EQ(r->value, "from-file");  // trailing newline dropped
  EXPECT_THAT(r->source, HasSubstr("RDMAPS_JOB_SECRET_FILE"));
  env.erase("RDMAPS_JOB_SECRET_FILE");
  EXPECT_EQ(Resolve(env)->value, "from-env");
  env.erase("RDMAPS_JOB_SECRET");
  env["RDMAPS_JOB_TOKEN"] = "old-name";
  EXPECT_EQ(Resolve(env)->value, "old-name");
  env.erase("RDMAPS_JOB_TOKEN");
  r = Resolve(env);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->value.size(), 64u);  // HMAC-SHA256 in hex
  EXPECT_THAT(r->source, HasSubstr("derived from Slurm job 4242 step 0"));
}

TEST_F(SecretTest, InsecureNeedsToBeAsked) {
  Environment env = SlurmEnv();
  env["RDMAPS_INSECURE"] = "1";
  auto r = Resolve(env);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->insecure);
  EXPECT_TRUE(r->value.empty());
  env["RDMAPS_INSECURE"] = "0";
  EXPECT_FALSE(Resolve(env)->insecure);
}

TEST_F(SecretTest, ReadableSecretFileIsRefusedWithTheChmod) {
  const std::string file = WriteFile("s", "x", 0640);
  auto r = Resolve({{"RDMAPS_JOB_SECRET_FILE", file}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr("chmod 600 " + file));
  EXPECT_EQ(Resolve({{"RDMAPS_JOB_SECRET_FILE", dir_}}).status().code(),
            StatusCode::kInvalidArgument);  // not a regular file
  const std::string empty = WriteFile("e", "\n", 0600);
  EXPECT_EQ(Resolve({{"RDMAPS_JOB_SECRET_FILE", empty}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Resolve({{"RDMAPS_JOB_SECRET_FILE", dir_ + "/missing"}}).status().code(),
            StatusCode::kNotFound);
}

TEST_F(SecretTest, KeyFileIsCreatedPrivateAndRefusedWhenReadable) {
  const std::string path = dir_ + "/sub/rdmaps/key";
  auto k = LoadOrCreateUserKey(path);
  ASSERT_TRUE(k.ok()) << k.status();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  ASSERT_EQ(::stat((dir_ + "/sub/rdmaps").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(*LoadOrCreateUserKey(path), *k) << "the key changed on the second use";
  ::chmod(path.c_str(), 0644);
  auto refused = LoadOrCreateUserKey(path);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("chmod 600"));
}

TEST_F(SecretTest, RanksStartingAtOnceShareOneKey) {
  // 16 processes create the key at the same moment: every one must end up
  // with the same 32 bytes (the one link(2)ed first).
  const std::string path = dir_ + "/race/key";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  constexpr int kRanks = 16;
  for (int i = 0; i < kRanks; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) != 0) ::_exit(2);  // released when the parent closes
      auto k = LoadOrCreateUserKey(path);
      if (!k.ok()) ::_exit(1);
      if (::write(fds[1], k->data(), k->size()) != 32) ::_exit(3);
      ::_exit(0);
    }
  }
  ::close(go[0]);
  ::close(go[1]);  // all start together
  ::close(fds[1]);
  std::set<std::string> keys;
  char buf[32];
  for (int i = 0; i < kRanks; ++i) {
    std::size_t got = 0;
    while (got < 32) {
      ssize_t r = ::read(fds[0], buf + got, 32 - got);
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    if (got == 32) keys.insert(std::string(buf, 32));
  }
  ::close(fds[0]);
  for (int i = 0; i < kRanks; ++i) {
    int status = 0;
    ::wait(&status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  EXPECT_EQ(keys.size(), 1u) << "ranks derived different keys";
  std::size_t leftovers = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir_ + "/race")) {
    leftovers += e.path().filename() != "key";
  }
  EXPECT_EQ(leftovers, 0u) << "temporary key files left behind";
}

TEST_F(SecretTest, DerivedSecretIsPerJobAndPerUser) {
  const std::string a = Resolve(SlurmEnv("1"))->value;
  EXPECT_EQ(Resolve(SlurmEnv("1"))->value, a) << "two ranks of one job disagree";
  EXPECT_NE(Resolve(SlurmEnv("2"))->value, a) << "two jobs share a secret";
  Environment step = SlurmEnv("1");
  step["SLURM_STEP_ID"] = "1";
  EXPECT_NE(Resolve(step)->value, a) << "two steps share a secret";
  Environment other_user = SlurmEnv("1");
  other_user["RDMAPS_KEY_FILE"] = dir_ + "/other-key";
  EXPECT_NE(Resolve(other_user)->value, a) << "another key (user) derives the same secret";
}

TEST_F(SecretTest, EachLauncherNamesItsJob) {
  struct Case {
    Environment env;
    std::string kind;
  };
  const Case cases[] = {
      {{{"TORCHELASTIC_RUN_ID", "r1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}}, "torchrun"},
      {{{"PMIX_NAMESPACE", "prterun-h-123@1"}}, "Open MPI"},
      {{{"OMPI_MCA_ess_base_jobid", "12345"}}, "Open MPI"},
      {{{"PMI_RANK", "0"}, {"PMI_PORT", "h:4567"}}, "MPICH"},
      {{{"SLURM_JOB_ID", "7"}}, "Slurm"},
      {{{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"}},
       "TF_CONFIG"},
      {{{"DMLC_PS_ROOT_URI", "h"}, {"DMLC_PS_ROOT_PORT", "9000"}}, "DMLC"},
  };
  for (const Case& c : cases) {
    std::string kind, identity;
    EXPECT_TRUE(LauncherJobIdentity(c.env, &kind, &identity)) << c.kind;
    EXPECT_EQ(kind, c.kind);
  }
  // Two tasks of one TF job (different task) derive the same identity.
  std::string k1, i1, k2, i2;
  LauncherJobIdentity({{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"], "worker": ["b:2"]},
                                          "task": {"type": "ps", "index": 0}})"}},
                      &k1, &i1);
  LauncherJobIdentity({{"TF_CONFIG", R"({"task": {"type": "worker", "index": 0},
                                          "cluster": {"worker": ["b:2"], "ps": ["a:1"]}})"}},
                      &k2, &i2);
  EXPECT_EQ(i1, i2);
  std::string kind, identity;
  EXPECT_FALSE(LauncherJobIdentity({{"PMI_RANK", "0"}, {"PMI_FD", "5"}}, &kind, &identity))
      << "a PMI fd number is not a job identity";
  EXPECT_FALSE(LauncherJobIdentity({}, &kind, &identity));
  // No launcher: nothing derived, nothing invented.
  auto none = Resolve({{"RDMAPS_KEY_FILE", dir_ + "/key"}});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->value.empty());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/key")) << "a key was made for nothing";
}

// Regression: MPICH's hydra gives local ranks PMI_FD, not PMI_PORT, so no
// job identity: every rank then made a secret of its own and the rendezvous
// refused them all. A rank-based job derives from its rendezvous address.
TEST_F(SecretTest, RankedJobWithoutAJobIdDerivesFromItsRendezvous) {
  const Environment env = {{"PMI_RANK", "0"}, {"PMI_FD", "5"}, {"RDMAPS_KEY_FILE", dir_ + "/key"}};
  auto derive = [&](const std::string& rendezvous) {
    ClusterLayout layout;
    layout.source = "MPICH";
    layout.needs_rendezvous = true;
    layout.rendezvous = rendezvous;
    return ResolveJobSecret({}, env, layout);
  };
  auto a = derive("file:/tmp/job1/rdzv");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->value.empty()) << a->source;
  EXPECT_EQ(derive("file:/tmp/job1/rdzv")->value, a->value) << "two ranks of one job disagree";
  EXPECT_NE(derive("file:/tmp/job2/rdzv")->value, a->value) << "two jobs share a secret";
}

TEST_F(SecretTest, ResolveClusterFillsTheLayout) {
  Environment env = SlurmEnv();
  env["SLURM_PROCID"] = "0";
  env["SLURM_NTASKS"] = "2";
  env["SLURM_JOB_NODELIST"] = "node1";
  env["SLURM_NNODES"] = "1";
  auto layout = ResolveCluster({}, env);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->job_token.size(), 64u);
  EXPECT_THAT(layout->secret_source, HasSubstr("Slurm"));
}

TEST_F(SecretTest, WrittenSecretFileIsPrivateAndReadsBack) {
  const std::string path = dir_ + "/run/rdmaps/job-secret-1";
  const std::string secret = GenerateJobSecret();
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_NE(GenerateJobSecret(), secret);
  ASSERT_TRUE(WriteJobSecretFile(path, secret).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*ReadSecretFile(path), secret);
  EXPECT_EQ(DefaultJobSecretFile({{"XDG_RUNTIME_DIR", "/run/user/5"}}, 9),
            "/run/user/5/rdmaps/job-secret-9");
  EXPECT_EQ(DefaultJobSecretFile({}, 9), "");
}

}  // namespace
}  // namespace rdmaps::internal

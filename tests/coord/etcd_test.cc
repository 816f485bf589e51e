// The Coordinator against a real etcd (Debian's etcd-server), started by
// each case on free loopback ports with a data directory of its own and
// killed at the end: lease expiry removes the key, concurrent promotes have
// exactly one winner, a watch wakes on a change, a killed etcd is a clear
// Unavailable (never a hang), jobs are kept apart by their prefix, and an
// etcd with authentication takes our password and refuses a missing one.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "src/cluster/coord_failover.h"
#include "src/cluster/etcd_coordinator.h"
#include "src/cluster/lease_keeper.h"
#include "src/cluster/shard_map.h"
#include "tests/coord/failover_cases.h"

#ifndef RDMAPS_ETCD_BIN
#define RDMAPS_ETCD_BIN ""
#define RDMAPS_ETCDCTL_BIN ""
#endif

namespace rdmaps::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
CoordDeadline In(milliseconds ms) { return CoordClock::now() + ms; }

CoordinatorOptions Opts(std::string address, std::string prefix = "", std::string user = "",
                        std::string password_file = "", std::string ca = "") {
  CoordinatorOptions o;
  o.address = std::move(address);
  o.job_prefix = std::move(prefix);
  o.etcd_user = std::move(user);
  o.etcd_password_file = std::move(password_file);
  o.etcd_ca_file = std::move(ca);
  return o;
}

// A port nothing listens on right now (the kernel's choice for port 0).
// etcd cannot bind port 0 itself, so another process may take the port
// before etcd does; Start() retries with new ports when that happens.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs a program to completion within `guard`; its exit code (or -1).
int RunTool(std::vector<std::string> argv, seconds guard = seconds(30)) {
  const pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  const auto until = CoordClock::now() + guard;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (CoordClock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(10));  // polling a child's exit, bounded
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(RDMAPS_ETCD_BIN).empty()) {
      FAIL() << "etcd was not found at configure time: apt-get install etcd-server etcd-client";
    }
    char tmpl[] = "/tmp/rdmaps-etcd-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    Start();
  }
  void TearDown() override {
    Kill();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void Start() {
    for (int attempt = 0; attempt < 5; ++attempt) {
      const int client = FreePort();
      int peer = FreePort();
      while (peer == client) peer = FreePort();
      ASSERT_GT(client, 0);
      ASSERT_GT(peer, 0);
      endpoint_ = "127.0.0.1:" + std::to_string(client);
      const std::string c = "http://" + endpoint_;
      const std::string p = "http://127.0.0.1:" + std::to_string(peer);
      const std::string log = dir_ + "/etcd.log";
      std::filesystem::remove_all(dir_ + "/data");
      // Fast elections make etcd's minimum lease TTL 1 s (1.5 x the election
      // timeout, rounded up to seconds); etcd's defaults make it 2 s.
      std::vector<std::string> argv = {RDMAPS_ETCD_BIN,
                                       "--name",
                                       "t",
                                       "--data-dir",
                                       dir_ + "/data",
                                       "--listen-client-urls",
                                       c,
                                       "--advertise-client-urls",
                                       c,
                                       "--listen-peer-urls",
                                       p,
                                       "--initial-advertise-peer-urls",
                                       p,
                                       "--initial-cluster",
                                       "t=" + p};
      if (!default_flags_) {
        argv.insert(argv.end(), {"--heartbeat-interval", "50", "--election-timeout", "500"});
      }
      pid_ = fork();
      ASSERT_GE(pid_, 0);
      if (pid_ == 0) {
        int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        std::vector<char*> args;
        for (auto& a : argv) args.push_back(a.data());
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
      }
      auto probe = Open("probe/");
      const auto until = CoordClock::now() + seconds(30);
      for (;;) {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;
          const std::string text = ReadFile(log);
          if (text.find("address already in use") != std::string::npos) break;  // retry
          FAIL() << "etcd exited at start-up:\n" << text;
        }
        if (probe->Get("ready", In(milliseconds(500))).ok()) return;
        ASSERT_LT(CoordClock::now(), until) << "etcd not healthy in 30 s:\n" << ReadFile(log);
        std::this_thread::sleep_for(milliseconds(20));  // start-up poll, bounded
      }
    }
    FAIL() << "no free ports for etcd after 5 attempts";
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  std::unique_ptr<EtcdCoordinator> Open(const std::string& prefix, const std::string& user = "",
                                        const std::string& password = "") {
    EtcdOptions o;
    o.endpoints = {"http://" + endpoint_};
    o.prefix = prefix;
    o.user = user;
    o.password = password;
    auto c = EtcdCoordinator::Open(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  std::string dir_, endpoint_;
  pid_t pid_ = -1;
  bool default_flags_ = false;  // etcd's own election timing (users' etcds)
};

// An etcd started with none of our flags, as users run theirs.
class EtcdDefaultsTest : public EtcdTest {
 protected:
  EtcdDefaultsTest() { default_flags_ = true; }
};

TEST_F(EtcdTest, GetCasListDelete) {
  auto c = Open("job-1/");
  ASSERT_TRUE(c);
  auto none = c->Get("k", In(seconds(5)));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->kv);
  auto put = c->CompareAndSwap("k", 0, std::string("v\0\xff", 3), kNoLease, In(seconds(5)));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(put->swapped);
  auto again = c->CompareAndSwap("k", 0, "x", kNoLease, In(seconds(5)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->swapped);
  ASSERT_TRUE(again->current);
  EXPECT_EQ(again->current->value, std::string("v\0\xff", 3));
  EXPECT_EQ(again->current->mod_revision, put->revision);
  auto next = c->CompareAndSwap("k", put->revision, "w", kNoLease, In(seconds(5)));
  ASSERT_TRUE(next.ok() && next->swapped);
  ASSERT_TRUE(c->CompareAndSwap("m/a", 0, "1", kNoLease, In(seconds(5)))->swapped);
  ASSERT_TRUE(c->CompareAndSwap("m/b", 0, "2", kNoLease, In(seconds(5)))->swapped);
  auto l = c->List("m/", In(seconds(5)));
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->kvs.size(), 2u);
  EXPECT_EQ(l->kvs[1].key, "m/b");
  ASSERT_TRUE(c->Delete("k", In(seconds(5))).ok());
  EXPECT_FALSE(c->Get("k", In(seconds(5)))->kv);
  // Another job on the same etcd sees none of it.
  auto other = Open("job-2/");
  EXPECT_TRUE(other->List("", In(seconds(5)))->kvs.empty());
  EXPECT_EQ(c->List("", In(seconds(5)))->kvs.size(), 2u);
}

TEST_F(EtcdTest, LeaseExpiryRemovesTheKey) {
  auto c = Open("job/");
  auto lease = c->GrantLease(milliseconds(1000), In(seconds(5)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl, seconds(1));
  auto put = c->CompareAndSwap("servers/0", 0, "a", lease->id, In(seconds(5)));
  ASSERT_TRUE(put.ok() && put->swapped) << put.status();
  EXPECT_EQ(c->Get("servers/0", In(seconds(5)))->kv->lease, lease->id);
  // Not renewed: gone within the TTL plus etcd's expiry check (500 ms).
  auto woke = c->WaitForChange("servers/0", false, put->revision, In(seconds(10)));
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_FALSE(c->Get("servers/0", In(seconds(5)))->kv);
  EXPECT_EQ(c->KeepAlive(lease->id, In(seconds(5))).code(), StatusCode::kNotFound);
  EXPECT_EQ(c->CompareAndSwap("servers/0", 0, "a", lease->id, In(seconds(5))).status().code(),
            StatusCode::kNotFound);
}

TEST_F(EtcdTest, LeaseKeeperHoldsTheKeyAndStopRevokesIt) {
  auto c = Open("job/");
  LeaseKeeperOptions o;
  o.ttl = milliseconds(1000);
  o.key = "servers/3";
  o.value = "addr";
  auto k = LeaseKeeper::Start(c.get(), o, In(seconds(5)));
  ASSERT_TRUE(k.ok()) << k.status();
  auto held = c->Get("servers/3", In(seconds(5)));
  ASSERT_TRUE(held.ok() && held->kv);
  // Two and a half TTLs: renewals kept it.
  auto w = c->WaitForChange("servers/3", false, held->kv->mod_revision, In(milliseconds(2500)));
  EXPECT_EQ(w.status().code(), StatusCode::kTimedOut) << w.status();
  EXPECT_TRUE((*k)->Valid());
  (*k)->Stop();
  EXPECT_FALSE(c->Get("servers/3", In(seconds(5)))->kv);
}

TEST_F(EtcdTest, ConcurrentPromotesHaveExactlyOneWinner) {
  auto c = Open("job/");
  ASSERT_TRUE(CreateShardMap(*c, ShardMap{1, {{0, 1}, {1, 0}}}, In(seconds(5)))->won);
  constexpr int kDeciders = 6;
  std::vector<std::unique_ptr<EtcdCoordinator>> handles;
  for (int i = 0; i < kDeciders; ++i) handles.push_back(Open("job/"));
  std::atomic<int> winners{0}, losers{0};
  std::vector<std::string> errors(kDeciders);
  std::vector<std::thread> threads;
  for (int i = 0; i < kDeciders; ++i) {
    threads.emplace_back([&, i] {
      auto r = Promote(*handles[i], 0, 1, In(seconds(10)));
      if (!r.ok()) {
        errors[i] = r.status().ToString();
        return;
      }
      (r->won ? winners : losers)++;
      if (r->now.map.epoch != 2) errors[i] = "epoch " + std::to_string(r->now.map.epoch);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(losers.load(), kDeciders - 1);
  auto m = ReadShardMap(*c, In(seconds(5)));
  ASSERT_TRUE(m.ok() && *m);
  EXPECT_EQ((*m)->map, (ShardMap{2, {{1, kNoServer}, {1, 0}}}));
}

TEST_F(EtcdTest, WatchWakesOnChange) {
  auto c = Open("job/");
  auto d = Open("job/");
  const std::int64_t seen = c->Get("shard_map", In(seconds(5)))->revision;
  Result<std::int64_t> woke = TimedOutError("not run");
  std::thread waiter([&] { woke = c->WaitForChange("shard_map", false, seen, In(seconds(30))); });
  auto unrelated = d->CompareAndSwap("elsewhere", 0, "x", kNoLease, In(seconds(5)));
  auto put = d->CompareAndSwap("shard_map", 0, "m", kNoLease, In(seconds(5)));
  ASSERT_TRUE(put.ok() && put->swapped) << put.status();
  waiter.join();
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_EQ(*woke, put->revision);
  // A prefix watch, and a deadline that passes.
  auto members = d->CompareAndSwap("members/w1", 0, "", kNoLease, In(seconds(5)));
  auto prefixed = c->WaitForChange("members/", true, put->revision, In(seconds(5)));
  ASSERT_TRUE(prefixed.ok()) << prefixed.status();
  EXPECT_EQ(*prefixed, members->revision);
  auto idle = c->WaitForChange("shard_map", false, put->revision, In(milliseconds(300)));
  EXPECT_EQ(idle.status().code(), StatusCode::kTimedOut) << idle.status();
  (void)unrelated;
}

TEST_F(EtcdTest, AKilledEtcdIsUnavailableNotAHang) {
  auto c = Open("job/");
  ASSERT_TRUE(c->CompareAndSwap("k", 0, "v", kNoLease, In(seconds(5)))->swapped);
  const std::int64_t seen = c->Get("k", In(seconds(5)))->revision;
  Result<std::int64_t> watch = TimedOutError("not run");
  std::thread waiter([&] { watch = c->WaitForChange("k", false, seen, In(seconds(60))); });
  Kill();
  waiter.join();
  EXPECT_EQ(watch.status().code(), StatusCode::kUnavailable) << watch.status();
  const auto t0 = CoordClock::now();
  auto get = c->Get("k", In(seconds(60)));
  EXPECT_EQ(get.status().code(), StatusCode::kUnavailable) << get.status();
  EXPECT_NE(get.status().message().find(endpoint_), std::string::npos) << get.status();
  EXPECT_NE(get.status().message().find("endpoint health"), std::string::npos) << get.status();
  EXPECT_LT(CoordClock::now() - t0, seconds(30));  // refused at once, far before the deadline
  EXPECT_EQ(c->KeepAlive(1, In(seconds(60))).code(), StatusCode::kUnavailable);
}

TEST_F(EtcdTest, AuthenticatedEtcd) {
  const std::string ep = "--endpoints=http://" + endpoint_;
  ASSERT_EQ(RunTool({RDMAPS_ETCDCTL_BIN, ep, "user", "add", "root:secret-pw"}), 0);
  ASSERT_EQ(RunTool({RDMAPS_ETCDCTL_BIN, ep, "auth", "enable"}), 0);
  auto anonymous = Open("job/");
  auto refused = anonymous->Get("k", In(seconds(5)));
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status();
  // Through CoordinatorOptions, the password from a private file.
  const std::string pw = dir_ + "/pw";
  {
    std::ofstream f(pw);
    f << "secret-pw\n";
  }
  chmod(pw.c_str(), 0600);
  auto c = OpenCoordinator(Opts("etcd://" + endpoint_, "job/", "root", pw));
  ASSERT_TRUE(c.ok()) << c.status();
  auto put = (*c)->CompareAndSwap("k", 0, "v", kNoLease, In(seconds(5)));
  ASSERT_TRUE(put.ok() && put->swapped) << put.status();
  auto wrong = dir_ + "/wrong";
  {
    std::ofstream f(wrong);
    f << "nope\n";
  }
  chmod(wrong.c_str(), 0600);
  auto bad = OpenCoordinator(Opts("etcd://" + endpoint_, "", "root", wrong));
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status();
}

// The coordinator-backed FailoverDecider across handles of one real etcd
// (each one a process of the job): one decision per epoch, waiters wake, the
// primary's lease is watched (tests/coord/failover_cases.h).
TEST_F(EtcdTest, FailoverDeciderOnEtcd) {
  auto open = [&]() -> std::shared_ptr<FailoverDecider> {
    std::shared_ptr<Coordinator> c = Open("failover-job/");
    if (!c) return nullptr;
    CoordFailoverOptions o;
    o.lease_ttl = milliseconds(1000);  // etcd's minimum here (whole seconds)
    return std::make_shared<CoordFailoverDecider>(c, o);
  };
  failover_cases::ConcurrentReportsMakeOneDecision(open);
  failover_cases::WaiterWakesOnPromotion(open);
  failover_cases::WatchFiresWhenThePrimaryLeaseGoes(open);
  // The records are the documented text (etcdctl shows them).
  auto c = Open("failover-job/");
  auto r = c->Get(FailoverShardKey(3), In(seconds(5)));
  ASSERT_TRUE(r.ok() && r->kv) << r.status();
  EXPECT_EQ(r->kv->value, "rdmaps failover shard v1\nepoch 2\nprimary q:2\nbackup -\n");
}

}  // namespace
}  // namespace rdmaps::internal

namespace rdmaps::internal {
namespace {

// On an etcd with its default flags a lease is at least 2 s, yet a primary
// that stops beating is found within lease_ttl (750 ms) by the backup's own
// clock while its lease still holds.
TEST_F(EtcdDefaultsTest, AHungPrimaryIsDetectedByItsHeartbeatWithinTheTtl) {
  auto grant = Open("defaults/")->GrantLease(milliseconds(750), In(seconds(5)));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_GE(grant->ttl, seconds(2)) << "etcd's default minimum TTL";
  auto open = [&]() -> std::shared_ptr<FailoverDecider> {
    std::shared_ptr<Coordinator> c = Open("defaults-job/");
    if (!c) return nullptr;
    return std::make_shared<CoordFailoverDecider>(c);  // lease_ttl 750 ms
  };
  failover_cases::AHungPrimaryIsDetectedByItsHeartbeat(open, kDefaultLeaseTtl);
}

}  // namespace
}  // namespace rdmaps::internal

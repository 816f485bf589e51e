// Elastic workers (ServerOptions::max_workers; docs/ps.md "Elastic workers")
// on fake and tcp: workers join a running job at the members' clock, leave
// it by Close() or by dying, and the clocks, SSP/BSP gates and barriers of
// the rest count current members only. Every case keeps a counting table:
// row w holds the number of pushes worker slot w made (each push adds 1), so
// the state equals the sum of the acknowledged pushes exactly, and a push
// applied twice (or lost) shows as a wrong count.
//
// The processes case (tcp) forks a worker that joins, then SIGSTOPs it (the
// members' BSP wait names it at its deadline) and kill -9s it (the members
// go on without it).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/client.h"
#include "rdmaps/log.h"
#include "rdmaps/server.h"
#include "src/base/mutex.h"
#include "src/ps/test_hooks.h"
#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

constexpr std::uint32_t kServers = 2;
constexpr std::uint32_t kInitial = 2;
constexpr std::uint32_t kMax = 4;
constexpr std::uint32_t kCount = 1;  // the counting table: row w counts w's pushes

std::vector<TableOptions> Tables() {
  // One row per worker slot over 2 servers (rows 0-1 on server 0, 2-3 on
  // server 1): a push of -1 adds 1 (SGD, lr 1). BSP.
  return {MakeTable(kCount, "count", kMax, 1, kBsp)};
}

class ElasticTest : public ::testing::TestWithParam<PsBackend> {
 protected:
  void SetUp() override {
    if (const std::string why = SkipReason(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
  const std::string& transport() const { return GetParam().transport; }

  void StartServers(std::uint32_t max_workers = kMax, const std::string& checkpoint_dir = "") {
    for (std::uint32_t i = 0; i < kServers; ++i) {
      ServerOptions o = MakeServerOptions(transport(), i, kServers, kInitial, Tables());
      o.max_workers = max_workers;
      o.checkpoint_dir = checkpoint_dir;
      o.checkpoint_every = checkpoint_dir.empty() ? 0 : 2;
      auto s = Server::Start(o);
      ASSERT_TRUE(s.ok()) << s.status();
      addresses_.push_back((*s)->address());
      servers_.push_back(std::move(s).value());
    }
  }

  ClientOptions Options(std::uint32_t id) const {
    ClientOptions o = MakeClientOptions(transport(), id, kInitial, addresses_);
    o.max_workers = kMax;
    o.clock_waits = false;  // one thread drives several workers
    o.wait_timeout = std::chrono::seconds(10);
    return o;
  }

  std::unique_ptr<Client> Connect(std::uint32_t id) {
    auto c = Client::Connect(Options(id));
    EXPECT_TRUE(c.ok()) << "worker " << id << ": " << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // One iteration of worker `id`: +1 on its row, then Clock().
  void Round(Client& c) {
    const float grad = -1.0f;
    ASSERT_TRUE(c.Push(kCount, RowRange{c.worker_id(), 1}, {&grad, 1}).ok());
    pushes_[c.worker_id()] += 1;
    ASSERT_TRUE(c.Clock().ok());
  }

  // Waits (bounded) until every server's membership epoch is `epoch`.
  void AwaitEpoch(std::uint32_t epoch) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (auto& s : servers_) {
      while (s->stats().membership_epoch != epoch && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling a deadline
      }
      EXPECT_EQ(s->stats().membership_epoch, epoch) << "server " << &s - &servers_[0];
    }
  }

  // The counting table as the servers hold it.
  std::vector<float> Counts() {
    std::vector<float> all, part;
    for (std::uint32_t i = 0; i < kServers; ++i) {
      EXPECT_TRUE(servers_[i]->ReadLocal(kCount, RowRange{2 * i, 2}, &part).ok());
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }

  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::uint64_t> pushes_ = std::vector<std::uint64_t>(kMax, 0);
};

// The library's INFO lines, kept while it lives.
class LogCapture {
 public:
  LogCapture() {
    SetMinLogSeverity(LogSeverity::kInfo);
    SetLogSink([this](LogSeverity, std::string_view, int, std::string_view message) {
      MutexLock lock(mu_);
      lines_ += std::string(message) + "\n";
    });
  }
  ~LogCapture() {
    SetLogSink(nullptr);
    SetMinLogSeverity(LogSeverity::kWarning);
  }
  std::string lines() {
    MutexLock lock(mu_);
    return lines_;
  }

 private:
  Mutex mu_;
  std::string lines_ RDMAPS_GUARDED_BY(mu_);
};

// Join at the members' clock, be counted by BSP, die, be left out, leave by
// Close(), rejoin a slot a dead worker left: the counts stay exact and every
// server logs each change with its epoch.
TEST_P(ElasticTest, JoinLeaveDieRejoinKeepExactCounts) {
  LogCapture log;
  ASSERT_NO_FATAL_FAILURE(StartServers());
  auto w0 = Connect(0), w1 = Connect(1);
  ASSERT_TRUE(w0 && w1);
  for (int r = 0; r < 3; ++r) {
    Round(*w0);
    Round(*w1);
  }
  // Join at the current minimum clock (3), a member of every server at once.
  auto w2 = Connect(2);
  ASSERT_TRUE(w2);
  EXPECT_EQ(w2->clock(), 3u);
  for (auto& s : servers_) {
    EXPECT_EQ(s->stats().membership_epoch, 1u);
    EXPECT_EQ(s->stats().members, 3u);
  }
  // The joiner holds BSP back like any member: with w0 and w1 at 4, the
  // servers' minimum stays 3 until w2 clocks.
  Round(*w0);
  Round(*w1);
  ASSERT_TRUE(w0->Flush().ok());
  ASSERT_TRUE(w1->Flush().ok());
  for (auto& s : servers_) EXPECT_EQ(s->stats().min_clock, 3u);
  Round(*w2);
  ASSERT_TRUE(w2->Flush().ok());
  for (auto& s : servers_) EXPECT_EQ(s->stats().min_clock, 4u);

  // A fourth joins at 4, pushes once acknowledged (Flush), once more, dies.
  auto w3 = Connect(3);
  ASSERT_TRUE(w3);
  EXPECT_EQ(w3->clock(), 4u);
  const float grad = -1.0f;
  ASSERT_TRUE(w3->Push(kCount, RowRange{3, 1}, {&grad, 1}).ok());
  ASSERT_TRUE(w3->Flush().ok());
  ASSERT_TRUE(w3->Push(kCount, RowRange{3, 1}, {&grad, 1}).ok());  // not acknowledged
  internal::TEST_Abandon(*w3);
  // BSP goes on without it: a pull at clock 5 needs every member at 5.
  Round(*w0);
  Round(*w1);
  Round(*w2);
  std::vector<float> out(kMax);
  ASSERT_TRUE(w0->Pull(kCount, RowRange{0, kMax}, out).ok());
  AwaitEpoch(3);  // joined, joined, died
  // A barrier of the three members (the dead one and the vacant slot are
  // not waited for).
  {
    std::vector<Status> st(3);
    std::vector<std::thread> t;
    Client* cs[] = {w0.get(), w1.get(), w2.get()};
    for (int i = 0; i < 3; ++i) t.emplace_back([&, i] { st[i] = cs[i]->Barrier(); });
    for (auto& th : t) th.join();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(st[i].ok()) << "worker " << i << ": " << st[i];
  }
  // Graceful leave, then the two go on.
  ASSERT_TRUE(w2->Close().ok());
  Round(*w0);
  Round(*w1);
  ASSERT_TRUE(w0->Pull(kCount, RowRange{0, kMax}, out).ok());
  AwaitEpoch(4);
  // A fresh worker takes the slot the dead one left: its ring starts again
  // at seq 1, every push of it applied once.
  auto again = Connect(3);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->clock(), 6u);
  Round(*again);
  ASSERT_TRUE(again->Flush().ok());
  AwaitEpoch(5);
  ASSERT_TRUE(w0->Flush().ok());
  ASSERT_TRUE(w1->Flush().ok());

  const std::vector<float> counts = Counts();
  EXPECT_EQ(counts[0], static_cast<float>(pushes_[0]));
  EXPECT_EQ(counts[1], static_cast<float>(pushes_[1]));
  EXPECT_EQ(counts[2], static_cast<float>(pushes_[2]));
  // Slot 3: the dead worker's acknowledged push, perhaps its last one (it
  // was written before the death), and the new worker's push: never more.
  EXPECT_GE(counts[3], 2.0f);
  EXPECT_LE(counts[3], 3.0f);
  for (auto& s : servers_) {
    EXPECT_EQ(s->stats().protocol_errors, 0u);
    EXPECT_EQ(s->stats().members, 3u);  // w0, w1, the new 3
  }
  const std::string lines = log.lines();
  for (const char* line : {
           "membership epoch 0: workers [0, 2) of 4 slots, at clock 0",
           "membership epoch 1: worker 2 joined at clock 3",
           "membership epoch 2: worker 3 joined at clock 4",
           "membership epoch 3: worker 3 left (died) at clock 4",
           "membership epoch 4: worker 2 left (graceful) at clock 5",
           "membership epoch 5: worker 3 joined at clock 6",
       }) {
    for (std::uint32_t i = 0; i < kServers; ++i) {
      const std::string want = "ps server " + std::to_string(i) + ": " + line;
      EXPECT_NE(lines.find(want), std::string::npos) << want << "\nin:\n" << lines;
    }
  }
  ASSERT_TRUE(again->Close().ok());
  ASSERT_TRUE(w0->Close().ok());
  ASSERT_TRUE(w1->Close().ok());
  // Every worker that came has gone: the servers finish, a death in elastic
  // mode being a leave, not an error.
  for (auto& s : servers_) {
    EXPECT_TRUE(s->RunUntil(std::chrono::steady_clock::now() + std::chrono::seconds(10)).ok());
  }
}

// A worker slot is held by one live worker: a second Connect with its id is
// refused (the launcher gives each joiner a free id); ids past max_workers
// are refused before anything is sent.
TEST_P(ElasticTest, LiveSlotAndOutOfRangeIdsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartServers());
  auto w0 = Connect(0);
  ASSERT_TRUE(w0);
  ClientOptions dup = Options(0);
  dup.connect_timeout = std::chrono::milliseconds(500);
  auto refused = Client::Connect(dup);
  EXPECT_FALSE(refused.ok());
  ClientOptions far = Options(kMax);
  auto bad = Client::Connect(far);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("max_workers"), std::string::npos) << bad.status();
  ServerOptions so = MakeServerOptions(transport(), 0, 1, 3, Tables());
  so.max_workers = 2;
  auto small = Server::Start(so);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("max_workers"), std::string::npos) << small.status();
  // The live worker was not disturbed.
  Round(*w0);
  ASSERT_TRUE(w0->Flush().ok());
  EXPECT_EQ(Counts()[0], 1.0f);
}

// A joiner arriving while a barrier is under way is not waited for by it.
TEST_P(ElasticTest, JoinDuringBarrierDoesNotHoldIt) {
  ASSERT_NO_FATAL_FAILURE(StartServers());
  auto w0 = Connect(0), w1 = Connect(1);
  ASSERT_TRUE(w0 && w1);
  Status s0;
  std::thread t([&] { s0 = w0->Barrier(); });
  // Once w0 has arrived at barrier 1 on server 0, w2 joins: barrier 1 ends
  // when w1 arrives, without w2, whose first Barrier() is the members' next.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (servers_[0]->stats().barrier_arrivals < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling a deadline
  }
  ASSERT_EQ(servers_[0]->stats().barrier_arrivals, 1u);
  auto w2 = Connect(2);
  ASSERT_TRUE(w2);
  EXPECT_TRUE(w1->Barrier().ok());
  t.join();
  EXPECT_TRUE(s0.ok()) << s0;
  std::vector<Status> st(3);
  std::vector<std::thread> ts;
  Client* cs[] = {w0.get(), w1.get(), w2.get()};
  for (int i = 0; i < 3; ++i) ts.emplace_back([&, i] { st[i] = cs[i]->Barrier(); });
  for (auto& th : ts) th.join();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(st[i].ok()) << "worker " << i << ": " << st[i];
}

// A checkpoint cut counts members only: a worker that died before it is not
// waited for, one that joined is (the checkpoint at clock 2 needs w0 and the
// joiner w2, not the dead w1), and the checkpoint holds the exact counts.
TEST_P(ElasticTest, CheckpointCutCountsMembersOnly) {
  const ScopedTempDir tmp("rdmaps-elastic");
  ASSERT_FALSE(tmp.path.empty());
  const std::string& dir = tmp.path;
  ASSERT_NO_FATAL_FAILURE(StartServers(kMax, dir));
  auto w0 = Connect(0), w1 = Connect(1);
  ASSERT_TRUE(w0 && w1);
  Round(*w0);
  Round(*w1);
  auto w2 = Connect(2);
  ASSERT_TRUE(w2);
  EXPECT_EQ(w2->clock(), 1u);
  internal::TEST_Abandon(*w1);
  Round(*w0);
  Round(*w2);
  // Durable within wait_timeout (10 s), not checkpoint_timeout (600 s).
  auto ck = w0->Checkpoint();
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->clock, 2u);
  auto ck2 = w2->Checkpoint();
  ASSERT_TRUE(ck2.ok()) << ck2.status();
  const std::vector<float> counts = Counts();
  EXPECT_EQ(counts[0], 2.0f);
  EXPECT_EQ(counts[1], 1.0f);
  EXPECT_EQ(counts[2], 1.0f);
}

// Without max_workers a worker that dies still fails the others' waits,
// naming it (the fixed-membership behaviour).
TEST_P(ElasticTest, WithoutMaxWorkersADeadWorkerIsNamed) {
  ASSERT_NO_FATAL_FAILURE(StartServers(/*max_workers=*/0));
  ClientOptions o0 = Options(0), o1 = Options(1);
  o0.max_workers = o1.max_workers = 0;
  auto w0 = Client::Connect(o0), w1 = Client::Connect(o1);
  ASSERT_TRUE(w0.ok() && w1.ok());
  internal::TEST_Abandon(**w1);
  Round(**w0);
  std::vector<float> out(kMax);
  const Status st = (*w0)->Pull(kCount, RowRange{0, kMax}, out);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("worker 1 died"), std::string::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(Fake, ElasticTest, ::testing::Values(FakeBackend()), PsBackendName);
INSTANTIATE_TEST_SUITE_P(Tcp, ElasticTest, ::testing::Values(TcpBackend()), PsBackendName);

// ---- processes (tcp): SIGSTOP and kill -9 of a worker that joined ----------------

bool ReadFor(int fd, void* p, std::size_t n, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t k = read(fd, c, n);
    if (k <= 0) return false;
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// The joining worker: reads the servers' addresses, joins as worker 2 (BSP,
// clock waits on), then forever pushes +1 on row 2, flushes and reports the
// count of its acknowledged pushes, and clocks.
[[noreturn]] void JoinerChild(int in, int out) {
  char buf[2][64];
  if (!ReadFor(in, buf, sizeof(buf), std::chrono::seconds(30))) _exit(2);
  ClientOptions o = MakeClientOptions("tcp", 2, kInitial, {buf[0], buf[1]});
  o.max_workers = kMax;
  o.wait_timeout = std::chrono::seconds(30);
  auto c = Client::Connect(o);
  if (!c.ok()) _exit(3);
  const float grad = -1.0f;
  for (std::uint64_t acked = 1;; ++acked) {
    if (!(*c)->Push(kCount, RowRange{2, 1}, {&grad, 1}).ok()) _exit(4);
    if (!(*c)->Flush().ok()) _exit(5);
    if (write(out, &acked, sizeof(acked)) != sizeof(acked)) _exit(6);
    if (!(*c)->Clock().ok()) _exit(7);
  }
}

TEST(ElasticProcessTest, StoppedJoinerIsNamedKilledJoinerIsLeftOut) {
  // Fork first, while this process has no threads; the child waits for the
  // addresses of the servers started afterwards.
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(to_child[1]);
    close(from_child[0]);
    JoinerChild(to_child[0], from_child[1]);
  }
  close(to_child[0]);
  close(from_child[1]);
  struct Reap {
    pid_t pid;
    ~Reap() {
      if (pid <= 0) return;  // (kill(-1) would signal every process of the user)
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reap{pid};

  std::vector<std::unique_ptr<Server>> servers;
  char addr[2][64] = {};
  std::vector<std::string> addresses;
  for (std::uint32_t i = 0; i < kServers; ++i) {
    ServerOptions o = MakeServerOptions("tcp", i, kServers, kInitial, Tables());
    o.max_workers = kMax;
    auto s = Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    std::snprintf(addr[i], sizeof(addr[i]), "%s", (*s)->address().c_str());
    addresses.push_back((*s)->address());
    servers.push_back(std::move(s).value());
  }
  std::vector<std::unique_ptr<Client>> w;
  for (std::uint32_t id = 0; id < kInitial; ++id) {
    ClientOptions o = MakeClientOptions("tcp", id, kInitial, addresses);
    o.max_workers = kMax;
    o.clock_waits = false;
    o.wait_timeout = std::chrono::milliseconds(1500);
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    w.push_back(std::move(c).value());
  }
  ASSERT_EQ(write(to_child[1], addr, sizeof(addr)), static_cast<ssize_t>(sizeof(addr)));
  // Train together until the joiner has 3 acknowledged pushes.
  const float grad = -1.0f;
  std::uint64_t pushes = 0, acked = 0;
  std::vector<float> out(kMax);
  while (acked < 3) {
    for (auto& c : w) {
      ASSERT_TRUE(c->Push(kCount, RowRange{c->worker_id(), 1}, {&grad, 1}).ok());
      ASSERT_TRUE(c->Clock().ok());
    }
    ++pushes;
    ASSERT_TRUE(ReadFor(from_child[0], &acked, sizeof(acked), std::chrono::seconds(30)))
        << "the joiner did not report";
  }
  // SIGSTOP: the joiner is at most one clock past the members now; two more
  // and a BSP pull waits for it, naming it when wait_timeout runs out.
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  for (int r = 0; r < 2; ++r) {
    for (auto& c : w) {
      ASSERT_TRUE(c->Push(kCount, RowRange{c->worker_id(), 1}, {&grad, 1}).ok());
      ASSERT_TRUE(c->Clock().ok());
    }
    ++pushes;
  }
  const auto start = std::chrono::steady_clock::now();
  Status st = w[0]->Pull(kCount, RowRange{0, kMax}, out);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kTimedOut) << st;
  EXPECT_NE(st.message().find("worker 2"), std::string::npos) << st;
  EXPECT_LT(waited, std::chrono::seconds(5)) << "waited past its deadline";
  // kill -9: the servers see its connections drop and leave it out.
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  reap.pid = -1;
  while (ReadFor(from_child[0], &acked, sizeof(acked), std::chrono::milliseconds(100))) {
  }
  st = Status::OK();
  // The members' pull goes through once the servers saw the death (within
  // wait_timeout; retried once in case the first wait ended just before).
  for (int attempt = 0; attempt < 2; ++attempt) {
    st = w[0]->Pull(kCount, RowRange{0, kMax}, out);
    if (st.ok()) break;
  }
  ASSERT_TRUE(st.ok()) << st;
  for (auto& c : w) ASSERT_TRUE(c->Flush().ok());
  std::vector<float> counts, part;
  for (std::uint32_t i = 0; i < kServers; ++i) {
    ASSERT_TRUE(servers[i]->ReadLocal(kCount, RowRange{2 * i, 2}, &part).ok());
    counts.insert(counts.end(), part.begin(), part.end());
  }
  EXPECT_EQ(counts[0], static_cast<float>(pushes));
  EXPECT_EQ(counts[1], static_cast<float>(pushes));
  // Every acknowledged push of the joiner, and at most the one it had in
  // flight when it was stopped.
  EXPECT_GE(counts[2], static_cast<float>(acked));
  EXPECT_LE(counts[2], static_cast<float>(acked + 1));
  for (auto& s : servers) {
    EXPECT_EQ(s->stats().membership_epoch, 2u);  // joined, died
    EXPECT_EQ(s->stats().protocol_errors, 0u);
  }
  close(to_child[1]);
  close(from_child[0]);
}

}  // namespace
}  // namespace rdmaps::testing

// The start-up rendezvous, with every process as a thread of this test. The
// root listens on port 0 and publishes its address in a file (the
// --rendezvous=file:PATH form), so no test uses a fixed port.
#include "src/cluster/rendezvous.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "src/base/fd.h"
#include "src/base/host_port.h"
#include "src/base/secret.h"
#include "src/cluster/resolve.h"

namespace rdmaps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// glog formats times with localtime; with TZ unset glibc frees and strdups
// the zone name on every call under its own (uninstrumented) lock, which
// TSan reports when several threads log. Name the zone once, before main().
[[maybe_unused]] const bool kZoneSet = [] {
  setenv("TZ", ":/etc/localtime", /*overwrite=*/0);
  tzset();
  return true;
}();

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    path_ = ::testing::TempDir() + "rdmaps_rdzv_" + std::to_string(getpid()) + "_" +
            std::to_string(counter++);
    std::remove(path_.c_str());
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // A rank-based layout as ResolveCluster builds it for rank `rank`.
  ClusterLayout Ranked(int rank, int world, int servers) const {
    ClusterLayout l;
    l.source = "test";
    l.needs_rendezvous = true;
    l.rendezvous = "file:" + path_;
    l.rank = rank;
    l.world_size = world;
    l.num_servers = servers;
    l.num_workers = world - servers;
    l.role = rank < servers ? Role::kServer : Role::kWorker;
    l.index = rank < servers ? rank : rank - servers;
    l.advertise_host = "127.0.0.1";
    return l;
  }
  static std::string ServerAddress(int rank) { return "127.0.0.1:" + std::to_string(20000 + rank); }

  // Runs fn(i) for i in [0, n) on n threads; returns their results.
  static std::vector<Result<ClusterLayout>> RunAll(
      int n, const std::function<Result<ClusterLayout>(int)>& fn) {
    std::vector<std::optional<Result<ClusterLayout>>> out(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] { out[static_cast<std::size_t>(i)].emplace(fn(i)); });
    }
    for (auto& t : threads) t.join();
    std::vector<Result<ClusterLayout>> results;
    for (auto& o : out) results.push_back(std::move(*o));
    return results;
  }

  ClusterOptions Opts(std::chrono::milliseconds timeout = 10s) const {
    ClusterOptions o;
    o.startup_timeout = timeout;
    return o;
  }

  std::string path_;
};

TEST_F(RendezvousTest, RanksLearnEveryServerAddress) {
  constexpr int kWorld = 5, kServers = 2;
  auto results = RunAll(kWorld, [&](int rank) {
    ClusterLayout l = Ranked(rank, kWorld, kServers);
    std::string self = rank < kServers ? ServerAddress(rank) : "";
    return CompleteCluster(l, self, Opts());
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto& r = results[static_cast<std::size_t>(rank)];
    ASSERT_TRUE(r.ok()) << "rank " << rank << ": " << r.status();
    EXPECT_FALSE(r->needs_rendezvous);
    EXPECT_THAT(r->servers, ElementsAre(ServerAddress(0), ServerAddress(1)));
    EXPECT_EQ(r->workers.size(), 3u);
    EXPECT_EQ(r->role, rank < kServers ? Role::kServer : Role::kWorker);
    EXPECT_EQ(r->index, rank < kServers ? rank : rank - kServers);
    if (rank < kServers) {
      EXPECT_EQ(r->listen_address, ServerAddress(rank));
    }
  }
}

TEST_F(RendezvousTest, StaleRendezvousFileFromAnEarlierJobIsReplaced) {
  std::ofstream(path_) << "127.0.0.1:1\n";  // nobody listens on port 1
  auto results = RunAll(3, [&](int rank) {
    ClusterLayout l = Ranked(rank, 3, 1);
    return CompleteCluster(l, rank == 0 ? ServerAddress(0) : "", Opts());
  });
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->servers, ElementsAre(ServerAddress(0)));
  }
}

TEST_F(RendezvousTest, DeadlineNamesTheRanksThatNeverArrived) {
  constexpr int kWorld = 4, kServers = 1;
  // Rank 3 (worker2) is never started.
  auto results = RunAll(3, [&](int rank) {
    ClusterLayout l = Ranked(rank, kWorld, kServers);
    return CompleteCluster(l, rank == 0 ? ServerAddress(0) : "", Opts(600ms));
  });
  for (int rank = 0; rank < 3; ++rank) {
    const auto& r = results[static_cast<std::size_t>(rank)];
    ASSERT_FALSE(r.ok()) << "rank " << rank;
    EXPECT_EQ(r.status().code(), StatusCode::kTimedOut) << r.status();
    // Every waiting process, not only the root, names the missing rank.
    EXPECT_THAT(r.status().message(), HasSubstr("rank 3 (worker2)")) << "rank " << rank;
    EXPECT_THAT(r.status().message(), HasSubstr("1 process(es) never arrived"));
  }
}

TEST_F(RendezvousTest, JoinerWithoutRootTimesOutNamingTheRoot) {
  ClusterLayout l = Ranked(1, 2, 1);
  auto r = CompleteCluster(l, "", Opts(300ms));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTimedOut);
  EXPECT_THAT(r.status().message(), HasSubstr("could not reach rank 0"));
}

TEST_F(RendezvousTest, PsLiteSchedulerAssignsIndicesInArrivalOrder) {
  // Process 0 is the scheduler, 1-2 servers, 3-5 workers.
  auto results = RunAll(6, [&](int i) {
    ClusterLayout l;
    l.source = "DMLC";
    l.needs_rendezvous = true;
    l.rendezvous = "file:" + path_;
    l.rank = -1;
    l.index = -1;
    l.num_servers = 2;
    l.num_workers = 3;
    l.world_size = 5;
    l.advertise_host = "127.0.0.1";
    l.role = i == 0 ? Role::kScheduler : i <= 2 ? Role::kServer : Role::kWorker;
    return CompleteCluster(l, l.role == Role::kServer ? ServerAddress(i) : "", Opts());
  });
  std::vector<int> server_idx, worker_idx;
  for (int i = 0; i < 6; ++i) {
    const auto& r = results[static_cast<std::size_t>(i)];
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    ASSERT_EQ(r->servers.size(), 2u);
    EXPECT_THAT(r->servers, ::testing::UnorderedElementsAre(ServerAddress(1), ServerAddress(2)));
    if (r->role == Role::kServer) {
      server_idx.push_back(r->index);
      EXPECT_EQ(r->servers[static_cast<std::size_t>(r->index)], ServerAddress(i));
    }
    if (r->role == Role::kWorker) worker_idx.push_back(r->index);
  }
  EXPECT_EQ(results[0]->role, Role::kScheduler);
  std::sort(server_idx.begin(), server_idx.end());
  std::sort(worker_idx.begin(), worker_idx.end());
  EXPECT_THAT(server_idx, ElementsAre(0, 1));
  EXPECT_THAT(worker_idx, ElementsAre(0, 1, 2));
}

TEST_F(RendezvousTest, WrongJobSecretIsRefusedAndTheRootKeepsWaiting) {
  std::thread root([&] {
    ClusterLayout l = Ranked(0, 2, 1);
    l.job_token = "right";
    auto r = CompleteCluster(l, ServerAddress(0), Opts());
    EXPECT_TRUE(r.ok()) << r.status();
  });
  ClusterLayout stranger = Ranked(1, 2, 1);
  stranger.job_token = "wrong";
  auto refused = CompleteCluster(stranger, "", Opts());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("job secret mismatch"));
  EXPECT_THAT(refused.status().message(), HasSubstr("RDMAPS_JOB_SECRET_FILE"));
  ClusterLayout member = Ranked(1, 2, 1);
  member.job_token = "right";
  auto ok = CompleteCluster(member, "", Opts());
  EXPECT_TRUE(ok.ok()) << ok.status();
  root.join();
}

TEST_F(RendezvousTest, ShapeMismatchFailsEveryone) {
  auto results = RunAll(2, [&](int rank) {
    ClusterLayout l = Ranked(rank, 3, 1);
    if (rank == 1) {
      l.world_size = 4;  // this rank was launched with a different -np
      l.num_workers = 3;
    }
    return CompleteCluster(l, rank == 0 ? ServerAddress(0) : "", Opts(5s));
  });
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("different job shape"));
  }
}

TEST_F(RendezvousTest, DuplicateRankFailsEveryone) {
  auto results = RunAll(3, [&](int i) {
    ClusterLayout l = Ranked(i == 2 ? 1 : i, 3, 1);
    return CompleteCluster(l, i == 0 ? ServerAddress(0) : "", Opts(5s));
  });
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("rank 1 joined twice"));
  }
}

TEST_F(RendezvousTest, DuplicateServerAddressesFailEveryone) {
  auto results = RunAll(3, [&](int rank) {
    ClusterLayout l = Ranked(rank, 3, 2);
    return CompleteCluster(l, rank < 2 ? ServerAddress(0) : "", Opts(5s));
  });
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("ps0 and ps1 both report"));
  }
}

// A hand-written joiner: connects to the root named in `path`, reads its
// challenge, and sends `hello` (or, with `proof_for`, a hello whose MAC it
// computes over that nonce instead of the root's).
struct RawJoiner {
  Fd fd;
  std::array<std::uint8_t, 16> root_nonce{};

  bool Connect(const std::string& path) {
    std::string addr;
    for (int i = 0; i < 500 && addr.empty(); ++i) {
      std::ifstream(path) >> addr;
      if (addr.empty()) std::this_thread::sleep_for(10ms);  // the root's file is not there yet
    }
    auto hp = ParseHostPort(addr, "root");
    if (!hp.ok()) return false;
    fd = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(hp->port));
    inet_pton(AF_INET, hp->host.c_str(), &sa.sin_addr);
    timeval tv{10, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return false;
    std::array<std::byte, sizeof(internal::ChallengeHeader)> c;
    if (::recv(fd.get(), c.data(), c.size(), MSG_WAITALL) != static_cast<ssize_t>(c.size())) {
      return false;
    }
    auto n = internal::ParseRendezvousChallenge(c);
    if (!n.ok()) return false;
    root_nonce = *n;
    return true;
  }
  // The hello of `rank` in a world of 3 (1 ps) with a MAC over `nonce`.
  static std::string Hello(int rank, const std::string& secret,
                           const std::array<std::uint8_t, 16>& nonce) {
    internal::HelloHeader h{};
    h.magic = htobe32(internal::kRendezvousHelloMagic);
    h.version = htobe16(internal::kRendezvousVersion);
    h.role = static_cast<std::uint8_t>(Role::kWorker);
    h.rank = static_cast<std::int32_t>(htobe32(static_cast<std::uint32_t>(rank)));
    h.world_size = htobe32(3);
    h.num_servers = htobe32(1);
    h.num_workers = htobe32(2);
    const std::string address = "127.0.0.1";
    h.addr_len = htobe32(static_cast<std::uint32_t>(address.size()));
    const Nonce mine = RandomNonce();
    std::copy(mine.begin(), mine.end(), h.nonce);
    std::vector<std::uint8_t> bound;
    for (std::uint64_t v :
         {std::uint64_t{h.role}, std::uint64_t{3}, std::uint64_t{1}, std::uint64_t{2}}) {
      for (int i = 0; i < 8; ++i) bound.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
    }
    bound.insert(bound.end(), address.begin(), address.end());
    HandshakeTranscript t;
    t.protocol = "rendezvous";
    t.version = internal::kRendezvousVersion;
    t.direction = MacDirection::kConnector;
    t.connector_nonce = mine;
    t.acceptor_nonce = nonce;
    t.connector_id = static_cast<std::uint32_t>(rank);
    t.bound = bound;
    const Mac m = HandshakeMac(SecretKey::FromSecret(secret), t);
    std::copy(m.begin(), m.end(), h.mac);
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + address;
  }
  bool Send(const std::string& bytes) {
    return ::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // The answer's status code (0xff: none).
  std::uint8_t AnswerCode() {
    std::vector<std::byte> b(sizeof(internal::AnswerHeader));
    if (::recv(fd.get(), b.data(), b.size(), MSG_WAITALL) != static_cast<ssize_t>(b.size())) {
      return 0xff;
    }
    internal::AnswerHeader h;
    std::memcpy(&h, b.data(), sizeof(h));
    b.resize(b.size() + be32toh(h.body_len));
    if (::recv(fd.get(), b.data() + sizeof(h), b.size() - sizeof(h), MSG_WAITALL) !=
        static_cast<ssize_t>(b.size() - sizeof(h))) {
      return 0xff;
    }
    auto a = internal::ParseRendezvousAnswer(b);
    return a.ok() ? a->header.code : 0xfe;
  }
};

TEST_F(RendezvousTest, ReplayedHelloIsRefusedAndTheRealOneAccepted) {
  std::thread root([&] {
    ClusterLayout l = Ranked(0, 3, 1);
    l.job_token = "right";
    auto r = CompleteCluster(l, ServerAddress(0), Opts(20s));
    EXPECT_TRUE(r.ok()) << r.status();
  });
  RawJoiner first, replay;
  ASSERT_TRUE(first.Connect(path_));
  ASSERT_TRUE(replay.Connect(path_));
  // One hello made for the first connection's challenge, sent on both.
  const std::string hello = RawJoiner::Hello(1, "right", first.root_nonce);
  ASSERT_TRUE(replay.Send(hello));
  EXPECT_EQ(replay.AnswerCode(), static_cast<std::uint8_t>(StatusCode::kPermissionDenied))
      << "a hello made for another challenge was accepted";
  ASSERT_TRUE(first.Send(hello));
  // The root still waits for rank 2; a real one completes the job.
  ClusterLayout member = Ranked(2, 3, 1);
  member.job_token = "right";
  auto ok = CompleteCluster(member, "", Opts(20s));
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(first.AnswerCode(), 0) << "the right hello was not accepted";
  root.join();
}

// More silent sockets than the root's cap: exactly the oldest ones past it
// are dropped (counted; they see the end of the stream), and the job's real
// process still gets in. Both ends of every socket live in this process.
TEST_F(RendezvousTest, SilentSocketsAreBoundedAndTheJobStillMeets) {
  constexpr std::size_t kExtra = 16;
  constexpr std::size_t kSockets = internal::kMaxRendezvousUnauthenticated + kExtra;
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  constexpr rlim_t kNeed = 2 * kSockets + 512;
  if (rl.rlim_cur < kNeed) {
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < kNeed) {
      GTEST_SKIP() << "RLIMIT_NOFILE hard limit " << rl.rlim_max << " < " << kNeed;
    }
    rl.rlim_cur = kNeed;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  auto& counters = internal::TEST_RendezvousRootCounters();
  const std::uint64_t dropped_before = counters.dropped_oldest.load();
  std::thread root([&] {
    ClusterLayout l = Ranked(0, 2, 1);
    l.job_token = "right";
    auto r = CompleteCluster(l, ServerAddress(0), Opts(60s));
    EXPECT_TRUE(r.ok()) << r.status();
  });
  // Each Connect returns once the root has accepted it and sent its
  // challenge, so the root has seen them all in this order.
  std::vector<RawJoiner> silent(kSockets);
  for (std::size_t i = 0; i < kSockets; ++i) ASSERT_TRUE(silent[i].Connect(path_)) << i;
  // A hello-less socket is dropped only when a newer one arrives past the
  // cap; one more connection makes sure the root's count is final.
  RawJoiner probe;
  ASSERT_TRUE(probe.Connect(path_));
  EXPECT_EQ(counters.dropped_oldest.load() - dropped_before, kExtra + 1);
  for (std::size_t i = 0; i <= kExtra; ++i) {
    char c;
    EXPECT_EQ(::recv(silent[i].fd.get(), &c, 1, 0), 0) << "silent socket " << i << " not dropped";
  }
  ClusterLayout member = Ranked(1, 2, 1);
  member.job_token = "right";
  auto ok = CompleteCluster(member, "", Opts(20s));
  EXPECT_TRUE(ok.ok()) << ok.status();
  root.join();
}

// Highest open descriptor + 1.
int OpenFdCeiling() {
  int top = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 1024;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    top = std::max(top, std::atoi(e->d_name) + 1);
  }
  ::closedir(d);
  return top;
}

TEST_F(RendezvousTest, RootAtTheDescriptorLimitShedsConnectionsWithoutSpinning) {
#ifdef RDMAPS_TEST_UBSAN
  // UBSan's vptr check reads the process's memory map, which it cannot open
  // at the descriptor limit (see tests/transport_tcp/tcp_auth_test.cc).
  GTEST_SKIP() << "UBSan cannot check virtual calls at the descriptor limit";
#endif
  // In a child whose RLIMIT_NOFILE leaves no descriptor free once its root
  // listens: every arriving connection must be shed (closed, no challenge),
  // with one accept4 failure per shed, not a busy loop.
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe2(to_parent, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(to_child, O_CLOEXEC), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::thread root([&] {
      ClusterLayout l = Ranked(0, 2, 1);
      l.job_token = "right";
      (void)CompleteCluster(l, ServerAddress(0), Opts(60s));
    });
    root.detach();
    std::string addr;
    for (int i = 0; i < 1000 && addr.empty(); ++i) {
      std::ifstream(path_) >> addr;
      if (addr.empty()) std::this_thread::sleep_for(10ms);  // the root's file is not there yet
    }
    if (addr.empty()) ::_exit(3);
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = static_cast<rlim_t>(OpenFdCeiling());
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) ::_exit(4);
    std::vector<Fd> filler;
    for (;;) {
      Fd f(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (!f.valid()) break;
      filler.push_back(std::move(f));
    }
    char c;
    if (::write(to_parent[1], "r", 1) != 1) ::_exit(5);
    if (::read(to_child[0], &c, 1) != 1) ::_exit(6);
    auto& counters = internal::TEST_RendezvousRootCounters();
    std::string report = std::to_string(counters.accept_errors.load()) + " " +
                         std::to_string(counters.fd_sheds.load()) + "\n";
    if (::write(to_parent[1], report.data(), report.size()) <= 0) ::_exit(7);
    ::_exit(0);
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  char ready = 0;
  ASSERT_EQ(::read(to_parent[0], &ready, 1), 1) << "the child failed to start";
  std::string addr;
  std::ifstream(path_) >> addr;
  auto hp = ParseHostPort(addr, "root");
  ASSERT_TRUE(hp.ok()) << hp.status();
  constexpr int kConns = 40;
  int shed = 0;
  for (int i = 0; i < kConns; ++i) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(hp->port));
    inet_pton(AF_INET, hp->host.c_str(), &sa.sin_addr);
    timeval tv{10, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    char c;
    // Closed without a challenge: shed. A timeout (-1) means it waited, which
    // fails the test: stop there rather than wait 10 s for each of the rest.
    if (::recv(fd.get(), &c, 1, 0) != 0) break;
    ++shed;
  }
  ASSERT_EQ(::write(to_child[1], "x", 1), 1);
  std::string line;
  char c;
  while (::read(to_parent[0], &c, 1) == 1 && c != '\n') line += c;
  unsigned long errors = 0, sheds = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "%lu %lu", &errors, &sheds), 2) << line;
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(shed, kConns);
  EXPECT_EQ(sheds, static_cast<unsigned long>(kConns));
  EXPECT_LE(errors, sheds + 2) << "accept4 failed " << errors << " times for " << sheds << " sheds";
  ::close(to_parent[0]);
  ::close(to_child[1]);
}

TEST(RendezvousWireTest, ParsersRefuseWhatIsNotAMessage) {
  EXPECT_EQ(sizeof(internal::HelloHeader), 80u);
  EXPECT_EQ(sizeof(internal::AnswerHeader), 56u);
  EXPECT_EQ(sizeof(internal::ChallengeHeader), 24u);
  std::vector<std::byte> junk(200, std::byte{0x41});
  EXPECT_FALSE(internal::ParseRendezvousChallenge({junk.data(), 24}).ok());
  EXPECT_FALSE(internal::ParseRendezvousHello(junk).ok());
  EXPECT_FALSE(internal::ParseRendezvousAnswer(junk).ok());
  // A hello whose addr_len claims more than follows.
  std::string h = RawJoiner::Hello(1, "s", {});
  std::vector<std::byte> b(h.size());
  std::memcpy(b.data(), h.data(), h.size());
  EXPECT_TRUE(internal::ParseRendezvousHello(b).ok());
  b.pop_back();
  EXPECT_FALSE(internal::ParseRendezvousHello(b).ok());
}

}  // namespace
}  // namespace rdmaps

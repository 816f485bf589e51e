// The start-up rendezvous, with every process as a thread of this test. The
// root listens on port 0 and publishes its address in a file (the
// --rendezvous=file:PATH form), so no test uses a fixed port.
#include "src/cluster/rendezvous.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

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
  static std::vector<Result<ClusterLayout>> RunAll(int n, const std::function<Result<ClusterLayout>(int)>& fn) {
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

TEST_F(RendezvousTest, WrongJobTokenIsRefusedAndTheRootKeepsWaiting) {
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
  EXPECT_THAT(refused.status().message(), HasSubstr("job token mismatch"));
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

TEST(RendezvousWireTest, HeadersAreFixedSizeBigEndian) {
  EXPECT_EQ(sizeof(internal::HelloHeader), 40u);
  EXPECT_EQ(sizeof(internal::AnswerHeader), 24u);
  EXPECT_NE(internal::TokenHash("a"), internal::TokenHash("b"));
  EXPECT_EQ(internal::TokenHash(""), 1469598103934665603ull);
}

}  // namespace
}  // namespace rdmaps

// Adding a worker to a running job with rdmaps-local (docs/ps.md "Elastic
// workers"): 2 servers with 3 worker slots, 2 rdmaps-train workers, and a
// third started 3 s after them (--join_workers, --join_after_s). The
// joiner must join at the members' clock on both servers (each logs the
// membership change with its epoch), every worker must leave gracefully and
// the job must finish. Every wait has a deadline (kKill); nothing is timed.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "tests/cluster/proc.h"

namespace {

namespace fs = std::filesystem;
using rdmaps::testing::Proc;

constexpr auto kKill = std::chrono::seconds(150);

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(ElasticLaunchTest, AWorkerAddedToARunningJobJoinsAtTheMembersClock) {
  // rdmaps-train's default --data_dir (tools/train/idx.h).
  const std::string data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte";
  if (!fs::exists(data + ".gz") && !fs::exists(data)) {
    GTEST_SKIP() << "needs Fashion-MNIST (Debian package dataset-fashion-mnist)";
  }
  std::vector<std::string> argv = {RDMAPS_LOCAL_BIN,
                                   "--servers=2",
                                   "--workers=2",
                                   "--max_workers=3",
                                   "--join_workers=1",
                                   "--join_after_s=3",
                                   "--transport=tcp",
                                   "--server_binary=" RDMAPS_SERVER_BIN,
                                   "--",
                                   RDMAPS_TRAIN_BIN,
                                   "--model=softmax",
                                   "--epochs=600",
                                   "--train_limit=2000",
                                   "--test_limit=500",
                                   "--progress=false"};
  Proc job(argv, {}, kKill);
  const int rc = job.Wait();
  const std::string& out = job.out();
  ASSERT_EQ(rc, 0) << out;
  ASSERT_EQ(CountOf(out, "worker2 pid="), 1) << "the joiner was not started\n" << out;
  // Each server logs the join with its epoch, at the same clock (> 0: the
  // members had trained before it came).
  std::vector<std::string> clocks;
  const std::regex joined(
      "ps server ([01]): membership epoch 1: worker 2 joined at clock ([0-9]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), joined); it != std::sregex_iterator();
       ++it) {
    clocks.push_back((*it)[2]);
  }
  ASSERT_EQ(clocks.size(), 2u) << out;
  EXPECT_GT(std::stoull(clocks[0]), 0u) << "the joiner came before any training\n" << out;
  // The joiner asks for the highest floor clock it read; a server whose
  // floor rose in between starts it there instead (and ignores its clocks up
  // to that one), so a server's clock is never below the one it asked for.
  std::smatch asked;
  const std::regex joiner("worker 2 joined the job at clock ([0-9]+)");
  ASSERT_TRUE(std::regex_search(out, asked, joiner)) << out;
  for (const std::string& c : clocks) {
    EXPECT_LE(std::stoull(asked[1]), std::stoull(c)) << out;
  }
  // Every worker left gracefully, on both servers; none died.
  EXPECT_EQ(CountOf(out, "left (graceful)"), 6) << out;
  EXPECT_EQ(CountOf(out, "left (died)"), 0) << out;
  EXPECT_EQ(CountOf(out, "job done"), 1) << out;
}

}  // namespace

#include "perf/rdmaps-perf/perf_cli.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rdmaps::perf {
namespace {

std::vector<std::string> Translate(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return TranslateArgs(static_cast<int>(argv.size()), argv.data());
}

TEST(TranslateArgsTest, PerftestShortFlagsBecomeLongFlags) {
  EXPECT_EQ(Translate({"prog", "-s", "65536", "-n", "1000", "-a", "-t=4", "host:1"}),
            (std::vector<std::string>{"prog", "--size", "65536", "--iters", "1000", "--all",
                                      "--tx_depth=4", "host:1"}));
}

TEST(TranslateArgsTest, DashedLongNamesBecomeUnderscored) {
  EXPECT_EQ(Translate({"prog", "--tx-depth=8", "--post-list", "2", "--ib-dev=mlx5_0"}),
            (std::vector<std::string>{"prog", "--tx_depth=8", "--post_list", "2",
                                      "--ib_dev=mlx5_0"}));
}

TEST(TranslateArgsTest, ValuesAndPositionalsAfterDoubleDashStay) {
  EXPECT_EQ(Translate({"prog", "-x", "-1", "--", "-s"}),
            (std::vector<std::string>{"prog", "--gid_index", "-1", "--", "-s"}));
}

// host:port parsing itself: tests/base/host_port_test.cc.
TEST(WithPortTest, KeepsOrAddsPorts) {
  std::string out;
  EXPECT_TRUE(WithPort("node1", 18515, &out));
  EXPECT_EQ(out, "node1:18515");
  EXPECT_TRUE(WithPort("node1:7", 18515, &out));
  EXPECT_EQ(out, "node1:7");
  EXPECT_TRUE(WithPort("::1", 5, &out));
  EXPECT_EQ(out, "[::1]:5");
  EXPECT_FALSE(WithPort("node1", 0, &out));
}

TEST(ParseSizesTest, ListsAndSuffixes) {
  auto sizes = ParseSizes("64,4K,1m,2");
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, (std::vector<std::uint64_t>{64, 4096, 1 << 20, 2}));
  EXPECT_EQ(ParseSizes("1G")->front(), 1ull << 30);
  for (const char* bad : {"", "0", "4X", "2G", "-1", "64,", ",64", "1.5K"}) {
    EXPECT_EQ(ParseSizes(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace rdmaps::perf

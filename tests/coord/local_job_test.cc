// rdmaps-local gives every process of its job one coordinator (a directory
// in its private temporary directory): three workers, each incrementing one
// counter by compare-and-swap before training, write 1, 2 and 3.
#include <gtest/gtest.h>

#include <string>

#include "tests/cluster/proc.h"

namespace rdmaps::testing {
namespace {

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(LocalJobCoordinatorTest, EveryProcessOfAJobSharesOneCoordinator) {
  // Appended piece by piece: g++ 12 at -O2 sees a false -Warray-bounds in
  // the same concatenation written with operator+ (GCC bug 105329).
  std::string worker = COORD_COUNTER_BIN;
  worker.append(" && exec ").append(CLUSTER_TEST_WORKER_BIN).append(" --iterations=1");
  Proc p({RDMAPS_LOCAL_BIN, "--servers=1", "--workers=3", "--transport=tcp", "--", "/bin/sh", "-c",
          worker},
         {}, Proc::kDefaultGuard, {"RDMAPS_COORDINATOR", "RDMAPS_COORDINATOR_PREFIX"});
  EXPECT_EQ(p.Wait(), 0) << p.out();
  for (int v = 1; v <= 3; ++v) {
    EXPECT_EQ(CountOf(p.out(), "coordinator counter -> " + std::to_string(v) + " "), 1) << v << "\n"
                                                                                        << p.out();
  }
  EXPECT_NE(p.out().find("embedded (dir:/tmp/rdmaps-local-"), std::string::npos) << p.out();
}

}  // namespace
}  // namespace rdmaps::testing

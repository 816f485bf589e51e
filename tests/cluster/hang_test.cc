// A hung peer is named, never a healthy server: a worker SIGSTOPs itself
// (a real stopped process, whose connections stay open) and its peers'
// waits time out naming it as lagging. Label slow: it waits out a wait
// timeout of seconds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/cluster/proc.h"

namespace {

using rdmaps::testing::Proc;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kLocal = RDMAPS_LOCAL_BIN;
const std::string kWorker = CLUSTER_TEST_WORKER_BIN;

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HangTest, StoppedWorkerIsNamedByEveryPeerAndNoServerIsBlamed) {
  // Three servers, so a worker stopped between its clock updates of two
  // servers is behind on some of them only; big pushes keep the servers'
  // apply threads busy when the wait ends.
  for (int stop_at : {0, 2}) {
    Proc p({kLocal, "--servers=3", "--workers=3", "--transport=tcp", "--grace_s=1", "--", kWorker,
            "--iterations=50", "--rows=20000", "--dim=8", "--stop_at=" + std::to_string(stop_at),
            "--die_worker=1", "--timeout_ms=2000"});
    EXPECT_NE(p.Wait(), 0) << p.out();
    EXPECT_THAT(p.out(), HasSubstr("[worker1] stopping now (--stop_at)"));
    // Both healthy workers fail their BSP wait naming worker 1.
    EXPECT_EQ(CountOf(p.out(), "lagging: worker 1 (clock " + std::to_string(stop_at + 1) + ")"), 2)
        << p.out();
    EXPECT_THAT(p.out(), Not(HasSubstr("overloaded or stuck"))) << p.out();
    EXPECT_THAT(p.out(), Not(HasSubstr("lagging: worker 0"))) << p.out();
    EXPECT_THAT(p.out(), Not(HasSubstr("lagging: worker 2"))) << p.out();
  }
}

}  // namespace

// The parameter-server suites (ps_suite.h) on the fake backend: the
// in-process suite and the torn-read matrix. The cases that need the fake
// backend's fault knobs are in ps_fake_faults_test.cc.
#include "tests/ps/ps_suite.h"

namespace rdmaps::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Fake, PsTest, ::testing::Values(FakeBackend()), PsBackendName);
INSTANTIATE_TEST_SUITE_P(Fake, PsTornReadTest, ::testing::ValuesIn(TornReadMatrix(FakeBackend())),
                         TornReadCellName);

}  // namespace
}  // namespace rdmaps::testing

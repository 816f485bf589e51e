// The parameter-server suites (ps_suite.h) on the tcp backend, over
// loopback: the in-process suite and the torn-read matrix. The
// multi-process suite is ps_multiprocess_tcp_test.cc.
#include "tests/ps/ps_suite.h"

namespace rdmaps::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Tcp, PsTest, ::testing::Values(TcpBackend()), PsBackendName);
INSTANTIATE_TEST_SUITE_P(Tcp, PsTornReadTest, ::testing::ValuesIn(TornReadMatrix(TcpBackend())),
                         TornReadCellName);

}  // namespace
}  // namespace rdmaps::testing

// The multi-process parameter-server suite (ps_multiprocess.cc) on the tcp
// backend.
#include "tests/ps/ps_suite.h"

namespace rdmaps::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Tcp, PsMultiProcessTest, ::testing::Values(TcpBackend()), PsBackendName);

}  // namespace
}  // namespace rdmaps::testing

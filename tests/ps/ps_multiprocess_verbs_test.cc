// The multi-process parameter-server suite (ps_multiprocess.cc) on the verbs
// backend: runs where an RDMA device with an ACTIVE port exists (the
// Soft-RoCE VM, tests/vm/) and skips with the reason otherwise. A binary of
// its own: its parent process must not have used libibverbs before it forks.
#include "tests/ps/ps_suite.h"

namespace rdmaps::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Verbs, PsMultiProcessTest, ::testing::Values(VerbsBackend()),
                         PsBackendName);

}  // namespace
}  // namespace rdmaps::testing

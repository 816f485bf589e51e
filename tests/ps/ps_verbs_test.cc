// The parameter-server suites (ps_suite.h) on the verbs backend: the
// in-process suite and the torn-read matrix, plus the choice of device by
// address. Runs where an RDMA device with an ACTIVE port exists (Soft-RoCE
// in the VM harness, tests/vm/, which exports RDMAPS_TEST_VERBS_ADDR; a real
// HCA elsewhere) and skips with the reason otherwise. The multi-process
// suite is ps_multiprocess_verbs_test.cc: a process that has used libibverbs
// cannot fork children that use it too.
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/ps/ps_suite.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Verbs, PsTest, ::testing::Values(VerbsBackend()), PsBackendName);
INSTANTIATE_TEST_SUITE_P(Verbs, PsTornReadTest, ::testing::ValuesIn(TornReadMatrix(VerbsBackend())),
                         TornReadCellName);

// With two RDMA devices (the VM has rxe0 and rxe1), a server listening on the
// second device's address and a worker connecting to it must both pick that
// device from the address (with the first device they would fail to listen
// or to reach it).
TEST(PsVerbsTest, ServerAndWorkerPickTheDeviceOfTheirAddress) {
  const char* addr2 = std::getenv("RDMAPS_TEST_VERBS_ADDR2");
  if (addr2 == nullptr) GTEST_SKIP() << "RDMAPS_TEST_VERBS_ADDR2 is not set (one RDMA device)";
  auto so = MakeServerOptions("verbs", 0, 1, 1,
                              {MakeTable(1, "w", 8, 4, kAsp, Initializer::Constant(3.0f))});
  so.listen_address = std::string(addr2) + ":0";
  auto server = Server::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = Client::Connect(MakeClientOptions("verbs", 0, 1, {(*server)->address()}));
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> out(8 * 4);
  ASSERT_TRUE((*client)->Pull(1, RowRange{0, 8}, out).ok());
  for (float v : out) EXPECT_EQ(v, 3.0f);
}

}  // namespace
}  // namespace rdmaps::testing

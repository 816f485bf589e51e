// The conformance suite on the tcp backend, over loopback.
#include "tests/transport/conformance.h"

namespace rdmaps::transport {
namespace {

ConformanceBackend TcpBackend() {
  ConformanceBackend b;
  b.name = "tcp";
  b.options.transport = "tcp";
  b.listen_address = "127.0.0.1:0";
  return b;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformance, ::testing::Values(TcpBackend()),
                         ConformanceName);

}  // namespace
}  // namespace rdmaps::transport

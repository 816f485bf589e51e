// The conformance suite on the tcp backend, over loopback.
#include "tests/transport/conformance.h"
#include "transport/tcp/tcp_transport.h"

namespace rdmaps::transport {
namespace {

ConformanceBackend TcpBackend() {
  ConformanceBackend b;
  b.name = "tcp";
  b.options.transport = "tcp";
  b.listen_address = "127.0.0.1:0";
  b.set_protocol_version = [](Endpoint& ep, std::uint16_t version) {
    return tcp::TEST_SetProtocolVersion(ep, version);
  };
  return b;
}

INSTANTIATE_TEST_SUITE_P(Tcp, TransportConformance, ::testing::Values(TcpBackend()),
                         ConformanceName);

}  // namespace
}  // namespace rdmaps::transport

// The conformance suite on the fake backend.
#include "tests/transport/conformance.h"
#include "transport/fake/fake_transport.h"

namespace rdmaps::transport {
namespace {

ConformanceBackend FakeBackend() {
  ConformanceBackend b;
  b.name = "fake";
  b.options.transport = "fake";
  b.listen_address = "conformance:0";
  b.set_protocol_version = [](Endpoint& ep, std::uint16_t version) {
    fake::Faults f;
    f.protocol_version = version;
    return fake::SetFaults(ep, f);
  };
  return b;
}

INSTANTIATE_TEST_SUITE_P(Fake, TransportConformance, ::testing::Values(FakeBackend()),
                         ConformanceName);

}  // namespace
}  // namespace rdmaps::transport

// The conformance suite on the verbs backend: runs where an RDMA device with
// an ACTIVE port exists (Soft-RoCE in the VM harness, tests/vm/; a real HCA
// elsewhere) and skips with the reason otherwise. It listens on the rxe
// device's IP: RDMAPS_TEST_VERBS_ADDR (set by the harness), else the first
// ACTIVE device's IPv4 address.
#include "tests/transport/conformance.h"
#include "tests/vm/verbs_test_env.h"
#include "transport/verbs/verbs_transport.h"

namespace rdmaps::transport {
namespace {

ConformanceBackend VerbsBackend() {
  ConformanceBackend b;
  b.name = "verbs";
  b.options.transport = "verbs";
  std::string why;
  std::string addr = rdmaps::testing::VerbsTestAddress(&why);
  b.listen_address = addr.empty() ? std::string("0.0.0.0:0") : addr + ":0";
  // Every endpoint of the suite listens on or connects to that address: the
  // device that owns it is the one to open (the VM has a second device).
  b.options.address_hint = addr;
  b.skip_reason = [addr, why]() -> std::string {
    std::string reason;
    if (!VerbsUsable(&reason)) return "verbs backend not usable here: " + reason;
    if (addr.empty()) return why;
    return "";
  };
  b.set_protocol_version = [](Endpoint& ep, std::uint16_t version) {
    return verbs::TEST_SetProtocolVersion(ep, version);
  };
  b.exact_access_errors = false;  // the NIC reports every refusal as REM_ACCESS_ERR
  return b;
}

INSTANTIATE_TEST_SUITE_P(Verbs, TransportConformance, ::testing::Values(VerbsBackend()),
                         ConformanceName);

}  // namespace
}  // namespace rdmaps::transport

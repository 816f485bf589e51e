// The transport conformance suite (see conformance.h), part two: what every
// backend refuses before it does anything -- malformed addresses, endpoint
// options out of range, handshake user data too large. Endpoint::Create,
// Listen and Connect check these once, in front of the backends
// (transport/transport.cc), so the answers cannot differ between fake, tcp
// and verbs; these cases prove it on each.
#include <gmock/gmock.h>

#include <chrono>
#include <string>

#include "tests/transport/conformance.h"

namespace rdmaps::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

// Each is refused by src/base/host_port.h's rules; before those rules were
// shared, verbs took ":7000" and "host:" (tcp refused them) and fake took
// any name.
constexpr const char* kMalformedAddresses[] = {":7000", "host:", "host", "h:70000",
                                               "h:-1",  "[::1",  "",     "h:7x"};

TEST_P(TransportConformance, MalformedAddressesAreInvalidArgument) {
  auto server = NewEndpoint(kServerId);
  auto client = NewEndpoint(kClientId);
  ASSERT_TRUE(server && client);
  for (const char* bad : kMalformedAddresses) {
    auto l = server->Listen(bad);
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << "Listen('" << bad << "')";
    EXPECT_THAT(l.status().message(), HasSubstr("host:port")) << l.status();
    auto c = client->Connect(bad, {}, DeadlineAfter(seconds(5)));
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << "Connect('" << bad << "')";
    EXPECT_THAT(c.status().message(), HasSubstr("host:port")) << c.status();
  }
  // A refused Listen does not count as the one Listen: the endpoint still
  // listens and serves on a good address.
  const std::string address = ListenOn(*server);
  ASSERT_FALSE(address.empty());
  auto conn = ConnectTo(*client, address);
  EXPECT_TRUE(conn);
}

TEST_P(TransportConformance, ZeroMaxOutstandingIsInvalidArgument) {
  EndpointOptions o = backend().options;
  o.job_token = kToken;
  o.max_outstanding = 0;
  auto ep = Endpoint::Create(o);
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument) << ep.status();
  EXPECT_THAT(ep.status().message(), HasSubstr("max_outstanding"));
}

TEST_P(TransportConformance, NonPositiveOpTimeoutIsInvalidArgument) {
  for (milliseconds timeout : {milliseconds(0), milliseconds(-1)}) {
    EndpointOptions o = backend().options;
    o.job_token = kToken;
    o.op_timeout = timeout;
    auto ep = Endpoint::Create(o);
    ASSERT_FALSE(ep.ok()) << timeout.count() << " ms";
    EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument) << ep.status();
    EXPECT_THAT(ep.status().message(), HasSubstr("op_timeout"));
  }
}

TEST_P(TransportConformance, HandshakeUserDataBeyondTheLimitIsInvalidArgument) {
  auto server = NewEndpoint(kServerId);
  auto client = NewEndpoint(kClientId);
  ASSERT_TRUE(server && client);
  const std::string address = ListenOn(*server);
  ConnectOptions co;
  co.user_data.assign(kMaxHandshakeUserData + 1, 7);
  auto too_big = client->Connect(address, co, DeadlineAfter(seconds(20)));
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument) << too_big.status();
  EXPECT_THAT(too_big.status().message(), HasSubstr("user_data"));
  // Nothing reached the server.
  auto a = server->Accept(DeadlineAfter(milliseconds(50)));
  EXPECT_EQ(a.status().code(), StatusCode::kTimedOut) << a.status();
  // Exactly the limit fits, and arrives whole.
  co.user_data.assign(kMaxHandshakeUserData, 9);
  auto conn = ConnectTo(*client, address, co);
  ASSERT_TRUE(conn);
  auto accepted = AcceptOn(*server);
  ASSERT_TRUE(accepted);
  EXPECT_EQ(accepted->peer().user_data, co.user_data);
}

}  // namespace
}  // namespace rdmaps::transport

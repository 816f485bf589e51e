// The one host:port parser (src/base/host_port.h): the forms it accepts, the
// ones it refuses, and what its errors say; and the one resolver and
// formatter of socket addresses beside it.
#include "src/base/host_port.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace rdmaps {
namespace {

using ::testing::HasSubstr;

TEST(HostPortTest, ParsesIpv4NamesAndBracketedIpv6) {
  auto a = ParseHostPort("127.0.0.1:7000", "x");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7000);
  EXPECT_FALSE(a->bracketed);
  auto b = ParseHostPort("[::1]:0", "x");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_TRUE(b->bracketed);
  auto c = ParseHostPort("localhost:65535", "x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->port, 65535);
  auto d = ParseHostPort("[fe80::1]:80", "x");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->host, "fe80::1");
  EXPECT_EQ(d->port, 80);
  auto e = ParseHostPort("10.0.0.1:4791", "x");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->host, "10.0.0.1");
  EXPECT_EQ(e->port, 4791);
  auto f = ParseHostPort("ps-server:7", "x");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->host, "ps-server");
  EXPECT_EQ(f->port, 7);
}

TEST(HostPortTest, RejectsMalformedWithInvalidArgument) {
  for (const char* bad :
       {// The cases every backend's Listen and Connect refuse too
        // (tests/transport/conformance.cc).
        ":7000", "host:", "host", "h:70000", "h:-1", "[::1", "", "h:7x",
        // The rest of what tcp, the cluster layout and perf refused.
        "127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:80x",
        "::1:80", "::1", "[::1]", "[::1]80", "[]:80", "[nonsense]:80", "[::1:80", "host:99999",
        "host:-1", "host:8x", "fe80::1:80", "[fe80::1]80", "a b:1", "a,b:1", "a/b:1", "h: 80",
        "h:+80"}) {
    auto r = ParseHostPort(bad, "--ps_hosts");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("'") + bad + "'"));
    EXPECT_THAT(r.status().message(), HasSubstr("--ps_hosts"));
    EXPECT_THAT(r.status().message(), HasSubstr("host:port"));
  }
}

TEST(HostPortTest, ErrorsSayWhatIsWrong) {
  EXPECT_THAT(ParseHostPort("h2", "--ps_hosts").status().message(), HasSubstr("'h2' has no port"));
  EXPECT_THAT(ParseHostPort(":7000", "x").status().message(), HasSubstr("empty host"));
  EXPECT_THAT(ParseHostPort("h:", "x").status().message(), HasSubstr("empty port"));
  EXPECT_THAT(ParseHostPort("h:70000", "x").status().message(), HasSubstr("0..65535"));
  EXPECT_THAT(ParseHostPort("::1:80", "x").status().message(), HasSubstr("without [ ]"));
  EXPECT_THAT(ParseHostPort("[::1", "x").status().message(), HasSubstr("']'"));
  const std::string longer(500, 'h');
  const std::string message = ParseHostPort(longer, "x").status().message();
  EXPECT_LT(message.size(), 400u) << "quotes at most 200 characters";
}

TEST(HostPortTest, JoinIsTheInverse) {
  EXPECT_EQ(JoinHostPort("fe80::1", 80), "[fe80::1]:80");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 7000), "10.0.0.1:7000");
  EXPECT_EQ(JoinHostPort("[::1]", 1), "[::1]:1");
  for (const char* text : {"10.0.0.1:7000", "[::1]:0", "ps0:65535"}) {
    auto hp = ParseHostPort(text, "x");
    ASSERT_TRUE(hp.ok()) << text;
    EXPECT_EQ(JoinHostPort(hp->host, hp->port), text);
  }
}

// Numeric hosts resolve without a name service, to the port asked for, and
// format back to the text they came from.
TEST(HostPortTest, ResolvesNumericAddressesAndFormatsThemBack) {
  for (const char* text : {"127.0.0.1:7000", "[::1]:65535", "10.1.2.3:0"}) {
    auto hp = ParseHostPort(text, "x");
    ASSERT_TRUE(hp.ok()) << hp.status();
    auto ai = ResolveHostPort(*hp, AddressUse::kConnect);
    ASSERT_TRUE(ai.ok()) << text << ": " << ai.status();
    ASSERT_NE(ai->get(), nullptr);
    EXPECT_EQ(SockaddrToString((*ai)->ai_addr), text);
  }
}

TEST(HostPortTest, ListeningOnTheWildcardResolves) {
  HostPort hp;
  hp.host = "0.0.0.0";
  hp.port = 0;
  auto ai = ResolveHostPort(hp, AddressUse::kListen);
  ASSERT_TRUE(ai.ok()) << ai.status();
  EXPECT_EQ(SockaddrToString((*ai)->ai_addr), "0.0.0.0:0");
}

TEST(HostPortTest, AnUnresolvableHostIsUnavailableNamingIt) {
  HostPort hp;
  hp.host = "no-such-host.invalid";  // RFC 6761: never resolves
  hp.port = 7000;
  auto ai = ResolveHostPort(hp, AddressUse::kConnect);
  ASSERT_FALSE(ai.ok());
  EXPECT_EQ(ai.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(ai.status().message(), HasSubstr("cannot resolve 'no-such-host.invalid'"));
  EXPECT_THAT(ai.status().message(), HasSubstr("numeric address"));
}

TEST(HostPortTest, OtherAddressFamiliesFormatAsAQuestionMark) {
  sockaddr sa{};
  sa.sa_family = AF_UNIX;
  EXPECT_EQ(SockaddrToString(&sa), "?");
}

}  // namespace
}  // namespace rdmaps

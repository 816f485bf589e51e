// Device and GID selection on verbs: EndpointOptions::address_hint picks the
// device that owns (listen) or routes to (connect) an address, and
// gid_index >= 0 forces the queue pair's source GID.
//
// Needs the Soft-RoCE VM's second device and addresses (tests/vm/guest_init.sh):
//   RDMAPS_TEST_VERBS_ADDR     10.77.0.1 on veth0, rxe0's netdev
//   RDMAPS_TEST_VERBS_ALT_ADDR 10.77.0.2, a second IP (a second GID) on veth0
//   RDMAPS_TEST_VERBS_ADDR2    10.78.0.1 on veth2, rxe1's netdev
//   RDMAPS_TEST_VERBS_ROUTED2  10.78.0.2, not local, routed out of veth2 (a
//                              static neighbour entry, so address resolution
//                              succeeds without anyone answering)
// Skips with the reason where they are absent (a host without RDMA).
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "tests/vm/verbs_test_env.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_transport.h"

namespace rdmaps::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// sysfs writes a GID as eight groups of four hex digits.
bool ParseSysfsGid(const std::string& text, unsigned char out[16]) {
  unsigned g[8];
  if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x:%x:%x", &g[0], &g[1], &g[2], &g[3], &g[4],
                  &g[5], &g[6], &g[7]) != 8) {
    return false;
  }
  for (int i = 0; i < 8; ++i) {
    out[2 * i] = static_cast<unsigned char>(g[i] >> 8);
    out[2 * i + 1] = static_cast<unsigned char>(g[i]);
  }
  return true;
}

// The index of the first GID of `dev` port 1 that `match` accepts, or -1.
template <typename Match>
int FindGidIndex(const std::string& dev, Match match) {
  for (int i = 0; i < 256; ++i) {
    std::ifstream in("/sys/class/infiniband/" + dev + "/ports/1/gids/" + std::to_string(i));
    if (!in) return -1;
    std::string line;
    std::getline(in, line);
    unsigned char raw[16];
    if (!ParseSysfsGid(line, raw)) continue;
    bool empty = true;
    for (unsigned char c : raw) empty = empty && c == 0;
    if (!empty && match(raw)) return i;
  }
  return -1;
}

int GidIndexOfIpv4(const std::string& dev, const std::string& ipv4) {
  unsigned char want[16];
  if (inet_pton(AF_INET6, ("::ffff:" + ipv4).c_str(), want) != 1) return -1;
  return FindGidIndex(dev, [&](const unsigned char* g) { return std::memcmp(g, want, 16) == 0; });
}

int LinkLocalGidIndex(const std::string& dev) {
  return FindGidIndex(dev, [](const unsigned char* g) { return g[0] == 0xfe && g[1] == 0x80; });
}

class VerbsDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!VerbsUsable(&why)) GTEST_SKIP() << "verbs not usable here: " << why;
    addr1_ = Env("RDMAPS_TEST_VERBS_ADDR");
    addr2_ = Env("RDMAPS_TEST_VERBS_ADDR2");
    alt_ = Env("RDMAPS_TEST_VERBS_ALT_ADDR");
    routed2_ = Env("RDMAPS_TEST_VERBS_ROUTED2");
    if (addr1_.empty() || addr2_.empty() || alt_.empty() || routed2_.empty()) {
      GTEST_SKIP() << "needs two RDMA devices and the addresses the Soft-RoCE VM sets up "
                      "(RDMAPS_TEST_VERBS_ADDR, _ADDR2, _ALT_ADDR, _ROUTED2; see "
                      "tests/vm/guest_init.sh)";
    }
  }

  static EndpointOptions Options(std::uint32_t id) {
    EndpointOptions o;
    o.transport = "verbs";
    o.peer_id = id;
    o.job_token = "token";
    o.op_timeout = milliseconds(20000);
    return o;
  }

  static std::unique_ptr<Endpoint> Make(const EndpointOptions& o) {
    auto ep = Endpoint::Create(o);
    EXPECT_TRUE(ep.ok()) << ep.status();
    return ep.ok() ? std::move(ep).value() : nullptr;
  }

  static std::string Device(const Endpoint& ep) {
    auto d = verbs::TEST_DeviceName(ep);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : "";
  }

  // The device that owns `addr`, asked through the hint.
  static std::string DeviceOwning(const std::string& addr) {
    EndpointOptions o = Options(99);
    o.address_hint = addr;
    auto ep = Make(o);
    return ep ? Device(*ep) : "";
  }

  // Connects `client` to `server` (listening on `listen`) and READs 64 bytes
  // of a pattern through the connection. Returns the client connection.
  static std::unique_ptr<Connection> ConnectAndRead(Endpoint& server, const std::string& listen,
                                                    Endpoint& client) {
    std::vector<std::uint8_t> target(64);
    std::iota(target.begin(), target.end(), 1);
    std::vector<std::uint8_t> local(64, 0);
    auto tmr = server.Register(target.data(), target.size(), kRemoteRead);
    auto lmr = client.Register(local.data(), local.size(), kAccessNone);
    EXPECT_TRUE(tmr.ok() && lmr.ok());
    if (!tmr.ok() || !lmr.ok()) return nullptr;
    auto conn = client.Connect(listen, {}, DeadlineAfter(seconds(10)));
    EXPECT_TRUE(conn.ok()) << conn.status();
    if (!conn.ok()) return nullptr;
    Op read = Op::Read(local.data(), lmr->get(), 64, (*tmr)->remote().addr, (*tmr)->rkey(), 7);
    EXPECT_TRUE((*conn)->Post({&read, 1}).ok());
    Completion c;
    auto got = (*conn)->Wait({&c, 1}, DeadlineAfter(seconds(20)));
    EXPECT_TRUE(got.ok() && *got == 1) << (got.ok() ? "deadline" : got.status().ToString());
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(local, target);
    return std::move(conn).value();
  }

  // An endpoint made with `o`, listening on `host`:0 (the address in
  // `*listen`); null, with a failure recorded, when either step fails.
  std::unique_ptr<Endpoint> Listening(const EndpointOptions& o, const std::string& host,
                                      std::string* listen) const {
    auto server = Make(o);
    if (!server) return nullptr;
    auto l = server->Listen(host + ":0");
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return nullptr;
    *listen = *l;
    return server;
  }

  // A server whose hint is the second device's address, listening there.
  std::unique_ptr<Endpoint> ServerOnSecondDevice(std::string* listen) const {
    EndpointOptions o = Options(1);
    o.address_hint = addr2_;
    return Listening(o, addr2_, listen);
  }

  std::string addr1_, addr2_, alt_, routed2_;
};

TEST_F(VerbsDeviceTest, WithoutHintTheFirstDeviceIsUsedAndListenOnTheSecondFails) {
  const std::string dev1 = DeviceOwning(addr1_);
  const std::string dev2 = DeviceOwning(addr2_);
  ASSERT_FALSE(dev1.empty());
  ASSERT_FALSE(dev2.empty());
  ASSERT_NE(dev1, dev2) << "the VM should give " << addr2_ << " its own rxe device";
  auto ep = Make(Options(1));
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(Device(*ep), dev1) << "the first ACTIVE device (" << addr1_ << "'s) is the default";
  auto listen = ep->Listen(addr2_ + ":0");
  ASSERT_FALSE(listen.ok());
  EXPECT_EQ(listen.status().code(), StatusCode::kFailedPrecondition) << listen.status();
  EXPECT_NE(listen.status().message().find(dev1), std::string::npos) << listen.status();
  EXPECT_NE(listen.status().message().find(dev2), std::string::npos) << listen.status();
  EXPECT_NE(listen.status().message().find("address_hint"), std::string::npos) << listen.status();
}

TEST_F(VerbsDeviceTest, ListenAddressHintPicksTheDeviceThatOwnsIt) {
  const std::string dev1 = DeviceOwning(addr1_);
  EndpointOptions so = Options(1);
  so.address_hint = addr2_ + ":0";
  auto server = Make(so);
  ASSERT_NE(server, nullptr);
  const std::string dev2 = Device(*server);
  EXPECT_NE(dev2, dev1);
  auto listen = server->Listen(addr2_ + ":0");
  ASSERT_TRUE(listen.ok()) << listen.status();

  EndpointOptions co = Options(2);
  co.address_hint = *listen;  // the peer's address: owned here too (loopback)
  auto client = Make(co);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Device(*client), dev2);
  auto conn = ConnectAndRead(*server, *listen, *client);
  ASSERT_NE(conn, nullptr);
  auto accepted = server->Accept(DeadlineAfter(seconds(10)));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ((*accepted)->peer().peer_id, 2u);
}

TEST_F(VerbsDeviceTest, PeerAddressHintPicksTheDeviceThatRoutesToIt) {
  std::string listen;
  auto server = ServerOnSecondDevice(&listen);
  ASSERT_NE(server, nullptr);

  // routed2_ is no local address: only rdma_resolve_addr can tell the device.
  EndpointOptions co = Options(2);
  co.address_hint = routed2_ + ":4000";
  auto client = Make(co);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Device(*client), Device(*server));
  EXPECT_NE(Device(*client), DeviceOwning(addr1_));
  auto conn = ConnectAndRead(*server, listen, *client);
  EXPECT_NE(conn, nullptr);
}

TEST_F(VerbsDeviceTest, ConnectWithoutHintToTheSecondDeviceNamesBoth) {
  std::string listen;
  auto server = ServerOnSecondDevice(&listen);
  ASSERT_NE(server, nullptr);
  auto client = Make(Options(2));
  ASSERT_NE(client, nullptr);
  auto conn = client->Connect(listen, {}, DeadlineAfter(seconds(10)));
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), StatusCode::kFailedPrecondition) << conn.status();
  EXPECT_NE(conn.status().message().find(Device(*server)), std::string::npos) << conn.status();
  EXPECT_NE(conn.status().message().find(Device(*client)), std::string::npos) << conn.status();
}

TEST_F(VerbsDeviceTest, AnAddressNoDeviceReachesIsAClearErrorAtCreate) {
  EndpointOptions o = Options(1);
  o.address_hint = "192.0.2.1:7000";  // TEST-NET-1: not local, no route in the VM
  auto ep = Endpoint::Create(o);
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), StatusCode::kUnavailable) << ep.status();
  EXPECT_NE(ep.status().message().find("192.0.2.1"), std::string::npos) << ep.status();
  EXPECT_NE(ep.status().message().find("address_hint"), std::string::npos) << ep.status();
  EXPECT_NE(ep.status().message().find("ib_dev"), std::string::npos) << ep.status();
  std::cout << "  the error reads: " << ep.status() << "\n";

  o.address_hint = "no-such-host.invalid:1";
  ep = Endpoint::Create(o);
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument) << ep.status();
  EXPECT_NE(ep.status().message().find("no-such-host.invalid"), std::string::npos);
}

TEST_F(VerbsDeviceTest, AWildcardHintCountsAsNoHint) {
  EndpointOptions o = Options(1);
  o.address_hint = "0.0.0.0:0";
  auto ep = Make(o);
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(Device(*ep), DeviceOwning(addr1_));
}

TEST_F(VerbsDeviceTest, IbDevWinsOverTheHint) {
  const std::string dev2 = DeviceOwning(addr2_);
  EndpointOptions o = Options(1);
  o.ib_dev = dev2;
  o.address_hint = addr1_;
  auto ep = Make(o);
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(Device(*ep), dev2);
}

// --- gid_index -----------------------------------------------------------

TEST_F(VerbsDeviceTest, GidIndexRdmaCmWouldChooseWorksAndIsReported) {
  std::string listen;
  auto server = Listening(Options(1), addr1_, &listen);
  ASSERT_NE(server, nullptr);
  auto plain_client = Make(Options(2));
  ASSERT_NE(plain_client, nullptr);
  auto plain = ConnectAndRead(*server, listen, *plain_client);
  ASSERT_NE(plain, nullptr);
  auto natural = verbs::TEST_SourceGidIndex(*plain);
  ASSERT_TRUE(natural.ok()) << natural.status();
  EXPECT_EQ(*natural, GidIndexOfIpv4(Device(*server), addr1_));

  EndpointOptions co = Options(3);
  co.gid_index = *natural;
  auto client = Make(co);
  ASSERT_NE(client, nullptr);
  auto conn = ConnectAndRead(*server, listen, *client);
  ASSERT_NE(conn, nullptr);
  auto forced = verbs::TEST_SourceGidIndex(*conn);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(*forced, *natural);
}

TEST_F(VerbsDeviceTest, GidIndexOverridesRdmaCmsChoice) {
  auto server = Make(Options(1));
  ASSERT_NE(server, nullptr);
  const std::string dev = Device(*server);
  const int natural = GidIndexOfIpv4(dev, addr1_);
  const int alt = GidIndexOfIpv4(dev, alt_);
  ASSERT_GE(natural, 0);
  ASSERT_GE(alt, 0) << "no GID for " << alt_ << " on " << dev;
  ASSERT_NE(alt, natural);
  auto listen = server->Listen(addr1_ + ":0");
  ASSERT_TRUE(listen.ok()) << listen.status();

  // rdma_cm alone would use addr1's GID (the route to a local address starts
  // there); the forced index makes the QP, and the CM exchange, use alt's.
  EndpointOptions co = Options(2);
  co.gid_index = alt;
  auto client = Make(co);
  ASSERT_NE(client, nullptr);
  auto conn = ConnectAndRead(*server, *listen, *client);
  ASSERT_NE(conn, nullptr);
  auto sgid = verbs::TEST_SourceGidIndex(*conn);
  ASSERT_TRUE(sgid.ok()) << sgid.status();
  EXPECT_EQ(*sgid, alt);
  auto accepted = server->Accept(DeadlineAfter(seconds(10)));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ((*accepted)->peer().address.rfind(alt_ + ":", 0), 0u)
      << "the acceptor should see the forced GID's address, saw "
      << (*accepted)->peer().address;
}

TEST_F(VerbsDeviceTest, ListenerWithGidIndexUsesItAndChecksTheListenAddress) {
  const std::string dev = DeviceOwning(addr1_);
  const int alt = GidIndexOfIpv4(dev, alt_);
  ASSERT_GE(alt, 0);
  EndpointOptions so = Options(1);
  so.gid_index = alt;
  {
    auto wrong = Make(so);
    ASSERT_NE(wrong, nullptr);
    auto listen = wrong->Listen(addr1_ + ":0");
    ASSERT_FALSE(listen.ok());
    EXPECT_EQ(listen.status().code(), StatusCode::kFailedPrecondition) << listen.status();
    EXPECT_NE(listen.status().message().find("gid_index"), std::string::npos);
  }
  std::string listen;
  auto server = Listening(so, alt_, &listen);
  ASSERT_NE(server, nullptr);
  auto client = Make(Options(2));
  ASSERT_NE(client, nullptr);
  auto conn = ConnectAndRead(*server, listen, *client);
  ASSERT_NE(conn, nullptr);
  auto accepted = server->Accept(DeadlineAfter(seconds(10)));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  auto sgid = verbs::TEST_SourceGidIndex(**accepted);
  ASSERT_TRUE(sgid.ok()) << sgid.status();
  EXPECT_EQ(*sgid, alt);
}

TEST_F(VerbsDeviceTest, GidIndexOfAnotherIpFamilyIsAClearErrorAtConnect) {
  std::string listen;
  auto server = Listening(Options(1), addr1_, &listen);
  ASSERT_NE(server, nullptr);
  const int ll = LinkLocalGidIndex(Device(*server));
  ASSERT_GE(ll, 0) << "no IPv6 link-local GID";
  EndpointOptions co = Options(2);
  co.gid_index = ll;
  auto client = Make(co);
  ASSERT_NE(client, nullptr);
  auto conn = client->Connect(listen, {}, DeadlineAfter(seconds(10)));
  ASSERT_FALSE(conn.ok()) << "an ignored gid_index would have connected over IPv4";
  EXPECT_EQ(conn.status().code(), StatusCode::kFailedPrecondition) << conn.status();
  EXPECT_NE(conn.status().message().find("IPv6"), std::string::npos) << conn.status();
  EXPECT_NE(conn.status().message().find("gid_index " + std::to_string(ll)), std::string::npos)
      << conn.status();
}

TEST_F(VerbsDeviceTest, OutOfRangeGidIndexFailsAtCreate) {
  EndpointOptions o = Options(1);
  o.address_hint = addr1_;
  o.gid_index = 4096;
  auto ep = Endpoint::Create(o);
  ASSERT_FALSE(ep.ok());
  EXPECT_EQ(ep.status().code(), StatusCode::kInvalidArgument) << ep.status();
  EXPECT_NE(ep.status().message().find("out of range"), std::string::npos) << ep.status();
}

}  // namespace
}  // namespace rdmaps::transport

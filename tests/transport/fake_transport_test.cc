// The fake backend's fault knobs (transport/fake/fake_transport.h). What every
// backend must do is in the conformance suite (conformance.cc); these tests
// cover only what is fake-specific.
#include "transport/fake/fake_transport.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace rdmaps::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::unique_ptr<Endpoint> MakeFake(std::uint32_t peer_id, milliseconds op_timeout = seconds(30)) {
  EndpointOptions o;
  o.transport = "fake";
  o.job_token = "test";
  o.peer_id = peer_id;
  o.op_timeout = op_timeout;
  auto ep = Endpoint::Create(o);
  EXPECT_TRUE(ep.ok()) << ep.status();
  return std::move(ep).value();
}

// A server with one registered buffer and a connected client.
struct Pair {
  explicit Pair(milliseconds op_timeout = seconds(30))
      : server(MakeFake(1)), client(MakeFake(2, op_timeout)) {
    remote.assign(4096, std::byte{0});
    local.assign(4096, std::byte{0});
    rmr = std::move(server->Register(remote.data(), remote.size(), kRemoteAll)).value();
    lmr = std::move(client->Register(local.data(), local.size(), kAccessNone)).value();
    auto addr = server->Listen("");
    EXPECT_TRUE(addr.ok()) << addr.status();
    auto c = client->Connect(*addr, {}, DeadlineAfter(seconds(5)));
    EXPECT_TRUE(c.ok()) << c.status();
    conn = std::move(c).value();
    auto a = server->Accept(DeadlineAfter(seconds(5)));
    EXPECT_TRUE(a.ok()) << a.status();
    accepted = std::move(a).value();
  }
  Op ReadAll(std::uint64_t ctx = 0) {
    return Op::Read(local.data(), lmr.get(), remote.size(), rmr->remote().addr, rmr->rkey(), ctx);
  }
  Completion WaitOne() {
    Completion c;
    auto n = conn->Wait(std::span(&c, 1), DeadlineAfter(seconds(10)));
    EXPECT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(n.value_or(0), 1u);
    return c;
  }
  std::vector<std::byte> remote, local;
  std::unique_ptr<Endpoint> server, client;
  std::unique_ptr<MemoryRegion> rmr, lmr;
  std::unique_ptr<Connection> conn, accepted;
};

TEST(FakeTransport, ReadMovesBytesAndCompletesInPost) {
  Pair p;
  std::memset(p.remote.data(), 0x5a, p.remote.size());
  Op op = p.ReadAll(7);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  Completion c;
  ASSERT_EQ(p.conn->Poll(std::span(&c, 1)), 1u);
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.context, 7u);
  EXPECT_EQ(p.local, p.remote);
}

}  // namespace
}  // namespace rdmaps::transport

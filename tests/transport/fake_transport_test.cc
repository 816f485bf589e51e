// The fake backend's fault knobs (transport/fake/fake_transport.h). What every
// backend must do is in the conformance suite (conformance.cc); these tests
// cover only what is fake-specific.
#include "transport/fake/fake_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <thread>
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
    auto addr = server->Listen("fake:0");
    EXPECT_TRUE(addr.ok()) << addr.status();
    address = addr.value_or("");
    auto c = client->Connect(address, {}, DeadlineAfter(seconds(5)));
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
  std::string address;
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

// A minimal non-fake endpoint, to check the knobs refuse it.
class NotFakeEndpoint final : public Endpoint {
 public:
  NotFakeEndpoint() : Endpoint(EndpointOptions{}) {}
  std::string_view kind() const override { return "other"; }
  Result<std::unique_ptr<MemoryRegion>> Register(void*, std::size_t, std::uint32_t) override {
    return NotSupportedError("test");
  }
  Result<std::unique_ptr<Connection>> Accept(Deadline) override {
    return NotSupportedError("test");
  }
  Result<std::size_t> WaitNotifications(std::span<Notification>, Deadline) override {
    return NotSupportedError("test");
  }
  void Interrupt() override {}

 private:
  Result<std::string> DoListen(std::string_view, const HostPort&) override {
    return NotSupportedError("test");
  }
  Result<std::unique_ptr<Connection>> DoConnect(std::string_view, const HostPort&,
                                                const ConnectOptions&, Deadline) override {
    return NotSupportedError("test");
  }
};

TEST(FakeTransport, KnobsRefuseOtherBackends) {
  NotFakeEndpoint other;
  EXPECT_FALSE(fake::IsFakeEndpoint(other));
  EXPECT_EQ(fake::SetFaults(other, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fake::ReleaseHeldOps(other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(fake::DropConnection(other, 1).code(), StatusCode::kInvalidArgument);
  auto ep = MakeFake(1);
  EXPECT_TRUE(fake::IsFakeEndpoint(*ep));
  fake::Faults bad;
  bad.read_pieces = 0;
  EXPECT_EQ(fake::SetFaults(*ep, bad).code(), StatusCode::kInvalidArgument);
}

TEST(FakeTransport, ListenNamesAreUniqueAndExclusive) {
  auto a = MakeFake(1), b = MakeFake(2), c = MakeFake(3);
  auto na = a->Listen("fake:0");
  auto nb = b->Listen("fake:0");
  ASSERT_TRUE(na.ok() && nb.ok());
  EXPECT_NE(*na, *nb);
  auto again = a->Listen("x:1");
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  auto taken = c->Listen(*na);
  EXPECT_EQ(taken.status().code(), StatusCode::kAlreadyExists) << taken.status();
  auto named = c->Listen("ps-server:7");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, "ps-server:7");
  auto d = MakeFake(4);
  auto picked = d->Listen("ps-server:0");
  ASSERT_TRUE(picked.ok());
  EXPECT_THAT(*picked, ::testing::StartsWith("ps-server:"));
  EXPECT_NE(*picked, "ps-server:0");
  // The name is free again once its endpoint is gone.
  c.reset();
  auto e = MakeFake(5);
  EXPECT_TRUE(e->Listen("ps-server:7").ok());
}

TEST(FakeTransport, HoldPollsKeepsOpsInFlight) {
  Pair p;
  fake::Faults f;
  f.hold_polls = 2;
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  std::memset(p.remote.data(), 0x11, p.remote.size());
  Op op = p.ReadAll(1);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  Completion c;
  EXPECT_EQ(p.conn->Poll(std::span(&c, 1)), 0u);
  EXPECT_EQ(p.local[0], std::byte{0}) << "a held READ has not moved bytes yet";
  // Written after the post, before the release: the READ sees it.
  std::memset(p.remote.data(), 0x22, p.remote.size());
  EXPECT_EQ(p.conn->Poll(std::span(&c, 1)), 1u);
  EXPECT_TRUE(c.status.ok());
  EXPECT_EQ(p.local[0], std::byte{0x22});
}

TEST(FakeTransport, HoldUntilReleasedReleasesInOrder) {
  Pair p;
  fake::Faults f;
  f.hold_until_released = true;
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  std::vector<Op> ops;
  for (std::uint64_t i = 0; i < 5; ++i) ops.push_back(p.ReadAll(i));
  ASSERT_TRUE(p.conn->Post(ops).ok());
  std::array<Completion, 8> c;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(p.conn->Poll(c), 0u);
  EXPECT_EQ(p.conn->outstanding(), 5u);
  ASSERT_TRUE(fake::ReleaseHeldOps(*p.client, 2).ok());
  ASSERT_EQ(p.conn->Poll(c), 2u);
  EXPECT_EQ(c[0].context, 0u);
  EXPECT_EQ(c[1].context, 1u);
  EXPECT_EQ(p.conn->Poll(c), 0u);
  // A waiter is woken by a release from another thread.
  std::latch waiting(1);
  std::thread releaser([&] {
    waiting.wait();
    EXPECT_TRUE(fake::ReleaseHeldOps(*p.client).ok());
  });
  waiting.count_down();
  auto n = p.conn->Wait(c, DeadlineAfter(seconds(10)));
  releaser.join();
  ASSERT_TRUE(n.ok());
  ASSERT_GE(*n, 1u);
  EXPECT_EQ(c[0].context, 2u);
}

TEST(FakeTransport, HeldOpPastOpTimeoutFailsWithTimedOut) {
  Pair p(milliseconds(20));
  fake::Faults f;
  f.hold_until_released = true;
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  Op ops[] = {p.ReadAll(1), p.ReadAll(2)};
  ASSERT_TRUE(p.conn->Post(ops).ok());
  Completion c = p.WaitOne();
  EXPECT_EQ(c.status.code(), StatusCode::kTimedOut) << c.status;
  EXPECT_EQ(c.context, 1u);
  c = p.WaitOne();
  EXPECT_EQ(c.status.code(), StatusCode::kCancelled) << c.status;
  EXPECT_EQ(p.conn->health().code(), StatusCode::kTimedOut);
}

TEST(FakeTransport, LatencyDelaysCompletion) {
  Pair p;
  fake::Faults f;
  f.latency = milliseconds(30);
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  const auto posted = SteadyClock::now();
  Op op = p.ReadAll(1);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  Completion c;
  EXPECT_EQ(p.conn->Poll(std::span(&c, 1)), 0u);
  c = p.WaitOne();
  EXPECT_TRUE(c.status.ok());
  // Not a speed assertion: the knob's contract is "no earlier than".
  EXPECT_GE(SteadyClock::now() - posted, milliseconds(30));
}

TEST(FakeTransport, FailNthOpFailsExactlyThatOne) {
  Pair p;
  fake::Faults f;
  f.fail_nth_op = 3;
  f.fail_code = StatusCode::kDataLoss;
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  std::memset(p.remote.data(), 0x33, p.remote.size());
  std::vector<Op> ops;
  for (std::uint64_t i = 1; i <= 4; ++i) ops.push_back(p.ReadAll(i));
  ASSERT_TRUE(p.conn->Post(ops).ok());
  std::array<Completion, 4> c;
  ASSERT_EQ(p.conn->Poll(c), 4u);
  EXPECT_TRUE(c[0].status.ok());
  EXPECT_TRUE(c[1].status.ok());
  EXPECT_EQ(c[2].status.code(), StatusCode::kDataLoss);
  EXPECT_THAT(c[2].status.message(), ::testing::HasSubstr("fail_nth_op"));
  EXPECT_EQ(c[3].status.code(), StatusCode::kCancelled);
  EXPECT_EQ(p.conn->health().code(), StatusCode::kDataLoss);
  // Counting continues across connections; op 3 was the only victim.
  auto conn2 = p.client->Connect(p.address, {}, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(conn2.ok());
  ASSERT_TRUE((*conn2)->Post(std::span(ops.data(), 1)).ok());
  ASSERT_EQ((*conn2)->Poll(std::span(c.data(), 1)), 1u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status;
}

TEST(FakeTransport, SplitReadHookTearsAReadDeterministically) {
  Pair p;
  std::memset(p.remote.data(), 0xAA, p.remote.size());
  fake::Faults f;
  f.read_pieces = 4;
  f.read_split_min_bytes = 64;  // 8-byte reads (version words) stay whole.
  std::vector<fake::ReadPiece> calls;
  f.between_read_pieces = [&](const fake::ReadPiece& piece) {
    calls.push_back(piece);
    if (piece.copied == 2) std::memset(p.remote.data(), 0xBB, p.remote.size());
  };
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  Op small = Op::Read(p.local.data(), p.lmr.get(), 8, p.rmr->remote().addr, p.rmr->rkey(), 1);
  ASSERT_TRUE(p.conn->Post(std::span(&small, 1)).ok());
  EXPECT_TRUE(p.WaitOne().status.ok());
  EXPECT_TRUE(calls.empty()) << "a read below read_split_min_bytes is not split";
  Op op = p.ReadAll(2);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  EXPECT_TRUE(p.WaitOne().status.ok());
  ASSERT_EQ(calls.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(calls[i].copied, i + 1);
    EXPECT_EQ(calls[i].pieces, 4u);
    EXPECT_EQ(calls[i].bytes_copied, 1024 * (i + 1));
    EXPECT_EQ(calls[i].context, 2u);
    EXPECT_EQ(calls[i].length, 4096u);
    EXPECT_EQ(calls[i].target_peer_id, 1u);
  }
  // Torn: the first half is old, the second half new.
  EXPECT_EQ(p.local[0], std::byte{0xAA});
  EXPECT_EQ(p.local[2047], std::byte{0xAA});
  EXPECT_EQ(p.local[2048], std::byte{0xBB});
  EXPECT_EQ(p.local[4095], std::byte{0xBB});
}

TEST(FakeTransport, DeregistrationMidReadFailsTheRest) {
  Pair p;
  fake::Faults f;
  f.read_pieces = 2;
  f.between_read_pieces = [&](const fake::ReadPiece&) { p.rmr.reset(); };
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  Op op = p.ReadAll(1);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  EXPECT_EQ(p.WaitOne().status.code(), StatusCode::kPermissionDenied);
}

TEST(FakeTransport, InboundFaultsApplyToOpsArrivingAtTheTarget) {
  Pair p;
  fake::Faults f;
  f.inbound = true;
  f.fail_nth_op = 1;
  f.fail_code = StatusCode::kIOError;
  ASSERT_TRUE(fake::SetFaults(*p.server, f).ok());
  Op op = p.ReadAll(1);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  EXPECT_EQ(p.WaitOne().status.code(), StatusCode::kIOError);
  // The server's own outbound ops are not affected.
  Op back = Op::Read(p.remote.data(), p.rmr.get(), 8, p.lmr->remote().addr, p.lmr->rkey(), 2);
  ASSERT_TRUE(p.accepted->Post(std::span(&back, 1)).code() == StatusCode::kUnavailable)
      << "the failed op broke the connection both ways";
}

TEST(FakeTransport, DropConnectionFailsHeldOpsAndNotifiesBothEnds) {
  Pair p;
  fake::Faults f;
  f.hold_until_released = true;
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  std::memset(p.remote.data(), 0x44, p.remote.size());
  Op ops[] = {p.ReadAll(1), p.ReadAll(2)};
  ASSERT_TRUE(p.conn->Post(ops).ok());
  EXPECT_EQ(fake::DropConnection(*p.server, 99).code(), StatusCode::kNotFound);
  ASSERT_TRUE(fake::DropConnection(*p.server, 2).ok());
  for (std::uint64_t i = 1; i <= 2; ++i) {
    Completion c = p.WaitOne();
    EXPECT_EQ(c.context, i);
    EXPECT_EQ(c.status.code(), StatusCode::kUnavailable) << c.status;
  }
  EXPECT_EQ(p.local[0], std::byte{0}) << "a dropped op never executed";
  EXPECT_EQ(p.conn->health().code(), StatusCode::kUnavailable);
  EXPECT_EQ(p.accepted->health().code(), StatusCode::kUnavailable);
  EXPECT_EQ(fake::DropConnection(*p.server, 2).code(), StatusCode::kNotFound) << "already dropped";
  std::array<Notification, 4> n;
  auto got = p.server->WaitNotifications(n, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(got.ok() && *got == 1u);
  EXPECT_EQ(n[0].kind, Notification::Kind::kDisconnected);
  EXPECT_EQ(n[0].peer_id, 2u);
  got = p.client->WaitNotifications(n, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(got.ok() && *got == 1u);
  EXPECT_EQ(n[0].kind, Notification::Kind::kDisconnected);
  EXPECT_EQ(n[0].peer_id, 1u);
}

TEST(FakeTransport, DropWakesABlockedWait) {
  Pair p;
  fake::Faults f;
  f.hold_until_released = true;  // Never released: only the drop ends it.
  ASSERT_TRUE(fake::SetFaults(*p.client, f).ok());
  Op op = p.ReadAll(5);
  ASSERT_TRUE(p.conn->Post(std::span(&op, 1)).ok());
  std::latch go(1);
  std::thread dropper([&] {
    go.wait();
    EXPECT_TRUE(fake::DropConnection(*p.client, 1).ok());
  });
  go.count_down();
  const Deadline deadline = DeadlineAfter(seconds(20));
  Completion c;
  auto n = p.conn->Wait(std::span(&c, 1), deadline);
  dropper.join();
  ASSERT_TRUE(n.ok());
  ASSERT_EQ(*n, 1u);
  EXPECT_EQ(c.context, 5u);
  EXPECT_EQ(c.status.code(), StatusCode::kUnavailable) << c.status;
  EXPECT_LT(SteadyClock::now(), deadline);
}

TEST(FakeTransport, FailedOpEndsTheConnectionForTheTargetToo) {
  Pair p;
  Op bad = Op::Read(p.local.data(), p.lmr.get(), 8, p.rmr->remote().addr, p.rmr->rkey() + 999);
  ASSERT_TRUE(p.conn->Post(std::span(&bad, 1)).ok());
  EXPECT_EQ(p.WaitOne().status.code(), StatusCode::kPermissionDenied);
  std::array<Notification, 4> n;
  auto got = p.server->WaitNotifications(n, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(got.ok() && *got == 1u);
  EXPECT_EQ(n[0].kind, Notification::Kind::kDisconnected);
  EXPECT_EQ(n[0].peer_id, 2u);
  EXPECT_EQ(p.accepted->health().code(), StatusCode::kUnavailable);
  // The initiator learns from the completion, not from a notification.
  got = p.client->WaitNotifications(n, DeadlineAfter(milliseconds(20)));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
}

TEST(FakeTransport, AcceptIsInterruptible) {
  auto server = MakeFake(1);
  ASSERT_TRUE(server->Listen("fake:0").ok());
  server->Interrupt();
  auto a = server->Accept(DeadlineAfter(seconds(10)));
  EXPECT_EQ(a.status().code(), StatusCode::kCancelled) << a.status();
  auto none = MakeFake(2);
  EXPECT_EQ(none->Accept(DeadlineAfter(seconds(1))).status().code(),
            StatusCode::kFailedPrecondition);
}

// A hello recorded off the "wire" and replayed: the acceptor that saw it
// refuses it by its replay cache; a restarted acceptor (a new endpoint on
// the same name, an empty cache) refuses it because the replayer cannot
// prove the secret over the acceptor's fresh nonce. The real connector's
// own hello still gets in.
TEST(FakeHandshakeTest, ReplayedHelloIsRefusedAlsoByARestartedEndpoint) {
  auto server = MakeFake(1);
  auto client = MakeFake(2);
  ASSERT_TRUE(server->Listen("replayed:7").ok());
  auto hello = std::make_shared<fake::Hello>();
  ASSERT_TRUE(fake::RecordNextHello(*client, hello).ok());
  ConnectOptions co;
  co.user_data = {4, 2};
  auto c = client->Connect("replayed:7", co, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(hello->peer_id, 2u);
  EXPECT_EQ(hello->user_data, co.user_data);
  ASSERT_TRUE(server->Accept(DeadlineAfter(seconds(5))).ok());

  Status same = fake::ReplayHello("replayed:7", *hello);
  EXPECT_EQ(same.code(), StatusCode::kPermissionDenied) << same;
  EXPECT_THAT(same.message(), ::testing::HasSubstr("replayed"));

  c->reset();
  server.reset();  // the restart: nothing of the old endpoint survives
  server = MakeFake(1);
  ASSERT_TRUE(server->Listen("replayed:7").ok());
  Status restarted = fake::ReplayHello("replayed:7", *hello);
  EXPECT_EQ(restarted.code(), StatusCode::kPermissionDenied) << restarted;
  EXPECT_THAT(restarted.message(), ::testing::HasSubstr("proof of the job secret over its nonce"));
  EXPECT_EQ(server->Accept(DeadlineAfter(milliseconds(50))).status().code(), StatusCode::kTimedOut);

  auto again = client->Connect("replayed:7", co, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(server->Accept(DeadlineAfter(seconds(5))).ok());
}

}  // namespace
}  // namespace rdmaps::transport

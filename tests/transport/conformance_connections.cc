// The transport conformance suite (see conformance.h), part three:
// connections -- accepting, the handshake and its refusals, deadlines,
// several connections at once, and what a lost connection does to the ops in
// flight and to the peer. Written against transport/transport.h only; runs on
// every backend.
#include <gmock/gmock.h>

#include <array>
#include <chrono>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "tests/transport/conformance.h"

namespace rdmaps::transport {
namespace {

using conformance::Fill;
using conformance::HasPattern;
using conformance::kLongWait;
using std::chrono::milliseconds;
using std::chrono::seconds;

// --- Connections, handshake, deadlines. ----------------------------------

TEST_P(TransportConformance, AcceptedSideCanPostToo) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  // The server's local buffer is its region; the client's memory is the
  // target now (lmr has kRemoteAll).
  Fill({w.local(), 256}, 5);
  ASSERT_OK(RunOne(*w.accepted,
                   Op::Read(w.remote(), w.rmr.get(), 256, w.lmr->remote().addr, w.lmr->rkey(), 1)));
  EXPECT_TRUE(HasPattern({w.remote(), 256}, 5));
  Fill({w.remote() + 1024, 256}, 6);
  ASSERT_OK(RunOne(*w.accepted, Op::Write(w.remote() + 1024, w.rmr.get(), 256,
                                          w.lmr->remote().addr + 512, w.lmr->rkey(), 2)));
  EXPECT_TRUE(HasPattern({w.local() + 512, 256}, 6));
  auto* result = reinterpret_cast<std::uint64_t*>(w.remote() + 2048);
  w.local_mem[100] = 9;
  ASSERT_OK(RunOne(*w.accepted, Op::FetchAdd(result, w.rmr.get(), w.lmr->remote().addr + 800,
                                             w.lmr->rkey(), 1, 3)));
  EXPECT_EQ(*result, 9u);
  EXPECT_EQ(w.local_mem[100], 10u);
  // The client's ops still work alongside.
  EXPECT_OK(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 8, w.raddr(), w.rkey(), 4)));
}

// An immediate written to the connecting side (the accepted end posts)
// names that side's connection: a consumer that opened it (a replacement
// backup taking its primary's log) matches the notification to it.
TEST_P(TransportConformance, ConnectingSideNamesItsConnectionInItsNotifications) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  EXPECT_NE(w.conn->peer().connection, 0u);
  EXPECT_NE(w.accepted->peer().connection, 0u);
  Fill({w.remote(), 64}, 3);
  const Op op =
      Op::WriteWithImm(w.remote(), w.rmr.get(), 64, w.lmr->remote().addr, w.lmr->rkey(), 41, 1);
  ASSERT_OK(w.accepted->Post(std::span(&op, 1)));
  std::array<Notification, 4> buf;
  auto got = w.client->WaitNotifications(buf, DeadlineAfter(kLongWait));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(buf[0].imm, 41u);
  EXPECT_EQ(buf[0].peer_id, w.conn->peer().peer_id);
  EXPECT_EQ(buf[0].connection, w.conn->peer().connection);
  EXPECT_TRUE(HasPattern({w.local(), 64}, 3));
  std::vector<Completion> c = WaitFor(*w.accepted, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_OK(c[0].status);
}

TEST_P(TransportConformance, HandshakeCarriesPeerIdsAndUserData) {
  auto server = NewEndpoint(kServerId);
  auto client = NewEndpoint(kClientId);
  ASSERT_TRUE(server && client);
  const std::string address = ListenOn(*server);
  ConnectOptions co;
  co.user_data = {1, 2, 3, 250};
  auto conn = ConnectTo(*client, address, co);
  ASSERT_TRUE(conn);
  auto accepted = AcceptOn(*server);
  ASSERT_TRUE(accepted);
  EXPECT_EQ(conn->peer().peer_id, kServerId);
  EXPECT_EQ(accepted->peer().peer_id, kClientId);
  EXPECT_EQ(accepted->peer().user_data, co.user_data);
  EXPECT_FALSE(conn->peer().address.empty());
  EXPECT_TRUE(conn->health().ok());
  EXPECT_TRUE(accepted->health().ok());
  co.user_data.assign(kMaxHandshakeUserData + 1, 0);
  auto too_big = client->Connect(address, co, DeadlineAfter(kLongWait));
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument) << too_big.status();
}

TEST_P(TransportConformance, WrongJobSecretIsPermissionDeniedWithTheFix) {
  auto server = NewEndpoint(kServerId);
  auto intruder = NewEndpoint(kClientId, [](EndpointOptions& o) { o.job_token = "another-job"; });
  ASSERT_TRUE(server && intruder);
  const std::string address = ListenOn(*server);
  auto c = intruder->Connect(address, {}, DeadlineAfter(kLongWait));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("job secret mismatch"));
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("RDMAPS_JOB_SECRET_FILE"));
  // The refused peer was not queued for Accept.
  auto a = server->Accept(DeadlineAfter(milliseconds(50)));
  EXPECT_EQ(a.status().code(), StatusCode::kTimedOut) << a.status();
}

TEST_P(TransportConformance, EmptySecretNeedsTheInsecureOptOut) {
  auto refused = NewEndpointStatus(kServerId, [](EndpointOptions& o) { o.job_token.clear(); });
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("insecure"));
  // Insecure endpoints talk to each other, and refuse an endpoint with a
  // secret (and it them).
  auto insecure = [](EndpointOptions& o) {
    o.job_token.clear();
    o.insecure = true;
  };
  auto server = NewEndpoint(kServerId, insecure);
  auto client = NewEndpoint(kClientId, insecure);
  auto secure = NewEndpoint(kClientId + 1);
  ASSERT_TRUE(server && client && secure);
  const std::string address = ListenOn(*server);
  auto ok = client->Connect(address, {}, DeadlineAfter(kLongWait));
  EXPECT_TRUE(ok.ok()) << ok.status();
  auto c = secure->Connect(address, {}, DeadlineAfter(kLongWait));
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
}

TEST_P(TransportConformance, ProtocolVersionMismatchIsFailedPrecondition) {
  if (!backend().set_protocol_version) {
    GTEST_SKIP() << backend().name << " has no hook to announce another protocol version";
  }
  auto server = NewEndpoint(kServerId);
  auto client = NewEndpoint(kClientId);
  ASSERT_TRUE(server && client);
  ASSERT_OK(backend().set_protocol_version(*client, kProtocolVersion + 1));
  const std::string address = ListenOn(*server);
  auto c = client->Connect(address, {}, DeadlineAfter(kLongWait));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status();
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("version"));
}

TEST_P(TransportConformance, ConnectToNobodyFailsByTheDeadline) {
  std::string address;
  {
    // An address that was valid a moment ago and has nobody behind it now.
    auto gone = NewEndpoint(kServerId);
    ASSERT_TRUE(gone);
    address = ListenOn(*gone);
  }
  auto client = NewEndpoint(kClientId);
  ASSERT_TRUE(client);
  const Deadline deadline = DeadlineAfter(seconds(2));
  auto c = client->Connect(address, {}, deadline);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().code(), ::testing::AnyOf(StatusCode::kUnavailable, StatusCode::kTimedOut))
      << c.status();
  EXPECT_LT(SteadyClock::now(), deadline + seconds(5)) << "Connect overran its deadline";
}

TEST_P(TransportConformance, AcceptTimesOutWhenNobodyConnects) {
  auto server = NewEndpoint(kServerId);
  ASSERT_TRUE(server);
  ListenOn(*server);
  auto a = server->Accept(DeadlineAfter(milliseconds(50)));
  EXPECT_EQ(a.status().code(), StatusCode::kTimedOut) << a.status();
}

TEST_P(TransportConformance, SeveralConnectionsUsedConcurrently) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  constexpr int kThreads = 3;
  constexpr std::size_t kChunk = 4096;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    auto conn = ConnectTo(*w.client, w.address);
    ASSERT_TRUE(conn);
    threads.emplace_back([&, t, conn = std::move(conn)] {
      start.arrive_and_wait();
      std::byte* l = w.local() + t * 2 * kChunk;
      for (std::uint64_t round = 0; round < 30; ++round) {
        Fill({l, kChunk}, round * 10 + t);
        const Op ops[] = {
            Op::Write(l, w.lmr.get(), kChunk, w.raddr(t * kChunk), w.rkey(), 1),
            Op::Read(l + kChunk, w.lmr.get(), kChunk, w.raddr(t * kChunk), w.rkey(), 2),
        };
        std::vector<Completion> c = RunBatch(*conn, ops);
        ASSERT_EQ(c.size(), 2u);
        ASSERT_TRUE(c[0].status.ok() && c[1].status.ok());
        ASSERT_TRUE(HasPattern({l + kChunk, kChunk}, round * 10 + t));
      }
    });
  }
  for (auto& th : threads) th.join();
}

// --- Connection loss. ----------------------------------------------------

TEST_P(TransportConformance, CloseCompletesOutstandingOpsAndNotifiesThePeer) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::vector<Op> ops;
  for (std::uint64_t i = 0; i < 32; ++i) {
    ops.push_back(
        Op::Read(w.local() + i * 1024, w.lmr.get(), 1024, w.raddr(i * 1024), w.rkey(), i));
  }
  ASSERT_OK(w.conn->Post(ops));
  w.conn->Close();
  w.conn->Close();  // Idempotent.
  // Every op still yields its completion, in order: done before the close,
  // or Cancelled.
  std::vector<Completion> got(64);
  std::size_t n = 0;
  const Deadline deadline = DeadlineAfter(kLongWait);
  while (n < ops.size() && SteadyClock::now() < deadline) {
    n += w.conn->Poll(std::span(got.data() + n, got.size() - n));
  }
  ASSERT_EQ(n, ops.size());
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].context, i);
    if (!got[i].status.ok()) {
      EXPECT_EQ(got[i].status.code(), StatusCode::kCancelled) << got[i].status;
    }
  }
  EXPECT_EQ(w.conn->outstanding(), 0u);
  EXPECT_FALSE(w.conn->health().ok());
  EXPECT_FALSE(w.conn->Post(std::span(ops.data(), 1)).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectDisconnected(*w.server, kClientId));
}

TEST_P(TransportConformance, DestroyedClientEndpointNotifiesTheServer) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  ASSERT_OK(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 8, w.raddr(), w.rkey(), 1)));
  w.conn.reset();
  w.lmr.reset();
  w.client.reset();
  ASSERT_NO_FATAL_FAILURE(ExpectDisconnected(*w.server, kClientId));
}

TEST_P(TransportConformance, PeerLossMidFlightFailsOpsAndNothingHangs) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::vector<Op> ops;
  for (std::uint64_t i = 0; i < 64; ++i) {
    ops.push_back(Op::Read(w.local(), w.lmr.get(), 16384, w.raddr(), w.rkey(), i));
  }
  ASSERT_OK(w.conn->Post(ops));
  // The server goes away with the ops in flight.
  w.accepted.reset();
  w.rmr.reset();
  w.server.reset();
  std::vector<Completion> c = WaitFor(*w.conn, ops.size());
  ASSERT_EQ(c.size(), ops.size()) << "every op completes, also when its peer is gone";
  for (std::size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i].context, i);
  // Keep posting until the loss shows; each attempt is bounded.
  const Deadline deadline = DeadlineAfter(kLongWait);
  Status seen;
  while (seen.ok() && SteadyClock::now() < deadline) {
    const Op op = Op::Read(w.local(), w.lmr.get(), 8, ops[0].remote_addr, ops[0].rkey, 99);
    seen = w.conn->Post(std::span(&op, 1));
    if (!seen.ok()) {
      EXPECT_EQ(seen.code(), StatusCode::kUnavailable) << seen;
      break;
    }
    std::vector<Completion> one = WaitFor(*w.conn, 1);
    ASSERT_EQ(one.size(), 1u);
    seen = one[0].status;
  }
  EXPECT_FALSE(seen.ok()) << "the peer's loss never surfaced";
  EXPECT_FALSE(w.conn->health().ok());
}

}  // namespace
}  // namespace rdmaps::transport

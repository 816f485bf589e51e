// Verbs-specific tests that the shared conformance suite does not cover:
// selective signaling over long batches, the handshake's reject path,
// RDMA_CM_EVENT_DISCONNECTED -> kDisconnected, flushes when closing with ops
// in flight, inline writes, an immediate that lands before the connector's
// Connect has returned. Runs where an RDMA device exists (the Soft-RoCE
// VM in CI, tests/vm/); skips with the reason elsewhere.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "tests/vm/verbs_test_env.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_transport.h"

namespace rdmaps::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

class VerbsSmokeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!VerbsUsable(&why)) GTEST_SKIP() << "verbs not usable here: " << why;
    addr_ = rdmaps::testing::VerbsTestAddress(&why);
    if (addr_.empty()) GTEST_SKIP() << why;
    server_ = MakeEndpoint(1, "token");
    auto listen = server_->Listen(addr_ + ":0");
    ASSERT_TRUE(listen.ok()) << listen.status();
    listen_addr_ = *listen;
    client_ = MakeEndpoint(2, "token");
  }

  std::unique_ptr<Endpoint> MakeEndpoint(std::uint32_t id, std::string token) {
    EndpointOptions o;
    o.transport = "verbs";
    o.peer_id = id;
    o.job_token = std::move(token);
    o.op_timeout = milliseconds(20000);
    auto ep = Endpoint::Create(o);
    EXPECT_TRUE(ep.ok()) << ep.status();
    return ep.ok() ? std::move(ep).value() : nullptr;
  }

  std::unique_ptr<Connection> Connect(Endpoint& ep) {
    auto c = ep.Connect(listen_addr_, {}, DeadlineAfter(seconds(10)));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Waits until `n` completions have arrived.
  std::vector<Completion> Collect(Connection& c, std::size_t n) {
    std::vector<Completion> all;
    Completion buf[64];
    auto deadline = DeadlineAfter(seconds(20));
    while (all.size() < n) {
      auto got = c.Wait(buf, deadline);
      if (!got.ok() || *got == 0) {
        ADD_FAILURE() << "waiting for completions: "
                      << (got.ok() ? std::string("deadline") : got.status().ToString());
        break;
      }
      all.insert(all.end(), std::make_move_iterator(buf), std::make_move_iterator(buf + *got));
    }
    return all;
  }

  std::string addr_;
  std::string listen_addr_;
  std::unique_ptr<Endpoint> server_;
  std::unique_ptr<Endpoint> client_;
};

TEST_F(VerbsSmokeTest, EveryOpOfLongBatchesCompletesInOrder) {
  std::vector<std::uint64_t> target(4096, 0);
  std::vector<std::uint64_t> local(4096);
  std::iota(local.begin(), local.end(), 1);
  auto tmr = server_->Register(target.data(), target.size() * 8, kRemoteAll);
  auto lmr = client_->Register(local.data(), local.size() * 8, kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  const std::size_t batch = std::min<std::size_t>(100, conn->max_outstanding());
  std::uint64_t ctx = 0;
  for (std::size_t round = 0; round < 4096 / batch; ++round) {
    std::vector<Op> ops;
    for (std::size_t i = 0; i < batch; ++i, ++ctx) {
      ops.push_back(Op::Write(&local[ctx], lmr->get(), 8, (*tmr)->remote().addr + ctx * 8,
                              (*tmr)->rkey(), ctx));
    }
    ASSERT_TRUE(conn->Post(ops).ok());
    auto done = Collect(*conn, batch);
    ASSERT_EQ(done.size(), batch);
    for (std::size_t i = 0; i < batch; ++i) {
      EXPECT_TRUE(done[i].status.ok()) << done[i].status;
      EXPECT_EQ(done[i].context, ctx - batch + i);
    }
  }
  EXPECT_EQ(conn->outstanding(), 0u);
  for (std::size_t i = 0; i < ctx; ++i) ASSERT_EQ(target[i], i + 1) << i;
}

TEST_F(VerbsSmokeTest, UnconsumedNotificationsHoldSendersBackAndLoseNothing) {
  // Nobody takes the target's notifications: once its SRQ's receives are
  // used up (1024 at most), further WRITE_WITH_IMMs meet receiver-not-ready
  // and wait. Taking the notifications lets them all through, in order.
  constexpr std::size_t kOps = 1600;
  std::vector<std::uint64_t> target(kOps, 0), local(kOps);
  std::iota(local.begin(), local.end(), 7);
  auto tmr = server_->Register(target.data(), target.size() * 8, kRemoteAll);
  auto lmr = client_->Register(local.data(), local.size() * 8, kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  std::size_t posted = 0, completed = 0;
  std::uint32_t taken = 0;
  Completion buf[64];
  // Post as the send queue allows until completions stop coming.
  auto pump = [&](Deadline until) {
    while (SteadyClock::now() < until && completed < kOps) {
      std::vector<Op> ops;
      while (posted < kOps && conn->outstanding() + ops.size() < conn->max_outstanding()) {
        ops.push_back(Op::WriteWithImm(&local[posted], lmr->get(), 8,
                                       (*tmr)->remote().addr + posted * 8, (*tmr)->rkey(),
                                       static_cast<std::uint32_t>(posted), posted));
        ++posted;
      }
      if (!ops.empty()) {
        ASSERT_TRUE(conn->Post(ops).ok());
      }
      auto got = conn->Wait(buf, std::min(until, DeadlineAfter(milliseconds(20))));
      ASSERT_TRUE(got.ok()) << got.status();
      for (std::size_t i = 0; i < *got; ++i) {
        ASSERT_TRUE(buf[i].status.ok()) << buf[i].status;
        ASSERT_EQ(buf[i].context, completed + i);
      }
      completed += *got;
    }
  };
  pump(DeadlineAfter(seconds(3)));
  EXPECT_LT(completed, kOps) << "every WRITE_WITH_IMM completed though nobody took the "
                                "notifications: the queue is unbounded";
  EXPECT_GE(completed, 1u);
  // Now consume; everything arrives exactly once, in order, after its data.
  const Deadline deadline = DeadlineAfter(seconds(60));
  while ((taken < kOps || completed < kOps) && SteadyClock::now() < deadline) {
    Notification n[64];
    auto got = server_->WaitNotifications(n, DeadlineAfter(milliseconds(5)));
    ASSERT_TRUE(got.ok()) << got.status();
    for (std::size_t k = 0; k < *got; ++k) {
      ASSERT_EQ(n[k].kind, Notification::Kind::kImmediate);
      ASSERT_EQ(n[k].imm, taken) << "lost or reordered notification";
      ASSERT_EQ(target[taken], 7u + taken);
      ++taken;
    }
    pump(DeadlineAfter(milliseconds(5)));
  }
  EXPECT_EQ(taken, kOps);
  EXPECT_EQ(completed, kOps);
}

TEST_F(VerbsSmokeTest, ReadFetchAddCompareSwapAndImm) {
  std::vector<std::uint64_t> target(64);
  std::iota(target.begin(), target.end(), 100);
  std::vector<std::uint64_t> local(64, 0);
  local[30] = 7000;
  local[31] = 7001;
  auto tmr = server_->Register(target.data(), 512, kRemoteAll);
  auto lmr = client_->Register(local.data(), 512, kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  auto r = (*tmr)->remote();
  Op ops[] = {
      Op::Read(&local[0], lmr->get(), 64, r.addr, r.rkey, 1),
      Op::FetchAdd(&local[10], lmr->get(), r.addr + 8 * 20, r.rkey, 5, 2),
      Op::CompareSwap(&local[11], lmr->get(), r.addr + 8 * 21, r.rkey, 121, 7, 3),
      Op::CompareSwap(&local[12], lmr->get(), r.addr + 8 * 22, r.rkey, 999, 7, 4),
      Op::WriteWithImm(&local[30], lmr->get(), 16, r.addr + 8 * 40, r.rkey, 0xabcd1234, 5)
          .WithFence(),
  };
  ASSERT_TRUE(conn->Post(ops).ok());
  auto done = Collect(*conn, 5);
  ASSERT_EQ(done.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(done[i].status.ok()) << done[i].status;
    EXPECT_EQ(done[i].context, i + 1);
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(local[i], 100u + i);
  EXPECT_EQ(local[10], 120u);
  EXPECT_EQ(target[20], 125u);
  EXPECT_EQ(local[11], 121u);
  EXPECT_EQ(target[21], 7u);
  EXPECT_EQ(local[12], 122u);
  EXPECT_EQ(target[22], 122u);
  Notification n[4];
  auto got = server_->WaitNotifications(n, DeadlineAfter(seconds(10)));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(n[0].kind, Notification::Kind::kImmediate);
  EXPECT_EQ(n[0].imm, 0xabcd1234u);
  EXPECT_EQ(n[0].peer_id, 2u);
  EXPECT_EQ(n[0].length, 16u);
  EXPECT_EQ(target[40], 7000u);
  EXPECT_EQ(target[41], 7001u);
}

// The accepted side may post as soon as Accept hands it the connection,
// before the connector's Connect has returned (a primary answering a
// replacement backup at once): an immediate that lands in that window names
// the acceptor's peer id and the connector's connection, as a later one does
// (it once came with peer id 0, and the replacement dropped the answer).
TEST_F(VerbsSmokeTest, ImmediateBeforeConnectReturnsNamesThePeer) {
  std::vector<std::uint64_t> target(8, 0), local(8, 5);
  auto tmr = client_->Register(target.data(), 64, kRemoteAll);
  auto lmr = server_->Register(local.data(), 64, kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  std::unique_ptr<Connection> accepted;
  Status early_status = InternalError("the hook did not run");
  std::vector<Notification> early;
  // In the window: the acceptor writes with an immediate and sees it
  // acknowledged, and this endpoint files the notification.
  ASSERT_TRUE(verbs::TEST_AfterProofAccepted(*client_, [&] {
                const Deadline deadline = DeadlineAfter(seconds(10));
                auto a = server_->Accept(deadline);
                if (!a.ok()) {
                  early_status = a.status();
                  return;
                }
                accepted = std::move(a).value();
                const Op op = Op::WriteWithImm(local.data(), lmr->get(), 64, (*tmr)->remote().addr,
                                               (*tmr)->rkey(), 77, 1);
                early_status = accepted->Post(std::span(&op, 1));
                if (!early_status.ok()) return;
                Completion c[1];
                auto done = accepted->Wait(c, deadline);
                early_status = !done.ok()   ? done.status()
                               : *done == 0 ? TimedOutError("no completion by the deadline")
                                            : c[0].status;
                if (!early_status.ok()) return;
                Notification buf[4];
                auto got = client_->WaitNotifications(buf, deadline);
                early_status = got.status();
                if (got.ok()) early.assign(buf, buf + *got);
              }).ok());
  auto conn = Connect(*client_);
  ASSERT_TRUE(verbs::TEST_AfterProofAccepted(*client_, {}).ok());
  ASSERT_NE(conn, nullptr);
  ASSERT_TRUE(early_status.ok()) << early_status;
  ASSERT_EQ(early.size(), 1u) << "no immediate filed before Connect returned";
  EXPECT_EQ(early[0].kind, Notification::Kind::kImmediate);
  EXPECT_EQ(early[0].imm, 77u);
  EXPECT_EQ(early[0].length, 64u);
  EXPECT_EQ(early[0].peer_id, 1u);
  EXPECT_EQ(early[0].peer_id, conn->peer().peer_id);
  EXPECT_NE(conn->peer().connection, 0u);
  EXPECT_EQ(early[0].connection, conn->peer().connection);
  EXPECT_EQ(target[7], 5u);
}

TEST_F(VerbsSmokeTest, WrongSecretIsPermissionDenied) {
  auto intruder = MakeEndpoint(3, "other-token");
  ASSERT_NE(intruder, nullptr);
  auto c = intruder->Connect(listen_addr_, {}, DeadlineAfter(seconds(10)));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_NE(c.status().message().find("job secret mismatch"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("RDMAPS_JOB_SECRET_FILE"), std::string::npos) << c.status();
}

TEST_F(VerbsSmokeTest, NobodyListeningIsUnavailable) {
  auto other = MakeEndpoint(4, "token");
  auto l = other->Listen(addr_ + ":0");
  ASSERT_TRUE(l.ok());
  std::string dead = *l;
  other.reset();  // the port is free again: nobody listens there
  auto c = client_->Connect(dead, {}, DeadlineAfter(seconds(10)));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status();
}

TEST_F(VerbsSmokeTest, HandshakeCarriesPeerIdAndUserData) {
  ConnectOptions co;
  co.user_data = {1, 2, 3, 4, 5};
  auto c = client_->Connect(listen_addr_, co, DeadlineAfter(seconds(10)));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->peer().peer_id, 1u);
  auto a = server_->Accept(DeadlineAfter(seconds(10)));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->peer().peer_id, 2u);
  EXPECT_EQ((*a)->peer().user_data, co.user_data);
}

TEST_F(VerbsSmokeTest, BadRkeyFailsThenTheRestIsCancelled) {
  std::vector<std::uint64_t> target(8, 0), local(8, 0);
  auto tmr = server_->Register(target.data(), 64, kRemoteRead);
  auto lmr = client_->Register(local.data(), 64, kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  auto r = (*tmr)->remote();
  Op ops[] = {
      Op::Read(&local[0], lmr->get(), 8, r.addr, r.rkey, 1),
      Op::Write(&local[0], lmr->get(), 8, r.addr, r.rkey, 2),  // no write right
      Op::Read(&local[1], lmr->get(), 8, r.addr, r.rkey, 3),
  };
  ASSERT_TRUE(conn->Post(ops).ok());
  auto done = Collect(*conn, 3);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_TRUE(IsRemoteAccessError(done[1].status)) << done[1].status;
  EXPECT_EQ(done[2].status.code(), StatusCode::kCancelled) << done[2].status;
  EXPECT_FALSE(conn->health().ok());
  EXPECT_FALSE(conn->Post(ops).ok());
}

TEST_F(VerbsSmokeTest, PeerCloseDeliversDisconnected) {
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  auto accepted = server_->Accept(DeadlineAfter(seconds(10)));
  ASSERT_TRUE(accepted.ok());
  conn.reset();
  Notification n[4];
  auto got = server_->WaitNotifications(n, DeadlineAfter(seconds(10)));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(n[0].kind, Notification::Kind::kDisconnected);
  EXPECT_EQ(n[0].peer_id, 2u);
  EXPECT_FALSE((*accepted)->health().ok());
}

TEST_F(VerbsSmokeTest, CloseWithOpsInFlightCancelsCleanly) {
  std::vector<std::uint8_t> target(1 << 20), local(1 << 20);
  auto tmr = server_->Register(target.data(), target.size(), kRemoteAll);
  auto lmr = client_->Register(local.data(), local.size(), kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  std::vector<Op> ops;
  for (std::uint64_t i = 0; i < 32; ++i) {
    ops.push_back(
        Op::Read(local.data(), lmr->get(), local.size(), (*tmr)->remote().addr, (*tmr)->rkey(), i));
  }
  ASSERT_TRUE(conn->Post(ops).ok());
  conn->Close();
  Completion buf[64];
  std::size_t n = conn->Poll(buf);
  ASSERT_EQ(n, 32u);  // every op reports, none hangs
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(buf[i].context, i);
    EXPECT_TRUE(buf[i].status.ok() || buf[i].status.code() == StatusCode::kCancelled)
        << buf[i].status;
  }
  EXPECT_FALSE(conn->Post(ops).ok());
}

TEST_F(VerbsSmokeTest, DeregisteredRegionIsRefused) {
  std::vector<std::uint64_t> target(8, 0), local(8, 0);
  auto tmr = server_->Register(target.data(), 64, kRemoteAll);
  auto lmr = client_->Register(local.data(), 64, kAccessNone);
  ASSERT_TRUE(tmr.ok() && lmr.ok());
  auto r = (*tmr)->remote();
  tmr->reset();
  auto conn = Connect(*client_);
  ASSERT_NE(conn, nullptr);
  Op op = Op::Read(&local[0], lmr->get(), 8, r.addr, r.rkey, 1);
  ASSERT_TRUE(conn->Post({&op, 1}).ok());
  auto done = Collect(*conn, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(IsRemoteAccessError(done[0].status)) << done[0].status;
}

}  // namespace
}  // namespace rdmaps::transport

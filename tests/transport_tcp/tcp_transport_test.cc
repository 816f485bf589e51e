// The tcp backend's own behaviour, beyond the shared conformance suite:
// address parsing, handshakes, large zero-copy transfers, pipelining, peers
// that vanish or stall mid-op, deregistration under load, and the progress
// thread's deadlines for silent peers. Raw sockets play misbehaving peers.
#include "transport/tcp/tcp_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "tests/transport_tcp/tcp_test_util.h"
#include "transport/tcp/tcp_socket.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaps::transport::tcp {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::kToken;
using testing::MakeEndpoint;
using testing::Pair;
using testing::RunOne;

// --- Addresses -------------------------------------------------------------

// host:port parsing itself: tests/base/host_port_test.cc.

TEST(TcpAddress, ListenAndConnectRejectMalformedAddresses) {
  auto ep = MakeEndpoint(1);
  ASSERT_TRUE(ep);
  auto l = ep->Listen("no-port-here");
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << l.status();
  auto c = ep->Connect("1.2.3.4", {}, DeadlineAfter(seconds(1)));
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
}

TEST(TcpAddress, ListenPortZeroReturnsTheBoundPort) {
  auto ep = MakeEndpoint(1);
  ASSERT_TRUE(ep);
  auto a = ep->Listen("127.0.0.1:0");
  ASSERT_TRUE(a.ok()) << a.status();
  auto hp = ParseHostPort(*a, "the bound address");
  ASSERT_TRUE(hp.ok()) << *a;
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_NE(hp->port, 0);
  auto again = ep->Listen("127.0.0.1:0");
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

TEST(TcpAddress, WorksOverIpv6Loopback) {
  Fd probe(::socket(AF_INET6, SOCK_STREAM, 0));
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_loopback;
  if (!probe.valid() || ::bind(probe.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    GTEST_SKIP() << "no IPv6 loopback on this machine";
  }
  auto server = MakeEndpoint(1);
  auto client = MakeEndpoint(2);
  std::uint64_t word = 41;
  auto rmr = std::move(server->Register(&word, 8, kRemoteAtomic)).value();
  std::uint64_t prior = 0;
  auto lmr = std::move(client->Register(&prior, 8, kAccessNone)).value();
  auto a = server->Listen("[::1]:0");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->rfind("[::1]:", 0), 0u) << *a;
  auto conn = client->Connect(*a, {}, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(conn.ok()) << conn.status();
  ASSERT_TRUE(
      RunOne(**conn, Op::FetchAdd(&prior, lmr.get(), rmr->remote().addr, rmr->rkey(), 1)).ok());
  EXPECT_EQ(prior, 41u);
  EXPECT_EQ(word, 42u);
}

// --- Handshake -------------------------------------------------------------

TEST(TcpHandshake, CarriesPeerIdsAndUserData) {
  auto server = MakeEndpoint(11);
  auto client = MakeEndpoint(22);
  auto a = server->Listen("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  ConnectOptions co;
  co.user_data = {1, 2, 3, 250};
  auto conn = client->Connect(*a, co, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_EQ((*conn)->peer().peer_id, 11u);
  auto acc = server->Accept(DeadlineAfter(seconds(5)));
  ASSERT_TRUE(acc.ok()) << acc.status();
  EXPECT_EQ((*acc)->peer().peer_id, 22u);
  EXPECT_EQ((*acc)->peer().user_data, co.user_data);
  EXPECT_EQ((*acc)->peer().address.rfind("127.0.0.1:", 0), 0u);
}

TEST(TcpHandshake, TokenMismatchIsPermissionDenied) {
  auto server = MakeEndpoint(1);
  EndpointOptions o;
  o.job_token = "another-job";
  o.peer_id = 2;
  auto client = std::move(CreateEndpoint(o)).value();
  auto a = server->Listen("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  auto conn = client->Connect(*a, {}, DeadlineAfter(seconds(5)));
  ASSERT_FALSE(conn.ok());
  EXPECT_EQ(conn.status().code(), StatusCode::kPermissionDenied) << conn.status();
  EXPECT_NE(conn.status().message().find("job secret mismatch"), std::string::npos)
      << conn.status();
  EXPECT_NE(conn.status().message().find("RDMAPS_JOB_SECRET_FILE"), std::string::npos)
      << conn.status();
  auto acc = server->Accept(DeadlineAfter(milliseconds(100)));
  EXPECT_EQ(acc.status().code(), StatusCode::kTimedOut) << "a refused peer was accepted";
}

TEST(TcpHandshake, VersionMismatchIsFailedPrecondition) {
  auto server = MakeEndpoint(1);
  auto client = MakeEndpoint(2);
  ASSERT_TRUE(TEST_SetProtocolVersion(*client, kProtocolVersion + 1).ok());
  auto a = server->Listen("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  auto conn = client->Connect(*a, {}, DeadlineAfter(seconds(5)));
  EXPECT_EQ(conn.status().code(), StatusCode::kFailedPrecondition) << conn.status();
  EXPECT_NE(conn.status().message().find("version"), std::string::npos);
}

TEST(TcpHandshake, ConnectToNobodyIsUnavailable) {
  // Bind a port, then close it: nobody listens there.
  std::string address;
  {
    auto ep = MakeEndpoint(1);
    address = ep->Listen("127.0.0.1:0").value();
  }
  auto client = MakeEndpoint(2);
  auto conn = client->Connect(address, {}, DeadlineAfter(seconds(5)));
  EXPECT_EQ(conn.status().code(), StatusCode::kUnavailable) << conn.status();
}

TEST(TcpHandshake, ConnectToASilentListenerTimesOutAtTheDeadline) {
  Fd l(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(l.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  ASSERT_EQ(::listen(l.get(), 8), 0);
  auto client = MakeEndpoint(2);
  auto conn = client->Connect(LocalAddress(l.get()), {}, DeadlineAfter(milliseconds(200)));
  EXPECT_EQ(conn.status().code(), StatusCode::kTimedOut) << conn.status();
}

TEST(TcpHandshake, SilentAcceptedSocketIsClosedAtTheHandshakeDeadline) {
  auto server = MakeEndpoint(1, milliseconds(300));
  auto a = server->Listen("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  Fd raw = testing::RawConnect(*a);
  ASSERT_TRUE(raw.valid());
  EXPECT_TRUE(testing::WaitClosed(raw.get())) << "the silent socket was kept open";
}

// --- Data path -------------------------------------------------------------

TEST(TcpDataPath, LargeWriteThenReadRoundTrips) {
  auto server = MakeEndpoint(1);
  auto client = MakeEndpoint(2);
  const std::size_t n = 8 << 20;
  std::vector<std::uint8_t> remote(n, 0), src(n), dst(n, 0);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::uint8_t>(i * 131 + (i >> 13));
  auto rmr = std::move(server->Register(remote.data(), n, kRemoteAll)).value();
  auto smr = std::move(client->Register(src.data(), n, kAccessNone)).value();
  auto dmr = std::move(client->Register(dst.data(), n, kAccessNone)).value();
  auto conn = std::move(client->Connect(server->Listen("127.0.0.1:0").value(), {},
                                        DeadlineAfter(seconds(5))))
                  .value();
  const auto base = rmr->remote().addr;
  ASSERT_TRUE(RunOne(*conn, Op::Write(src.data(), smr.get(), n, base, rmr->rkey())).ok());
  EXPECT_EQ(remote, src);
  ASSERT_TRUE(RunOne(*conn, Op::Read(dst.data(), dmr.get(), n, base, rmr->rkey())).ok());
  EXPECT_EQ(dst, src);
}

// Large payloads are read straight into place, with only kDirectLookahead
// bytes of what follows into the receive buffer, on both sides (WRITE
// payloads at the target, READ responses at the initiator): back-to-back
// large ops of odd sizes mixed with small ones, in one post, must all land
// intact, complete in order, and notify once each in order.
TEST(TcpDataPath, BackToBackLargePayloadsMixedWithSmallOpsLandIntact) {
  auto server = MakeEndpoint(1);
  auto client = MakeEndpoint(2);
  constexpr std::size_t kOps = 48;
  auto size_of = [](std::size_t k) -> std::size_t {
    if (k % 4 == 3) return 1 + k * 7;  // small: inside anyone's lookahead
    return 70000 + k * 4099;           // large: over the receive buffer, odd
  };
  std::vector<std::size_t> at(kOps + 1, 0);
  for (std::size_t k = 0; k < kOps; ++k) at[k + 1] = at[k] + size_of(k);
  const std::size_t n = at[kOps];
  std::vector<std::uint8_t> remote(n, 0), src(n), back(n, 0);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::uint8_t>(i * 131 + (i >> 11));
  auto rmr = std::move(server->Register(remote.data(), n, kRemoteAll)).value();
  auto smr = std::move(client->Register(src.data(), n, kAccessNone)).value();
  auto bmr = std::move(client->Register(back.data(), n, kAccessNone)).value();
  auto conn = std::move(client->Connect(server->Listen("127.0.0.1:0").value(), {},
                                        DeadlineAfter(seconds(5))))
                  .value();
  const auto base = rmr->remote().addr;
  auto wait_all = [&](std::size_t ops) {
    std::vector<Completion> done(ops);
    std::size_t got = 0;
    while (got < ops) {
      auto r = conn->Wait({done.data() + got, ops - got}, DeadlineAfter(seconds(10)));
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_GT(*r, 0u);
      got += *r;
    }
    for (std::size_t k = 0; k < ops; ++k) {
      ASSERT_TRUE(done[k].status.ok()) << done[k].status;
      ASSERT_EQ(done[k].context, k) << "completions out of posting order";
    }
  };
  // WRITE_WITH_IMM every other op, plain WRITE the others: one post.
  std::vector<Op> writes;
  for (std::size_t k = 0; k < kOps; ++k) {
    const auto len = static_cast<std::uint32_t>(size_of(k));
    writes.push_back(
        k % 2 == 0 ? Op::WriteWithImm(src.data() + at[k], smr.get(), len, base + at[k], rmr->rkey(),
                                      static_cast<std::uint32_t>(k), k)
                   : Op::Write(src.data() + at[k], smr.get(), len, base + at[k], rmr->rkey(), k));
  }
  ASSERT_TRUE(conn->Post(writes).ok());
  ASSERT_NO_FATAL_FAILURE(wait_all(kOps));
  std::vector<Notification> notes;
  while (notes.size() < kOps / 2) {
    std::array<Notification, 64> got;
    auto r = server->WaitNotifications(got, DeadlineAfter(seconds(10)));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_GT(*r, 0u) << "a WRITE_WITH_IMM did not notify";
    notes.insert(notes.end(), got.begin(), got.begin() + *r);
  }
  ASSERT_EQ(notes.size(), kOps / 2);
  for (std::size_t i = 0; i < notes.size(); ++i) {
    EXPECT_EQ(notes[i].imm, 2 * i);
    EXPECT_EQ(notes[i].length, size_of(2 * i));
  }
  ASSERT_TRUE(remote == src) << "a WRITE payload landed torn or misplaced";
  // The same sizes back as READ responses, in one post.
  std::vector<Op> reads;
  for (std::size_t k = 0; k < kOps; ++k) {
    reads.push_back(Op::Read(back.data() + at[k], bmr.get(), static_cast<std::uint32_t>(size_of(k)),
                             base + at[k], rmr->rkey(), k));
  }
  ASSERT_TRUE(conn->Post(reads).ok());
  ASSERT_NO_FATAL_FAILURE(wait_all(kOps));
  EXPECT_TRUE(back == src) << "a READ response landed torn or misplaced";
}

// A push's train of WRITE_WITH_IMM slots (src/ps/push_writer.cc): a
// window of 16 in flight, refilled 8 at a time in one post (its waits
// sleep: over kSpinMaxPendingBytes are outstanding), a small READ riding
// behind every 8th. The target holds acknowledgements back while it reads
// the next payload (kMaxHeldAcks); every op still completes, in order, every
// notification arrives in order after its data, and the READs see the
// WRITEs before them. Trains run until one had acknowledgements held (the
// new path ran; a target that keeps pace with its initiator slot by slot
// holds none), at most 5.
TEST(TcpDataPath, PipelinedWriteTrainHoldsAcksAndLosesNothing) {
  auto server = MakeEndpoint(1);
  auto client = MakeEndpoint(2);
  constexpr std::size_t kSlot = 64 * 1024, kSlots = 96, kWindow = 16, kBurst = kWindow / 2;
  std::vector<std::uint8_t> remote(kSlots * kSlot, 0), src(kSlots * kSlot);
  std::vector<std::uint8_t> back(kSlots * 64, 0);
  auto rmr = std::move(server->Register(remote.data(), remote.size(), kRemoteAll)).value();
  auto smr = std::move(client->Register(src.data(), src.size(), kAccessNone)).value();
  auto bmr = std::move(client->Register(back.data(), back.size(), kAccessNone)).value();
  auto conn = std::move(client->Connect(server->Listen("127.0.0.1:0").value(), {},
                                        DeadlineAfter(seconds(5))))
                  .value();
  const auto base = rmr->remote().addr;
  std::uint64_t next_done = 0, posted_ops = 0;
  auto complete = [&](std::size_t ops) {
    std::array<Completion, 64> out;
    for (std::size_t got = 0; got < ops;) {
      auto r = conn->Wait({out.data(), std::min<std::size_t>(64, ops - got)},
                          DeadlineAfter(seconds(10)));
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_GT(*r, 0u) << "no completion within 10 s: an acknowledgement was held for good";
      for (std::size_t i = 0; i < *r; ++i) {
        ASSERT_TRUE(out[i].status.ok()) << out[i].status;
        ASSERT_EQ(out[i].context, next_done++) << "completions out of posting order";
      }
      got += *r;
    }
  };
  auto train = [&](std::uint32_t t) {
    std::fill(remote.begin(), remote.end(), 0);
    std::fill(back.begin(), back.end(), 0);
    for (std::size_t i = 0; i < src.size(); ++i) {
      src[i] = static_cast<std::uint8_t>(i * 29 + (i >> 16) + t);
    }
    std::vector<std::size_t> ops_of_slot;
    std::vector<std::size_t> read_of_slot;
    std::size_t in_flight = 0;  // slots
    for (std::size_t k = 0; k < kSlots; k += kBurst) {
      if (in_flight == kWindow) {
        // Complete the oldest half of the window, as PushWriter::MakeRoom does.
        std::size_t ops = 0;
        for (std::size_t j = k - kWindow; j < k - kWindow / 2; ++j) ops += ops_of_slot[j];
        ASSERT_NO_FATAL_FAILURE(complete(ops));
        in_flight -= kWindow / 2;
      }
      std::vector<Op> batch;
      for (std::size_t b = k; b < k + kBurst; ++b) {
        const std::size_t first = batch.size();
        batch.push_back(Op::WriteWithImm(src.data() + b * kSlot, smr.get(), kSlot, base + b * kSlot,
                                         rmr->rkey(), static_cast<std::uint32_t>(t * kSlots + b),
                                         posted_ops++));
        if (b % 8 == 7) {
          // The slot's first 64 bytes, READ back behind it.
          batch.push_back(Op::Read(back.data() + b * 64, bmr.get(), 64, base + b * kSlot,
                                   rmr->rkey(), posted_ops++));
          read_of_slot.push_back(b);
        }
        ops_of_slot.push_back(batch.size() - first);
      }
      ASSERT_TRUE(conn->Post(batch).ok());
      in_flight += kBurst;
    }
    ASSERT_NO_FATAL_FAILURE(complete(posted_ops - next_done));
    std::vector<Notification> notes;
    while (notes.size() < kSlots) {
      std::array<Notification, 64> got;
      auto r = server->WaitNotifications(got, DeadlineAfter(seconds(10)));
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_GT(*r, 0u) << "a WRITE_WITH_IMM did not notify";
      notes.insert(notes.end(), got.begin(), got.begin() + *r);
    }
    ASSERT_EQ(notes.size(), kSlots);
    for (std::size_t i = 0; i < kSlots; ++i) {
      ASSERT_EQ(notes[i].imm, t * kSlots + i) << "notifications out of order";
      ASSERT_EQ(notes[i].length, kSlot);
    }
    ASSERT_TRUE(remote == src) << "a WRITE payload landed torn or misplaced";
    for (std::size_t k : read_of_slot) {
      ASSERT_EQ(std::memcmp(back.data() + k * 64, src.data() + k * kSlot, 64), 0)
          << "the READ behind slot " << k << " did not see it";
    }
  };
  auto held = [&] {
    auto s = TEST_GetTcpStats(*server);
    EXPECT_TRUE(s.ok());
    return s.ok() ? s->acks_held : 0;
  };
  const std::uint64_t before = held();
  for (std::uint32_t t = 0; t < 5 && held() == before; ++t) {
    SCOPED_TRACE("train " + std::to_string(t));
    ASSERT_NO_FATAL_FAILURE(train(t));
  }
  EXPECT_GT(held(), before) << "no acknowledgement was held in 5 trains of 96 slots";
}

TEST(TcpDataPath, ManyPipelinedOpsCompleteInOrderWithTheirData) {
  Pair p;
  ASSERT_TRUE(p.conn);
  // 1000 READs of 8 distinct 64-byte slots, posted in batches of 100, with
  // some polled early so posting and reaping interleave.
  for (std::size_t i = 0; i < p.remote.size(); ++i) {
    p.remote[i] = static_cast<std::byte>(i % 251);
  }
  const std::size_t kOps = 1000;
  std::size_t next_expected = 0;
  std::array<Completion, 64> out;
  auto check = [&](std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(out[i].status.ok()) << out[i].status;
      ASSERT_EQ(out[i].context, next_expected) << "completions out of posting order";
      ++next_expected;
    }
  };
  for (std::size_t posted = 0; posted < kOps;) {
    std::vector<Op> batch;
    for (int j = 0; j < 100; ++j, ++posted) {
      std::size_t slot = posted % 512;
      batch.push_back(Op::Read(p.local.data() + slot * 64, p.lmr.get(), 64,
                               p.rmr->remote().addr + slot * 64, p.rmr->rkey(), posted));
    }
    while (p.conn->outstanding() + batch.size() > p.conn->max_outstanding()) {
      auto n = p.conn->Wait(out, DeadlineAfter(seconds(5)));
      ASSERT_TRUE(n.ok());
      ASSERT_NO_FATAL_FAILURE(check(*n));
    }
    ASSERT_TRUE(p.conn->Post(batch).ok());
    ASSERT_NO_FATAL_FAILURE(check(p.conn->Poll(out)));
  }
  while (p.conn->outstanding() > 0) {
    auto n = p.conn->Wait(out, DeadlineAfter(seconds(5)));
    ASSERT_TRUE(n.ok());
    ASSERT_GT(*n, 0u);
    ASSERT_NO_FATAL_FAILURE(check(*n));
  }
  EXPECT_EQ(next_expected, kOps);
  EXPECT_EQ(std::memcmp(p.local.data(), p.remote.data(), 512 * 64), 0);
}

TEST(TcpDataPath, AcceptedSideCanPostOps) {
  Pair p;
  ASSERT_TRUE(p.accepted);
  std::memcpy(p.local.data(), "reverse!", 8);
  // The client registered `local` with no remote rights: register a remote
  // one on the client for the server to write into.
  std::array<std::uint8_t, 16> client_mem{};
  auto cmr = std::move(p.client->Register(client_mem.data(), 16, kRemoteWrite)).value();
  std::memcpy(p.remote.data(), "from the server", 16);
  ASSERT_TRUE(RunOne(*p.accepted,
                     Op::Write(p.remote.data(), p.rmr.get(), 16, cmr->remote().addr, cmr->rkey()))
                  .ok());
  EXPECT_EQ(std::memcmp(client_mem.data(), "from the server", 16), 0);
}

TEST(TcpDataPath, WriteWithImmNotifiesAfterTheData) {
  Pair p;
  ASSERT_TRUE(p.conn);
  std::memset(p.local.data(), 0x5a, 20000);
  ASSERT_TRUE(
      p.conn
          ->Post(std::array{
              Op::Write(p.local.data(), p.lmr.get(), 10000, p.rmr->remote().addr, p.rmr->rkey()),
              Op::WriteWithImm(p.local.data(), p.lmr.get(), 20000, p.rmr->remote().addr + 10000,
                               p.rmr->rkey(), 0xfeed)})
          .ok());
  Notification n;
  auto got = p.server->WaitNotifications({&n, 1}, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(n.kind, Notification::Kind::kImmediate);
  EXPECT_EQ(n.imm, 0xfeedu);
  EXPECT_EQ(n.length, 20000u);
  EXPECT_EQ(n.peer_id, 2u);
  for (std::size_t i = 0; i < 30000; ++i) ASSERT_EQ(p.remote[i], std::byte{0x5a}) << i;
}

TEST(TcpDataPath, FullNotificationQueueHoldsWritersBackAndLosesNothing) {
  // A target whose consumer does not keep up: at most 8 notifications are
  // queued; further WRITE_WITH_IMMs wait unexecuted (their initiator sees no
  // completion) until the consumer drains the queue. Nothing is lost or
  // reordered.
  EndpointOptions so;
  so.transport = "tcp";
  so.job_token = kToken;
  so.peer_id = 1;
  so.max_queued_notifications = 8;
  auto server = Endpoint::Create(so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = MakeEndpoint(2);
  ASSERT_TRUE(client);
  constexpr std::uint32_t kOps = 100;
  std::vector<std::uint64_t> remote(kOps, 0), local(kOps);
  std::iota(local.begin(), local.end(), 1000);
  auto rmr = (*server)->Register(remote.data(), remote.size() * 8, kRemoteWrite);
  auto lmr = client->Register(local.data(), local.size() * 8, kAccessNone);
  ASSERT_TRUE(rmr.ok() && lmr.ok());
  auto address = (*server)->Listen("127.0.0.1:0");
  ASSERT_TRUE(address.ok()) << address.status();
  auto conn = client->Connect(*address, {}, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(conn.ok()) << conn.status();
  auto accepted = (*server)->Accept(DeadlineAfter(seconds(5)));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  std::vector<Op> ops;
  for (std::uint32_t i = 0; i < kOps; ++i) {
    ops.push_back(Op::WriteWithImm(&local[i], lmr->get(), 8, (*rmr)->remote().addr + i * 8,
                                   (*rmr)->rkey(), i, i));
  }
  ASSERT_TRUE((*conn)->Post(ops).ok());
  // Exactly the first 8 complete while nobody consumes.
  std::vector<Completion> done(kOps);
  std::size_t completed = 0;
  while (completed < 8) {
    auto r = (*conn)->Wait({done.data() + completed, kOps - completed}, DeadlineAfter(seconds(5)));
    ASSERT_TRUE(r.ok() && *r > 0) << "the first 8 WRITE_WITH_IMMs did not complete";
    completed += *r;
  }
  auto more =
      (*conn)->Wait({done.data() + completed, kOps - completed}, DeadlineAfter(milliseconds(300)));
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(completed + *more, 8u) << "ops past the notification cap were executed";
  completed += *more;
  // Drain: every notification arrives once, in order, after its data.
  std::uint32_t next = 0;
  const Deadline deadline = DeadlineAfter(seconds(20));
  while ((next < kOps || completed < kOps) && SteadyClock::now() < deadline) {
    Notification n[16];
    auto got = (*server)->WaitNotifications(n, DeadlineAfter(milliseconds(20)));
    ASSERT_TRUE(got.ok()) << got.status();
    for (std::size_t k = 0; k < *got; ++k) {
      ASSERT_EQ(n[k].kind, Notification::Kind::kImmediate);
      ASSERT_EQ(n[k].imm, next) << "lost or reordered notification";
      ASSERT_EQ(remote[next], 1000u + next);
      ++next;
    }
    completed += (*conn)->Poll({done.data() + completed, kOps - completed});
  }
  EXPECT_EQ(next, kOps);
  ASSERT_EQ(completed, kOps);
  for (std::uint32_t i = 0; i < kOps; ++i) {
    EXPECT_TRUE(done[i].status.ok()) << done[i].status;
    EXPECT_EQ(done[i].context, i);
  }
}

TEST(TcpDataPath, ClosingAConnectionNotifiesThePeer) {
  Pair p;
  ASSERT_TRUE(p.conn);
  p.conn->Close();
  Notification n;
  auto got = p.server->WaitNotifications({&n, 1}, DeadlineAfter(seconds(5)));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(n.kind, Notification::Kind::kDisconnected);
  EXPECT_EQ(n.peer_id, 2u);
  // The server's side of the connection sees it gone too.
  Status s = RunOne(*p.accepted, Op::Read(p.remote.data(), p.rmr.get(), 8, 0, 1));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
}

TEST(TcpDataPath, DeregistrationUnderLoadFailsLaterOpsCleanly) {
  // A client hammers READs (large ones, sent straight from registered
  // memory) while the server deregisters the region: every op either
  // succeeds or fails with PermissionDenied/Cancelled, nothing crashes, and
  // ASan sees no use after free.
  auto server = MakeEndpoint(1);
  auto client = MakeEndpoint(2);
  auto region = std::make_unique<std::vector<std::uint8_t>>(1 << 20, 7);
  auto rmr = std::move(server->Register(region->data(), region->size(), kRemoteRead)).value();
  const RemoteRegion remote = rmr->remote();
  std::vector<std::uint8_t> local(1 << 20);
  auto lmr = std::move(client->Register(local.data(), local.size(), kAccessNone)).value();
  auto conn = std::move(client->Connect(server->Listen("127.0.0.1:0").value(), {},
                                        DeadlineAfter(seconds(5))))
                  .value();
  std::atomic<int> completed_ok{0};
  std::atomic<bool> failed{false};
  std::thread reader([&] {
    std::array<Completion, 16> out;
    for (int round = 0; round < 200 && !failed; ++round) {
      std::vector<Op> ops;
      for (int j = 0; j < 4; ++j) {
        ops.push_back(
            Op::Read(local.data(), lmr.get(), 256 * 1024, remote.addr + j * 4096, remote.rkey));
      }
      if (!conn->Post(ops).ok()) break;
      while (conn->outstanding() > 0) {
        auto n = conn->Wait(out, DeadlineAfter(seconds(5)));
        ASSERT_TRUE(n.ok());
        ASSERT_GT(*n, 0u);
        for (std::size_t i = 0; i < *n; ++i) {
          if (out[i].status.ok()) {
            ++completed_ok;
          } else {
            EXPECT_TRUE(out[i].status.code() == StatusCode::kPermissionDenied ||
                        out[i].status.code() == StatusCode::kCancelled ||
                        out[i].status.code() == StatusCode::kUnavailable)
                << out[i].status;
            failed = true;
          }
        }
      }
    }
  });
  while (completed_ok.load() < 8 && !failed) std::this_thread::yield();
  rmr.reset();     // Deregister...
  region.reset();  // ...and free the memory at once: the server must not touch it.
  reader.join();
  EXPECT_TRUE(failed) << "ops kept succeeding after deregistration";
}

TEST(TcpDataPath, DeregistrationMidWriteStopsTouchingTheRegion) {
  // A raw peer sends a WRITE header and part of its payload; the region is
  // deregistered; the rest of the payload arrives. Whenever the server got to
  // it, the op must fail with PermissionDenied and nothing after the first
  // part may land in the (deregistered) memory.
  auto server = MakeEndpoint(1);
  std::vector<std::uint8_t> region(1 << 20, 0);
  auto rmr = std::move(server->Register(region.data(), region.size(), kRemoteWrite)).value();
  auto address = server->Listen("127.0.0.1:0").value();
  Fd raw = testing::RawConnect(address);
  ASSERT_TRUE(raw.valid());
  ASSERT_EQ(testing::RawHello(raw.get(), HelloRole::kOps, 0).status, 0);
  RequestWire req{};
  req.magic = kRequestMagic;
  req.opcode = static_cast<std::uint8_t>(WireOp::kWrite);
  req.remote_addr.set(rmr->remote().addr);
  req.rkey.set(rmr->rkey());
  req.length.set(static_cast<std::uint32_t>(region.size()));
  std::vector<std::uint8_t> payload(region.size(), 0xab);
  const std::size_t first = 1000;
  ASSERT_TRUE(testing::SendBytes(raw.get(), &req, sizeof(req)));
  ASSERT_TRUE(testing::SendBytes(raw.get(), payload.data(), first));
  rmr.reset();
  ASSERT_TRUE(testing::SendBytes(raw.get(), payload.data() + first, payload.size() - first));
  ResponseWire resp;
  ASSERT_EQ(::recv(raw.get(), &resp, sizeof(resp), MSG_WAITALL),
            static_cast<ssize_t>(sizeof(resp)));
  EXPECT_EQ(resp.magic, kResponseMagic);
  EXPECT_EQ(resp.status, static_cast<std::uint8_t>(StatusCode::kPermissionDenied));
  for (std::size_t i = first; i < region.size(); ++i) {
    ASSERT_EQ(region[i], 0) << "written after deregistration at offset " << i;
  }
}

TEST(TcpDataPath, PeerThatStopsReadingIsClosedOthersUnaffected) {
  // A raw peer posts READs and never reads the answers: its socket backs up,
  // the server stops serving it and closes it after op_timeout, while a
  // good connection keeps working.
  Pair p(milliseconds(300));
  ASSERT_TRUE(p.conn);
  Fd raw = testing::RawConnect(p.address);
  ASSERT_TRUE(raw.valid());
  int small = 4096;
  ::setsockopt(raw.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_EQ(testing::RawHello(raw.get(), HelloRole::kOps, 0).status, 0);
  RequestWire req{};
  req.magic = kRequestMagic;
  req.opcode = static_cast<std::uint8_t>(WireOp::kRead);
  req.remote_addr.set(p.rmr->remote().addr);
  req.rkey.set(p.rmr->rkey());
  req.length.set(static_cast<std::uint32_t>(p.remote.size()));
  std::vector<RequestWire> many(2000, req);  // 128 MiB of answers asked for.
  ASSERT_TRUE(testing::SendBytes(raw.get(), many.data(), many.size() * sizeof(req)));
  std::memset(p.local.data(), 0x11, 64);
  ASSERT_TRUE(RunOne(*p.conn, Op::Write(p.local.data(), p.lmr.get(), 64, p.rmr->remote().addr,
                                        p.rmr->rkey()))
                  .ok());
  EXPECT_EQ(p.remote[63], std::byte{0x11});
  // Without reading, wait for the reset/EOF: the socket must be closed.
  const auto deadline = DeadlineAfter(seconds(10));
  bool closed = false;
  while (!closed && SteadyClock::now() < deadline) {
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(raw.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    char c;
    ssize_t r = ::recv(raw.get(), &c, 0, MSG_DONTWAIT | MSG_PEEK);
    closed = err != 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    if (!closed) {
      pollfd pf{raw.get(), POLLRDHUP, 0};
      closed = ::poll(&pf, 1, 50) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR));
    }
  }
  EXPECT_TRUE(closed) << "a peer that never reads kept its connection";
  ASSERT_TRUE(RunOne(*p.conn, Op::Read(p.local.data() + 64, p.lmr.get(), 64, p.rmr->remote().addr,
                                       p.rmr->rkey()))
                  .ok());
  EXPECT_EQ(p.local[64 + 63], std::byte{0x11});
}

// --- Peers that vanish or stall --------------------------------------------

// A raw acceptor: completes the two-socket handshake by hand, then lets the
// test read requests and answer (or not) as it likes.
struct RawServer {
  RawServer() {
    listener = Fd(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    EXPECT_EQ(::listen(listener.get(), 8), 0);
    address = LocalAddress(listener.get());
  }
  // Runs in a thread while the client connects.
  void Handshake() {
    for (int i = 0; i < 2; ++i) {
      Fd s(::accept(listener.get(), nullptr, nullptr));
      ASSERT_TRUE(s.valid());
      ASSERT_TRUE(testing::RawAccept(s.get(), 9, 1234));
      (i == 0 ? ops : reverse) = std::move(s);
    }
  }
  static bool Recv(int fd, void* p, std::size_t n) {
    auto* b = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = ::recv(fd, b, n, 0);
      if (r <= 0) return false;
      b += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  Fd listener, ops, reverse;
  std::string address;
};

std::unique_ptr<Connection> ConnectRaw(Endpoint& client, RawServer& raw) {
  std::thread t([&] { raw.Handshake(); });
  auto c = client.Connect(raw.address, {}, DeadlineAfter(seconds(5)));
  t.join();
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST(TcpPeerFailure, PeerVanishingMidOpCompletesOpsWithUnavailable) {
  auto client = MakeEndpoint(2);
  std::vector<std::uint8_t> local(4096);
  auto lmr = std::move(client->Register(local.data(), local.size(), kAccessNone)).value();
  RawServer raw;
  auto conn = ConnectRaw(*client, raw);
  ASSERT_TRUE(conn);
  std::vector<Op> ops;
  for (int i = 0; i < 3; ++i) ops.push_back(Op::Read(local.data(), lmr.get(), 1000, 64, 5, i));
  ASSERT_TRUE(conn->Post(ops).ok());
  // The peer reads the requests, starts answering the first, and dies.
  RequestWire req[3];
  ASSERT_TRUE(RawServer::Recv(raw.ops.get(), req, sizeof(req)));
  EXPECT_EQ(req[0].magic, kRequestMagic);
  EXPECT_EQ(req[0].length.get(), 1000u);
  ResponseWire r{};
  r.magic = kResponseMagic;
  r.opcode = static_cast<std::uint8_t>(WireOp::kRead);
  r.length.set(1000);
  ASSERT_TRUE(testing::SendBytes(raw.ops.get(), &r, sizeof(r)));
  ASSERT_TRUE(testing::SendBytes(raw.ops.get(), local.data(), 300));  // Truncated.
  raw.ops.Reset();
  raw.reverse.Reset();
  std::array<Completion, 4> out;
  std::size_t got = 0;
  while (got < 3) {
    auto n = conn->Wait(std::span(out).subspan(got), DeadlineAfter(seconds(5)));
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_GT(*n, 0u) << "ops hung after the peer vanished";
    got += *n;
  }
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].context, i);
    EXPECT_EQ(out[i].status.code(), StatusCode::kUnavailable) << out[i].status;
  }
  EXPECT_EQ(conn->health().code(), StatusCode::kUnavailable);
  EXPECT_EQ(conn->Post(ops).code(), StatusCode::kUnavailable);
}

TEST(TcpPeerFailure, UnansweredOpTimesOutAndFlushesTheRest) {
  auto client = MakeEndpoint(2, milliseconds(200));
  std::vector<std::uint8_t> local(64);
  auto lmr = std::move(client->Register(local.data(), local.size(), kAccessNone)).value();
  RawServer raw;
  auto conn = ConnectRaw(*client, raw);
  ASSERT_TRUE(conn);
  std::vector<Op> ops = {Op::Read(local.data(), lmr.get(), 8, 0, 5, 1),
                         Op::Read(local.data(), lmr.get(), 8, 0, 5, 2)};
  ASSERT_TRUE(conn->Post(ops).ok());
  std::array<Completion, 2> out;
  std::size_t got = 0;
  while (got < 2) {
    auto n = conn->Wait(std::span(out).subspan(got), DeadlineAfter(seconds(5)));
    ASSERT_TRUE(n.ok());
    ASSERT_GT(*n, 0u);
    got += *n;
  }
  EXPECT_EQ(out[0].status.code(), StatusCode::kTimedOut) << out[0].status;
  EXPECT_EQ(out[1].status.code(), StatusCode::kCancelled) << out[1].status;
}

TEST(TcpPeerFailure, ServerEndpointDestroyedFailsClientOps) {
  Pair p;
  ASSERT_TRUE(p.conn);
  p.accepted.reset();
  p.rmr.reset();
  p.server.reset();
  Status s = RunOne(*p.conn, Op::Read(p.local.data(), p.lmr.get(), 8, 0, 1));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace rdmaps::transport::tcp

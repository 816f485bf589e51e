// The transport conformance suite (see conformance.h), part one: the ops --
// registration, READ/WRITE and their scattered and gathered forms,
// permissions and batching (ordering, notifications and atomics are in
// conformance_ordering.cc). Every test is
// written against transport/transport.h only and runs on every backend.
#include "tests/transport/conformance.h"

#include <gmock/gmock.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <latch>
#include <numeric>
#include <set>
#include <thread>
#include <utility>

namespace rdmaps::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

using conformance::Fill;
using conformance::HasPattern;
using conformance::kLongWait;
using conformance::PatternByte;

}  // namespace

void TransportConformance::SetUp() {
  if (backend().skip_reason) {
    std::string why = backend().skip_reason();
    if (!why.empty()) GTEST_SKIP() << backend().name << ": " << why;
  }
}

std::unique_ptr<Endpoint> TransportConformance::NewEndpoint(
    std::uint32_t peer_id, const std::function<void(EndpointOptions&)>& tweak) {
  EndpointOptions o = backend().options;
  o.peer_id = peer_id;
  o.job_token = kToken;
  if (tweak) tweak(o);
  auto ep = Endpoint::Create(o);
  if (!ep.ok()) {
    ADD_FAILURE() << "Endpoint::Create(" << o.transport << "): " << ep.status();
    return nullptr;
  }
  return std::move(ep).value();
}

Status TransportConformance::NewEndpointStatus(std::uint32_t peer_id,
                                               const std::function<void(EndpointOptions&)>& tweak) {
  EndpointOptions o = backend().options;
  o.peer_id = peer_id;
  o.job_token = kToken;
  if (tweak) tweak(o);
  return Endpoint::Create(o).status();
}

std::string TransportConformance::ListenOn(Endpoint& endpoint) {
  auto addr = endpoint.Listen(backend().listen_address);
  if (!addr.ok()) {
    ADD_FAILURE() << "Listen(" << backend().listen_address << "): " << addr.status();
    return "";
  }
  return *addr;
}

std::unique_ptr<Connection> TransportConformance::ConnectTo(Endpoint& client,
                                                            const std::string& address,
                                                            const ConnectOptions& options) {
  auto c = client.Connect(address, options, DeadlineAfter(kLongWait));
  if (!c.ok()) {
    ADD_FAILURE() << "Connect(" << address << "): " << c.status();
    return nullptr;
  }
  return std::move(c).value();
}

std::unique_ptr<Connection> TransportConformance::AcceptOn(Endpoint& server) {
  auto c = server.Accept(DeadlineAfter(kLongWait));
  if (!c.ok()) {
    ADD_FAILURE() << "Accept: " << c.status();
    return nullptr;
  }
  return std::move(c).value();
}

std::unique_ptr<MemoryRegion> TransportConformance::RegisterOn(Endpoint& endpoint, void* addr,
                                                               std::size_t length,
                                                               std::uint32_t access) {
  auto mr = endpoint.Register(addr, length, access);
  if (!mr.ok()) {
    ADD_FAILURE() << "Register(" << length << " bytes): " << mr.status();
    return nullptr;
  }
  return std::move(mr).value();
}

std::vector<Completion> TransportConformance::WaitFor(Connection& conn, std::size_t n) {
  std::vector<Completion> got;
  const Deadline deadline = DeadlineAfter(kLongWait);
  std::array<Completion, 64> buf;
  while (got.size() < n) {
    auto k = conn.Wait(std::span(buf.data(), std::min(buf.size(), n - got.size())), deadline);
    if (!k.ok()) {
      ADD_FAILURE() << "Wait after " << got.size() << " of " << n << ": " << k.status();
      break;
    }
    if (*k == 0) {
      ADD_FAILURE() << "Wait: deadline passed after " << got.size() << " of " << n
                    << " completions";
      break;
    }
    for (std::size_t i = 0; i < *k; ++i) got.push_back(std::move(buf[i]));
  }
  return got;
}

Status TransportConformance::RunOne(Connection& conn, const Op& op) {
  Status posted = conn.Post(std::span(&op, 1));
  if (!posted.ok()) return posted.WithContext("Post");
  std::vector<Completion> c = WaitFor(conn, 1);
  if (c.size() != 1) return InternalError("no completion");
  if (c[0].context != op.context) return InternalError("completion has the wrong context");
  return c[0].status;
}

std::vector<Completion> TransportConformance::RunBatch(Connection& conn, std::span<const Op> ops) {
  Status posted = conn.Post(ops);
  if (!posted.ok()) {
    ADD_FAILURE() << "Post of " << ops.size() << " ops: " << posted;
    return {};
  }
  return WaitFor(conn, ops.size());
}

void TransportConformance::Build(ConformanceWorld& w, std::size_t bytes, std::uint32_t access,
                                 const std::function<void(EndpointOptions&)>& client_tweak) {
  w.server = NewEndpoint(kServerId);
  w.client = NewEndpoint(kClientId, client_tweak);
  ASSERT_TRUE(w.server && w.client);
  w.remote_mem = ZeroedWords((bytes + 7) / 8);
  w.local_mem = ZeroedWords((bytes + 7) / 8);
  w.rmr = RegisterOn(*w.server, w.remote_mem.data(), bytes, access);
  w.lmr = RegisterOn(*w.client, w.local_mem.data(), bytes, kRemoteAll);
  ASSERT_TRUE(w.rmr && w.lmr);
  w.address = ListenOn(*w.server);
  ASSERT_FALSE(w.address.empty());
  w.conn = ConnectTo(*w.client, w.address);
  ASSERT_TRUE(w.conn);
  w.accepted = AcceptOn(*w.server);
  ASSERT_TRUE(w.accepted);
}

void TransportConformance::ExpectAccessError(const Status& s, StatusCode exact) {
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(IsRemoteAccessError(s)) << s;
  if (backend().exact_access_errors) {
    EXPECT_EQ(s.code(), exact) << s;
  }
  EXPECT_FALSE(s.message().empty());
}

void TransportConformance::ExpectDisconnected(Endpoint& ep, std::uint32_t peer_id) {
  const Deadline deadline = DeadlineAfter(kLongWait);
  std::array<Notification, 16> buf;
  while (SteadyClock::now() < deadline) {
    auto n = ep.WaitNotifications(buf, deadline);
    ASSERT_TRUE(n.ok()) << n.status();
    for (std::size_t i = 0; i < *n; ++i) {
      if (buf[i].kind == Notification::Kind::kDisconnected) {
        EXPECT_EQ(buf[i].peer_id, peer_id);
        return;
      }
    }
  }
  ADD_FAILURE() << "no kDisconnected notification before the deadline";
}

namespace {

// --- Registration and the basic ops. -------------------------------------

TEST_P(TransportConformance, WriteThenReadRoundTrips) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::span<std::byte> l(w.local(), 4096);
  Fill(l, 1);
  ASSERT_OK(RunOne(*w.conn, Op::Write(w.local(), w.lmr.get(), 4096, w.raddr(100), w.rkey(), 1)));
  EXPECT_TRUE(HasPattern({w.remote() + 100, 4096}, 1));
  Fill({w.remote() + 8192, 4096}, 2);
  ASSERT_OK(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 4096, w.raddr(8192), w.rkey(), 2)));
  EXPECT_TRUE(HasPattern(l, 2));
}

// One READ scattered over every segment the connection allows, across two
// regions, in an order unlike memory's; bytes between segments stay as they
// were, and the segment array may be reused once Post returns.
TEST_P(TransportConformance, ReadScatterFillsSegmentsInOrder) {
  constexpr std::size_t kBig = 1 << 20;  // one segment past any receive buffer
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w, 2 * kBig));
  ZeroedWords other_mem(kBig / 8 * 2);
  auto other_mr = RegisterOn(*w.client, other_mem.data(), other_mem.size() * 8, kAccessNone);
  ASSERT_TRUE(other_mr);
  auto* other = reinterpret_cast<std::byte*>(other_mem.data());
  Fill({w.remote(), w.bytes()}, 5);
  const std::size_t n = std::min<std::size_t>(w.conn->max_segments(), 40);
  ASSERT_GE(n, 1u);
  // Segment k: length 1 + 13 * k (the middle one kBig, one of zero bytes),
  // alternately at the back of `other` and the front of local, 3-byte gaps.
  std::vector<Segment> segs;
  std::size_t local_at = 0, other_at = other_mem.size() * 8, total = 0;
  for (std::size_t k = 0; k < n; ++k) {
    std::uint32_t len = static_cast<std::uint32_t>(1 + 13 * k);
    if (k == n / 2) len = kBig;
    if (k == 1) len = 0;
    if (k % 2 == 0) {
      other_at -= len + 3;
      segs.push_back({other + other_at, other_mr.get(), len});
    } else {
      segs.push_back({w.local() + local_at, w.lmr.get(), len});
      local_at += len + 3;
    }
    total += len;
  }
  ASSERT_LE(total + 100, w.bytes());
  std::memset(w.local(), 0xEE, kBig + kBig / 2);
  std::memset(other, 0xEE, other_mem.size() * 8);
  const Op op = Op::ReadScatter(segs, w.raddr(100), w.rkey(), 7);
  EXPECT_EQ(op.length, total);
  ASSERT_OK(w.conn->Post(std::span(&op, 1)));
  std::vector<Segment> want = segs;
  std::fill(segs.begin(), segs.end(), Segment{});  // the backend took its copy
  std::vector<Completion> c = WaitFor(*w.conn, 1);
  ASSERT_EQ(c.size(), 1u);
  ASSERT_OK(c[0].status);
  EXPECT_EQ(c[0].context, 7u);
  std::size_t remote_at = 100;
  for (std::size_t k = 0; k < n; ++k) {
    SCOPED_TRACE("segment " + std::to_string(k));
    const Segment& seg = want[k];
    EXPECT_EQ(std::memcmp(seg.addr, w.remote() + remote_at, seg.length), 0);
    remote_at += seg.length;
    // The gap behind each segment is untouched.
    const auto* after = static_cast<const std::byte*>(seg.addr) + seg.length;
    for (int g = 0; g < 3; ++g) EXPECT_EQ(after[g], std::byte{0xEE});
  }
}

// As many segments as allowed, each a row's worth, every other one skipped
// over in local memory (the shape of a pull into a caller's buffer).
TEST_P(TransportConformance, ReadScatterManySegments) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w, 4 << 20));
  Fill({w.remote(), w.bytes()}, 9);
  const std::size_t n = w.conn->max_segments();
  constexpr std::uint32_t kLen = 1000;
  ASSERT_LE(n * kLen * 2, w.bytes());
  std::vector<Segment> segs;
  for (std::size_t k = 0; k < n; ++k) segs.push_back({w.local() + 2 * k * kLen, w.lmr.get(), kLen});
  std::memset(w.local(), 0xEE, w.bytes());
  ASSERT_OK(RunOne(*w.conn, Op::ReadScatter(segs, w.raddr(8), w.rkey(), 3)));
  for (std::size_t k = 0; k < n; ++k) {
    ASSERT_EQ(std::memcmp(w.local() + 2 * k * kLen, w.remote() + 8 + k * kLen, kLen), 0) << k;
    ASSERT_EQ(w.local()[(2 * k + 1) * kLen], std::byte{0xEE}) << k;
  }
}

// A WRITE and a WRITE_WITH_IMM gathered from segments of two regions land
// contiguously; the immediate is seen only with all of its data visible.
TEST_P(TransportConformance, WriteGatherSendsSegmentsInOrder) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  ZeroedWords other_mem(4096 / 8);
  auto other_mr = RegisterOn(*w.client, other_mem.data(), 4096, kAccessNone);
  ASSERT_TRUE(other_mr);
  auto* other = reinterpret_cast<std::byte*>(other_mem.data());
  Fill({w.local(), 8192}, 3);
  Fill({other, 4096}, 4);
  const std::size_t n = std::min<std::size_t>(w.conn->max_segments(), 9);
  std::vector<Segment> segs;
  std::size_t total = 0;
  for (std::size_t k = 0; k < n; ++k) {  // odd pieces from `other`, even from local, backwards
    const auto len = static_cast<std::uint32_t>(40 + 8 * k);
    std::byte* at = k % 2 ? other + 4096 - (k + 1) * 200 : w.local() + 8192 - (k + 1) * 300;
    segs.push_back({at, k % 2 ? other_mr.get() : w.lmr.get(), len});
    total += len;
  }
  ASSERT_OK(RunOne(*w.conn, Op::WriteGather(segs, w.raddr(64), w.rkey(), 1)));
  std::size_t at = 64;
  for (const Segment& seg : segs) {
    EXPECT_EQ(std::memcmp(w.remote() + at, seg.addr, seg.length), 0) << "at " << at;
    at += seg.length;
  }
  EXPECT_EQ(w.remote()[63], std::byte{0});
  EXPECT_EQ(w.remote()[64 + total], std::byte{0});
  // The same with an immediate, to a fresh place.
  const Op wwi = Op::WriteWithImmGather(segs, w.raddr(16384), w.rkey(), 77, 2);
  ASSERT_OK(w.conn->Post(std::span(&wwi, 1)));
  std::vector<Segment> want = segs;
  std::fill(segs.begin(), segs.end(), Segment{});  // the backend took what it needs
  std::array<Notification, 4> buf;
  auto got = w.server->WaitNotifications(buf, DeadlineAfter(kLongWait));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, 1u);
  EXPECT_EQ(buf[0].imm, 77u);
  EXPECT_EQ(buf[0].length, total);
  at = 16384;
  for (const Segment& seg : want) {
    EXPECT_EQ(std::memcmp(w.remote() + at, seg.addr, seg.length), 0) << "at " << at;
    at += seg.length;
  }
  std::vector<Completion> c = WaitFor(*w.conn, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_OK(c[0].status);
}

TEST_P(TransportConformance, MalformedScatterIsInvalidArgument) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  const std::size_t n = w.conn->max_segments();
  std::vector<Segment> too_many(n + 1, Segment{w.local(), w.lmr.get(), 8});
  std::uint64_t unregistered = 0;
  const Segment outside[] = {{w.local(), w.lmr.get(), 8},
                             {w.local() + w.bytes() - 4, w.lmr.get(), 8}};
  const Segment foreign[] = {{&unregistered, w.lmr.get(), 8}};
  const Segment no_mr[] = {{w.local(), nullptr, 8}};
  Op atomic = Op::ReadScatter(std::span(outside, 1), w.raddr(), w.rkey());
  atomic.type = OpType::kFetchAdd;
  struct Case {
    const char* what;
    Op bad;
  };
  const Case cases[] = {
      {"more segments than max_segments", Op::ReadScatter(too_many, w.raddr(), w.rkey())},
      {"segment outside its mr", Op::ReadScatter(outside, w.raddr(), w.rkey())},
      {"segment not in its mr", Op::ReadScatter(foreign, w.raddr(), w.rkey())},
      {"segment without an mr", Op::ReadScatter(no_mr, w.raddr(), w.rkey())},
      {"gathered FETCH_ADD", atomic},
      {"gathered WRITE with too many segments", Op::WriteGather(too_many, w.raddr(), w.rkey())},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Status s = w.conn->Post(std::span(&c.bad, 1));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(w.conn->outstanding(), 0u);
    EXPECT_TRUE(w.conn->health().ok());
  }
}

TEST_P(TransportConformance, RegionDescribesItsMemory) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  EXPECT_EQ(w.rmr->data(), w.remote());
  EXPECT_EQ(w.rmr->size(), w.bytes());
  EXPECT_EQ(w.rmr->access(), static_cast<std::uint32_t>(kRemoteAll));
  EXPECT_EQ(w.rmr->remote().length, w.bytes());
  EXPECT_EQ(w.rmr->remote().rkey, w.rmr->rkey());
  if (backend().options.transport != "auto") {
    EXPECT_EQ(w.server->kind(), backend().options.transport);
  }
  auto other = RegisterOn(*w.server, w.remote(), 64, kRemoteRead);
  ASSERT_TRUE(other);
  EXPECT_NE(other->rkey(), w.rmr->rkey()) << "two regions must have distinct rkeys";
}

TEST_P(TransportConformance, ZeroLengthRegionAndOps) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::uint64_t word = 0;
  auto empty = RegisterOn(*w.server, &word, 0, kRemoteAll);
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->size(), 0u);
  w.remote()[0] = std::byte{0x11};
  w.local()[0] = std::byte{0x22};
  ASSERT_OK(RunOne(*w.conn, Op::Write(w.local(), w.lmr.get(), 0, w.raddr(), w.rkey(), 1)));
  ASSERT_OK(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 0, w.raddr(), w.rkey(), 2)));
  EXPECT_EQ(w.remote()[0], std::byte{0x11});
  EXPECT_EQ(w.local()[0], std::byte{0x22});
  EXPECT_TRUE(w.conn->health().ok());
}

TEST_P(TransportConformance, LargeTransfer64MiB) {
  constexpr std::size_t kBig = std::size_t{64} << 20;
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w, kBig));
  ZeroedWords back_mem(kBig / 8);
  auto back_mr = RegisterOn(*w.client, back_mem.data(), kBig, kAccessNone);
  ASSERT_TRUE(back_mr);
  auto* back = reinterpret_cast<std::byte*>(back_mem.data());
  // Per 4 KiB page a distinct fill byte and the page's index: catches
  // misplaced, dropped or duplicated pages, cheaply even under sanitizers.
  for (std::size_t page = 0; page < kBig / 4096; ++page) {
    std::memset(w.local() + page * 4096, static_cast<int>(page * 37 + 1) & 0xff, 4096);
    std::memcpy(w.local() + page * 4096, &page, sizeof(page));
  }
  ASSERT_OK(RunOne(*w.conn, Op::Write(w.local(), w.lmr.get(), kBig, w.raddr(), w.rkey(), 1)));
  EXPECT_TRUE(std::memcmp(w.remote(), w.local(), kBig) == 0);
  ASSERT_OK(RunOne(*w.conn, Op::Read(back, back_mr.get(), kBig, w.raddr(), w.rkey(), 2)));
  EXPECT_TRUE(std::memcmp(back, w.local(), kBig) == 0);
}

// --- Permissions and remote access errors. -------------------------------

TEST_P(TransportConformance, EachAccessRightIsEnforced) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  struct Case {
    std::uint32_t access;
    bool read_ok, write_ok, atomic_ok;
  };
  const Case cases[] = {
      {kAccessNone, false, false, false},
      {kRemoteRead, true, false, false},
      {kRemoteWrite, false, true, false},
      {kRemoteAtomic, false, false, true},
      {kRemoteRead | kRemoteWrite, true, true, false},
      {kRemoteAll, true, true, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("access mask " + std::to_string(c.access));
    std::vector<std::uint64_t> mem(8, 5);
    auto mr = RegisterOn(*w.server, mem.data(), 64, c.access);
    ASSERT_TRUE(mr);
    const std::uint64_t a = mr->remote().addr;
    auto* result = reinterpret_cast<std::uint64_t*>(w.local());
    const Op ops[] = {
        Op::Read(w.local(), w.lmr.get(), 16, a, mr->rkey(), 1),
        Op::Write(w.local(), w.lmr.get(), 16, a + 16, mr->rkey(), 2),
        Op::WriteWithImm(w.local(), w.lmr.get(), 8, a + 32, mr->rkey(), 9, 3),
        Op::FetchAdd(result, w.lmr.get(), a + 48, mr->rkey(), 1, 4),
        Op::CompareSwap(result, w.lmr.get(), a + 56, mr->rkey(), 5, 6, 5),
    };
    const bool expect_ok[] = {c.read_ok, c.write_ok, c.write_ok, c.atomic_ok, c.atomic_ok};
    for (std::size_t i = 0; i < std::size(ops); ++i) {
      SCOPED_TRACE(std::string(OpTypeName(ops[i].type)));
      // A failed op breaks its connection, so each op gets a fresh one.
      auto conn = ConnectTo(*w.client, w.address);
      ASSERT_TRUE(conn);
      Status s = RunOne(*conn, ops[i]);
      if (expect_ok[i]) {
        EXPECT_TRUE(s.ok()) << s;
      } else {
        ExpectAccessError(s, StatusCode::kPermissionDenied);
        EXPECT_FALSE(conn->health().ok()) << "a failed op must put the connection in error";
      }
    }
    if (!c.write_ok) {
      EXPECT_EQ(mem[2], 5u) << "a refused WRITE must not change memory";
    }
    if (!c.atomic_ok) {
      EXPECT_EQ(mem[6], 5u) << "a refused atomic must not change memory";
    }
  }
}

TEST_P(TransportConformance, UnknownRkeyIsPermissionDenied) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  const std::uint32_t bogus = w.rkey() ^ 0x5a5a5a5au;
  ExpectAccessError(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 8, w.raddr(), bogus, 1)),
                    StatusCode::kPermissionDenied);
}

TEST_P(TransportConformance, OutOfBoundsIsOutOfRange) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  struct Case {
    const char* what;
    Op op;
  };
  auto* result = reinterpret_cast<std::uint64_t*>(w.local());
  const std::size_t n = w.bytes();
  const Case cases[] = {
      {"READ past the end", Op::Read(w.local(), w.lmr.get(), 16, w.raddr(n - 8), w.rkey())},
      {"READ before the start", Op::Read(w.local(), w.lmr.get(), 8, w.raddr() - 8, w.rkey())},
      {"WRITE past the end", Op::Write(w.local(), w.lmr.get(), 9, w.raddr(n - 8), w.rkey())},
      {"WRITE starting at the end", Op::Write(w.local(), w.lmr.get(), 1, w.raddr(n), w.rkey())},
      {"FETCH_ADD past the end", Op::FetchAdd(result, w.lmr.get(), w.raddr(n), w.rkey(), 1)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto conn = ConnectTo(*w.client, w.address);
    ASSERT_TRUE(conn);
    ExpectAccessError(RunOne(*conn, c.op), StatusCode::kOutOfRange);
  }
  // The last byte and the last word are inside.
  auto conn = ConnectTo(*w.client, w.address);
  ASSERT_TRUE(conn);
  EXPECT_OK(RunOne(*conn, Op::Read(w.local(), w.lmr.get(), 8, w.raddr(n - 8), w.rkey())));
  EXPECT_OK(RunOne(*conn, Op::FetchAdd(result, w.lmr.get(), w.raddr(n - 8), w.rkey(), 1)));
}

TEST_P(TransportConformance, DeregisteredRegionIsPermissionDenied) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::vector<std::uint64_t> mem(16, 7);
  auto mr = RegisterOn(*w.server, mem.data(), 128, kRemoteAll);
  ASSERT_TRUE(mr);
  const RemoteRegion r = mr->remote();
  ASSERT_OK(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 128, r.addr, r.rkey, 1)));
  mr.reset();  // Deregisters.
  ExpectAccessError(RunOne(*w.conn, Op::Read(w.local(), w.lmr.get(), 128, r.addr, r.rkey, 2)),
                    StatusCode::kPermissionDenied);
  auto conn = ConnectTo(*w.client, w.address);
  ASSERT_TRUE(conn);
  ExpectAccessError(RunOne(*conn, Op::Write(w.local(), w.lmr.get(), 8, r.addr, r.rkey, 3)),
                    StatusCode::kPermissionDenied);
  EXPECT_EQ(mem[0], 7u);
}

TEST_P(TransportConformance, FailedOpPutsConnectionInErrorState) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  const Op ops[] = {
      Op::Read(w.local(), w.lmr.get(), 8, w.raddr(), w.rkey(), 1),
      Op::Read(w.local(), w.lmr.get(), 8, w.raddr(w.bytes()), w.rkey(), 2),  // Out of range.
      Op::Read(w.local(), w.lmr.get(), 8, w.raddr(), w.rkey(), 3),
      Op::Write(w.local(), w.lmr.get(), 8, w.raddr(), w.rkey(), 4),
  };
  std::vector<Completion> c = RunBatch(*w.conn, ops);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_TRUE(c[0].status.ok()) << c[0].status;
  ExpectAccessError(c[1].status, StatusCode::kOutOfRange);
  for (int i = 2; i < 4; ++i) {
    EXPECT_THAT(c[i].status.code(),
                ::testing::AnyOf(StatusCode::kCancelled, StatusCode::kUnavailable))
        << c[i].status;
  }
  EXPECT_FALSE(w.conn->health().ok());
  Status again = w.conn->Post(std::span(ops, 1));
  EXPECT_EQ(again.code(), StatusCode::kUnavailable) << again;
  EXPECT_EQ(w.conn->outstanding(), 0u);
  // Another connection to the same peer is unaffected.
  auto conn2 = ConnectTo(*w.client, w.address);
  ASSERT_TRUE(conn2);
  EXPECT_OK(RunOne(*conn2, ops[0]));
}

// --- Post validation and batching. ---------------------------------------

TEST_P(TransportConformance, MalformedOpFailsWholeBatchAndPostsNothing) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::memset(w.local(), 0xAB, 64);
  auto* result = reinterpret_cast<std::uint64_t*>(w.local());
  const Op good = Op::Write(w.local(), w.lmr.get(), 64, w.raddr(), w.rkey(), 1);
  struct Case {
    const char* what;
    Op bad;
  };
  Op zero_atomic = Op::FetchAdd(result, w.lmr.get(), w.raddr(), w.rkey(), 1);
  zero_atomic.length = 0;
  std::uint64_t outside = 0;
  const Case cases[] = {
      {"misaligned FETCH_ADD", Op::FetchAdd(result, w.lmr.get(), w.raddr(4), w.rkey(), 1)},
      {"misaligned COMPARE_SWAP",
       Op::CompareSwap(result, w.lmr.get(), w.raddr(12), w.rkey(), 0, 1)},
      {"zero-size atomic", zero_atomic},
      {"local buffer outside local_mr",
       Op::Read(w.local() + w.bytes() - 4, w.lmr.get(), 8, w.raddr(), w.rkey())},
      {"local buffer not registered", Op::Read(&outside, w.lmr.get(), 8, w.raddr(), w.rkey())},
      {"no local_mr", Op::Read(w.local(), nullptr, 8, w.raddr(), w.rkey())},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Op batch[] = {good, c.bad};
    Status s = w.conn->Post(batch);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_FALSE(s.message().empty());
    EXPECT_EQ(w.conn->outstanding(), 0u);
    EXPECT_TRUE(w.conn->health().ok()) << "validation must not break the connection";
  }
  // Nothing was posted: the good WRITE never landed.
  std::array<Completion, 4> none;
  EXPECT_EQ(w.conn->Poll(none), 0u);
  EXPECT_EQ(w.remote()[0], std::byte{0});
  EXPECT_OK(RunOne(*w.conn, good));
  EXPECT_EQ(w.remote()[0], std::byte{0xAB});
}

TEST_P(TransportConformance, ManyOpsInOneBatchCompleteInPostingOrder) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  // Mixed types and sizes, as many as the connection allows up to 200.
  const std::size_t kOps = std::min<std::size_t>(200, w.conn->max_outstanding());
  constexpr std::size_t kSlot = 256;
  for (std::size_t i = 0; i < kOps; ++i) Fill({w.local() + i * kSlot, kSlot}, i);
  std::vector<Op> ops;
  for (std::size_t i = 0; i < kOps; ++i) {
    std::byte* l = w.local() + i * kSlot;
    const std::uint64_t r = w.raddr(i * kSlot);
    switch (i % 4) {
      case 0:
        ops.push_back(Op::Write(l, w.lmr.get(), kSlot, r, w.rkey(), i));
        break;
      case 1:
        ops.push_back(Op::Write(l, w.lmr.get(), 1 + i, r, w.rkey(), i));
        break;
      case 2:
        ops.push_back(
            Op::FetchAdd(reinterpret_cast<std::uint64_t*>(l), w.lmr.get(), r, w.rkey(), i, i));
        break;
      default:
        ops.push_back(Op::WriteWithImm(l, w.lmr.get(), kSlot, r, w.rkey(), 7, i));
        break;
    }
  }
  std::vector<Completion> c = RunBatch(*w.conn, ops);
  ASSERT_EQ(c.size(), kOps);
  for (std::size_t i = 0; i < kOps; ++i) {
    EXPECT_EQ(c[i].context, i) << "completions must come in posting order";
    EXPECT_EQ(c[i].type, ops[i].type);
    EXPECT_TRUE(c[i].status.ok()) << c[i].status;
  }
  for (std::size_t i = 0; i < kOps; i += 4) {
    EXPECT_TRUE(HasPattern({w.remote() + i * kSlot, kSlot}, i)) << "slot " << i;
  }
  EXPECT_EQ(w.conn->outstanding(), 0u);
}

TEST_P(TransportConformance, ResourceExhaustedPastMaxOutstanding) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w, World::kDefaultBytes, kRemoteAll,
                                [](EndpointOptions& o) { o.max_outstanding = 16; }));
  const std::size_t max = w.conn->max_outstanding();
  ASSERT_GE(max, 1u);
  ASSERT_LE(max, 16u);
  std::vector<Op> ops;
  for (std::size_t i = 0; i <= max; ++i) {
    ops.push_back(Op::Read(w.local() + 8 * i, w.lmr.get(), 8, w.raddr(8 * i), w.rkey(), i));
  }
  Status s = w.conn->Post(ops);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(w.conn->outstanding(), 0u);
  // Exactly max fits; one more does not until completions are polled.
  ASSERT_OK(w.conn->Post(std::span(ops.data(), max)));
  EXPECT_EQ(w.conn->outstanding(), max);
  s = w.conn->Post(std::span(ops.data() + max, 1));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  std::vector<Completion> c = WaitFor(*w.conn, max);
  ASSERT_EQ(c.size(), max);
  for (const Completion& x : c) EXPECT_TRUE(x.status.ok()) << x.status;
  EXPECT_EQ(w.conn->outstanding(), 0u);
  EXPECT_OK(RunOne(*w.conn, ops[max]));
}

TEST_P(TransportConformance, WaitWithNothingOutstandingIsFailedPrecondition) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::array<Completion, 1> c;
  auto r = w.conn->Wait(c, DeadlineAfter(kLongWait));
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
}

}  // namespace
}  // namespace rdmaps::transport

// The transport conformance suite (see conformance.h): every test here is
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

constexpr auto kLongWait = seconds(20);  // Hang guard; tests finish far sooner.

// Byte i of pattern `seed`.
std::byte PatternByte(std::uint64_t seed, std::size_t i) {
  return static_cast<std::byte>((seed * 131 + i * 7 + (i >> 8)) & 0xff);
}
void Fill(std::span<std::byte> s, std::uint64_t seed) {
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = PatternByte(seed, i);
}
bool HasPattern(std::span<const std::byte> s, std::uint64_t seed) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != PatternByte(seed, i)) return false;
  }
  return true;
}

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

using World = ConformanceWorld;

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    ::rdmaps::Status s_ = ::rdmaps::internal::AsStatus(expr); \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_;              \
  } while (false)
#define EXPECT_OK(expr)                                       \
  do {                                                        \
    ::rdmaps::Status s_ = ::rdmaps::internal::AsStatus(expr); \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_;              \
  } while (false)

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

// --- Ordering. ---------------------------------------------------------

TEST_P(TransportConformance, ReadAfterWriteOnOneConnectionSeesTheWrite) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  constexpr std::size_t kLen = 1024;
  std::byte* out = w.local() + 8192;
  for (std::uint64_t round = 1; round <= 50; ++round) {
    Fill({w.local(), kLen}, round);
    // WRITE then READ of the same bytes in one batch, no fence.
    const Op ops[] = {
        Op::Write(w.local(), w.lmr.get(), kLen, w.raddr(round * 8), w.rkey(), 1),
        Op::Read(out, w.lmr.get(), kLen, w.raddr(round * 8), w.rkey(), 2),
    };
    std::vector<Completion> c = RunBatch(*w.conn, ops);
    ASSERT_EQ(c.size(), 2u);
    ASSERT_TRUE(c[0].status.ok() && c[1].status.ok()) << c[0].status << " " << c[1].status;
    ASSERT_TRUE(HasPattern({out, kLen}, round)) << "round " << round;
  }
}

TEST_P(TransportConformance, FencedOpsSeeEarlierReadsAndAtomics) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  auto* word = reinterpret_cast<std::uint64_t*>(w.remote());
  auto* prior = reinterpret_cast<std::uint64_t*>(w.local());
  auto* seen = reinterpret_cast<std::uint64_t*>(w.local() + 8);
  auto* old = reinterpret_cast<std::uint64_t*>(w.local() + 16);
  auto* fresh = reinterpret_cast<std::uint64_t*>(w.local() + 24);
  *word = 100;
  *fresh = 555;
  for (std::uint64_t round = 0; round < 20; ++round) {
    const std::uint64_t before = 100 + round * 3;
    const Op ops[] = {
        Op::FetchAdd(prior, w.lmr.get(), w.raddr(), w.rkey(), 3, 1),
        // Fenced: runs after the atomic completed, so sees its result.
        Op::Read(seen, w.lmr.get(), 8, w.raddr(), w.rkey(), 2).WithFence(),
        // READ, then a fenced WRITE of the same word: the READ sees the old
        // value, the WRITE lands after it.
        Op::Read(old, w.lmr.get(), 8, w.raddr(64), w.rkey(), 3),
        Op::Write(fresh, w.lmr.get(), 8, w.raddr(64), w.rkey(), 4).WithFence(),
    };
    w.remote_mem[8] = round;
    std::vector<Completion> c = RunBatch(*w.conn, ops);
    ASSERT_EQ(c.size(), 4u);
    for (const Completion& x : c) ASSERT_TRUE(x.status.ok()) << x.status;
    EXPECT_EQ(*prior, before);
    EXPECT_EQ(*seen, before + 3);
    EXPECT_EQ(*old, round);
    EXPECT_EQ(w.remote_mem[8], 555u);
  }
}

// --- WRITE_WITH_IMM and notifications. -----------------------------------

TEST_P(TransportConformance, WriteWithImmDataIsVisibleWhenNotified) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  constexpr std::size_t kRounds = 64;
  constexpr std::size_t kSlot = 512;  // Each round: a WRITE of slot i, then a WWI of tag i.
  const std::size_t tag_base = kRounds * kSlot;
  std::atomic<std::size_t> checked{0};
  std::latch ready(1);
  std::thread target([&] {
    ready.count_down();
    std::array<Notification, 8> buf;
    std::size_t seen = 0;
    const Deadline deadline = DeadlineAfter(kLongWait);
    while (seen < kRounds && SteadyClock::now() < deadline) {
      auto n = w.server->WaitNotifications(buf, deadline);
      if (!n.ok()) {
        ADD_FAILURE() << n.status();
        return;
      }
      for (std::size_t k = 0; k < *n; ++k) {
        const Notification& x = buf[k];
        EXPECT_EQ(x.kind, Notification::Kind::kImmediate);
        EXPECT_EQ(x.peer_id, kClientId);
        EXPECT_EQ(x.length, 8u);
        const std::size_t i = x.imm;
        EXPECT_EQ(i, seen) << "immediates arrive in posting order";
        if (i >= kRounds) return;
        // Both the earlier WRITE's data and the WWI's own data are visible.
        EXPECT_TRUE(HasPattern({w.remote() + i * kSlot, kSlot}, i + 1000)) << "round " << i;
        EXPECT_EQ(w.remote_mem[(tag_base / 8) + i], i + 1) << "round " << i;
        ++seen;
        checked.fetch_add(1);
      }
    }
  });
  ready.wait();
  for (std::size_t i = 0; i < kRounds; ++i) {
    std::byte* l = w.local() + i * kSlot;
    Fill({l, kSlot}, i + 1000);
    auto* tag = reinterpret_cast<std::uint64_t*>(w.local() + tag_base + 8 * i);
    *tag = i + 1;
    const Op ops[] = {
        Op::Write(l, w.lmr.get(), kSlot, w.raddr(i * kSlot), w.rkey(), 2 * i),
        Op::WriteWithImm(tag, w.lmr.get(), 8, w.raddr(tag_base + 8 * i), w.rkey(),
                         static_cast<std::uint32_t>(i), 2 * i + 1),
    };
    std::vector<Completion> c = RunBatch(*w.conn, ops);
    ASSERT_EQ(c.size(), 2u);
    ASSERT_TRUE(c[0].status.ok() && c[1].status.ok());
  }
  target.join();
  EXPECT_EQ(checked.load(), kRounds);
}

TEST_P(TransportConformance, WaitNotificationsReturnsZeroAtDeadline) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  std::array<Notification, 4> buf;
  const Deadline deadline = DeadlineAfter(milliseconds(50));
  auto n = w.server->WaitNotifications(buf, deadline);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u);
  EXPECT_GE(SteadyClock::now(), deadline) << "returned 0 before the deadline";
}

TEST_P(TransportConformance, InterruptWakesWaitNotifications) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  const Deadline deadline = DeadlineAfter(kLongWait);
  Result<std::size_t> got = std::size_t{99};
  std::thread waiter([&] {
    std::array<Notification, 4> buf;
    got = w.server->WaitNotifications(buf, deadline);
  });
  w.server->Interrupt();
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 0u);
  EXPECT_LT(SteadyClock::now(), deadline) << "Interrupt did not wake the waiter";
}

// --- Atomics. ----------------------------------------------------------

TEST_P(TransportConformance, CompareSwapSucceedsAndFails) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  auto* result = reinterpret_cast<std::uint64_t*>(w.local());
  w.remote_mem[3] = 42;
  ASSERT_OK(RunOne(*w.conn, Op::CompareSwap(result, w.lmr.get(), w.raddr(24), w.rkey(), 42, 77)));
  EXPECT_EQ(*result, 42u) << "returns the prior value";
  EXPECT_EQ(w.remote_mem[3], 77u) << "swapped";
  ASSERT_OK(RunOne(*w.conn, Op::CompareSwap(result, w.lmr.get(), w.raddr(24), w.rkey(), 42, 99)));
  EXPECT_EQ(*result, 77u) << "returns the current value on failure";
  EXPECT_EQ(w.remote_mem[3], 77u) << "not swapped";
  ASSERT_OK(RunOne(*w.conn, Op::FetchAdd(result, w.lmr.get(), w.raddr(24), w.rkey(),
                                         ~std::uint64_t{0})));  // Wraps: adds -1.
  EXPECT_EQ(*result, 77u);
  EXPECT_EQ(w.remote_mem[3], 76u);
}

TEST_P(TransportConformance, AtomicsFromSeveralPeersLoseNothing) {
  World w;
  ASSERT_NO_FATAL_FAILURE(Build(w));
  constexpr int kPeers = 4;
  constexpr int kAddsPerPeer = 2048;  // In big batches: many atomics in flight at once.
  constexpr int kCasPerPeer = 100;
  const int kBatch = static_cast<int>(std::min<std::size_t>(64, w.conn->max_outstanding()));
  std::latch start(kPeers);
  std::vector<std::vector<std::uint64_t>> priors(kPeers);
  std::vector<std::thread> threads;
  for (int p = 0; p < kPeers; ++p) {
    auto client = NewEndpoint(10 + p);
    ASSERT_TRUE(client);
    threads.emplace_back([&, p, client = std::move(client)] {
      std::vector<std::uint64_t> results(static_cast<std::size_t>(kBatch));
      auto lmr = client->Register(results.data(), results.size() * 8, kAccessNone);
      auto conn = lmr.ok() ? client->Connect(w.address, {}, DeadlineAfter(kLongWait))
                           : Result<std::unique_ptr<Connection>>(lmr.status());
      start.arrive_and_wait();  // Before any ASSERT, so no peer waits forever.
      ASSERT_TRUE(lmr.ok()) << lmr.status();
      ASSERT_TRUE(conn.ok()) << conn.status();
      for (int done = 0; done < kAddsPerPeer;) {
        const int batch = std::min(kBatch, kAddsPerPeer - done);
        std::vector<Op> ops;
        for (int k = 0; k < batch; ++k) {
          ops.push_back(Op::FetchAdd(&results[k], lmr->get(), w.raddr(0), w.rkey(), 1, k));
        }
        std::vector<Completion> c = RunBatch(**conn, ops);
        ASSERT_EQ(c.size(), ops.size());
        done += batch;
        for (int k = 0; k < batch; ++k) {
          ASSERT_TRUE(c[k].status.ok()) << c[k].status;
          priors[p].push_back(results[k]);
        }
      }
      // A lock-free increment of word 1 by COMPARE_SWAP retry loops.
      for (int i = 0; i < kCasPerPeer; ++i) {
        std::uint64_t expected = 0;
        for (;;) {
          Status s = RunOne(**conn, Op::CompareSwap(&results[0], lmr->get(), w.raddr(8), w.rkey(),
                                                    expected, expected + 1));
          ASSERT_TRUE(s.ok()) << s;
          if (results[0] == expected) break;
          expected = results[0];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(w.remote_mem[0], std::uint64_t{kPeers * kAddsPerPeer}) << "lost FETCH_ADDs";
  EXPECT_EQ(w.remote_mem[1], std::uint64_t{kPeers * kCasPerPeer}) << "lost COMPARE_SWAPs";
  // Every FETCH_ADD saw a distinct prior value: 0 .. total-1.
  std::vector<std::uint64_t> all;
  for (const auto& v : priors) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  std::vector<std::uint64_t> want(kPeers * kAddsPerPeer);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(all, want);
}

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

TEST_P(TransportConformance, WrongJobTokenIsPermissionDenied) {
  auto server = NewEndpoint(kServerId);
  auto intruder = NewEndpoint(kClientId, [](EndpointOptions& o) { o.job_token = "another-job"; });
  ASSERT_TRUE(server && intruder);
  const std::string address = ListenOn(*server);
  auto c = intruder->Connect(address, {}, DeadlineAfter(kLongWait));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status();
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("token"));
  // The refused peer was not queued for Accept.
  auto a = server->Accept(DeadlineAfter(milliseconds(50)));
  EXPECT_EQ(a.status().code(), StatusCode::kTimedOut) << a.status();
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

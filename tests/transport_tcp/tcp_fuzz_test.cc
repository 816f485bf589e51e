// Fuzz-style robustness of a tcp listener: raw sockets throw random bytes,
// valid headers with huge lengths, truncated frames, wrong magics and bad
// handshakes at it, while a well-behaved connection keeps doing verified
// READs, WRITEs and atomics. The endpoint must survive every abuse, close
// only the abusive sockets, and keep serving the good connection correctly.
// Deterministic seed, bounded iterations.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <array>
#include <cstring>
#include <random>

#include "tests/transport_tcp/tcp_test_util.h"
#include "transport/tcp/tcp_wire.h"

namespace rdmaps::transport::tcp {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Pair;
using testing::RawConnect;
using testing::RawHello;
using testing::RunOne;
using testing::SendBytes;
using testing::WaitClosed;

// Offset of the part of the target region that truncated WRITEs may touch.
constexpr std::size_t kScratch = 32 * 1024;

RequestWire Request(WireOp op, std::uint64_t addr, std::uint32_t rkey, std::uint32_t length) {
  RequestWire r{};
  r.magic = kRequestMagic;
  r.opcode = static_cast<std::uint8_t>(op);
  r.remote_addr.set(addr);
  r.rkey.set(rkey);
  r.length.set(length);
  return r;
}

// One abuse of the listener; returns what it expects the endpoint to do with
// the abusive socket (true: close it).
class Abuser {
 public:
  Abuser(std::string address, RemoteRegion region, std::uint32_t seed)
      : address_(std::move(address)), region_(region), rng_(seed) {}

  // Runs case `kind`; EXPECTs the listener closed (or answered) the socket.
  void Run(int kind) {
    Fd fd = RawConnect(address_);
    ASSERT_TRUE(fd.valid()) << "the listener stopped accepting (case " << kind << ")";
    switch (kind) {
      case 0: {  // Random bytes instead of a hello.
        std::vector<std::uint8_t> junk(1 + rng_() % 300);
        for (auto& b : junk) b = static_cast<std::uint8_t>(rng_());
        junk[0] = 'X';  // Never a valid magic.
        ASSERT_TRUE(SendBytes(fd.get(), junk.data(), junk.size()));
        EXPECT_TRUE(WaitClosed(fd.get())) << "random bytes: socket left open";
        break;
      }
      case 1: {  // Bad handshakes: wrong secret, version, session, flags.
        int variant = static_cast<int>(rng_() % 4);
        if (variant == 0) {
          EXPECT_EQ(RawHello(fd.get(), HelloRole::kOps, 0, "wrong-token").status,
                    static_cast<std::uint8_t>(StatusCode::kPermissionDenied));
        } else if (variant == 1) {
          EXPECT_EQ(RawHello(fd.get(), HelloRole::kOps, 0, testing::kToken, 999).status,
                    static_cast<std::uint8_t>(StatusCode::kFailedPrecondition));
        } else if (variant == 2) {
          EXPECT_EQ(RawHello(fd.get(), HelloRole::kReverse, rng_()).status,
                    static_cast<std::uint8_t>(StatusCode::kNotFound));
        } else {
          HelloWire h{};
          h.magic.set(kHelloMagic);
          h.version.set(kProtocolVersion);
          h.role = 1;
          h.flags.set(0xffff);
          ASSERT_TRUE(SendBytes(fd.get(), &h, sizeof(h)));
        }
        EXPECT_TRUE(WaitClosed(fd.get())) << "bad handshake " << variant << ": socket left open";
        break;
      }
      case 2: {  // Truncated hello, then silence: the handshake deadline.
        HelloWire h{};
        h.magic.set(kHelloMagic);
        h.version.set(kProtocolVersion);
        ASSERT_TRUE(SendBytes(fd.get(), &h, 1 + rng_() % (sizeof(h) - 1)));
        EXPECT_TRUE(WaitClosed(fd.get())) << "truncated hello: socket left open";
        break;
      }
      default: {  // A valid hello, then a malformed request stream.
        ASSERT_EQ(RawHello(fd.get(), HelloRole::kOps, 0).status, 0);
        int variant = static_cast<int>(rng_() % 5);
        std::vector<std::uint8_t> bytes;
        auto append = [&](const void* p, std::size_t n) {
          auto* b = static_cast<const std::uint8_t*>(p);
          bytes.insert(bytes.end(), b, b + n);
        };
        if (variant == 0) {  // Huge length.
          RequestWire r = Request(WireOp::kWrite, region_.addr, region_.rkey, 0xfffffff0u);
          append(&r, sizeof(r));
        } else if (variant == 1) {  // Wrong request magic.
          RequestWire r = Request(WireOp::kRead, region_.addr, region_.rkey, 8);
          r.magic = static_cast<std::uint8_t>(0x10 + rng_() % 0x80);
          append(&r, sizeof(r));
        } else if (variant == 2) {  // Unknown opcode.
          RequestWire r = Request(WireOp::kRead, region_.addr, region_.rkey, 8);
          r.opcode = static_cast<std::uint8_t>(6 + rng_() % 200);
          append(&r, sizeof(r));
        } else if (variant == 3) {  // Random garbage after the hello.
          bytes.resize(1 + rng_() % 500);
          for (auto& b : bytes) b = static_cast<std::uint8_t>(rng_());
          bytes[0] = 0;
        } else {  // A truncated WRITE: header and part of the payload, then EOF.
          // Partial data may land, as on RDMA: aim it at the scratch part.
          RequestWire r = Request(WireOp::kWrite, region_.addr + kScratch, region_.rkey, 1000);
          append(&r, sizeof(r));
          bytes.resize(bytes.size() + rng_() % 1000, 0xee);
          ASSERT_TRUE(SendBytes(fd.get(), bytes.data(), bytes.size()));
          ::shutdown(fd.get(), SHUT_WR);
          EXPECT_TRUE(WaitClosed(fd.get())) << "truncated WRITE: socket left open";
          break;
        }
        ASSERT_TRUE(SendBytes(fd.get(), bytes.data(), bytes.size()));
        EXPECT_TRUE(WaitClosed(fd.get())) << "malformed request " << variant << ": left open";
        break;
      }
    }
  }

 private:
  std::string address_;
  RemoteRegion region_;
  std::mt19937 rng_;
};

TEST(TcpFuzz, ListenerSurvivesMalformedInputAndGoodConnectionKeepsWorking) {
  // The server's op_timeout bounds the handshake deadline silent abusers hit.
  Pair p(milliseconds(250));
  ASSERT_TRUE(p.conn);
  const RemoteRegion region = p.rmr->remote();
  Abuser abuser(p.address, region, /*seed=*/20261129);
  std::mt19937 rng(7);
  // The good connection owns the first 4 KiB of the region; abusers aim at
  // what lies after it, so any stray write by them would show up there.
  auto* counter = reinterpret_cast<std::uint64_t*>(p.local.data() + 60000);
  std::uint64_t expected_counter = 0;
  for (int iter = 0; iter < 60; ++iter) {
    // Silent abusers cost a handshake deadline each: only a few of those.
    int kind = iter % 4 == 2 && iter % 16 != 2 ? 0 : iter % 4;
    ASSERT_NO_FATAL_FAILURE(abuser.Run(kind));
    // Between abuses, the good connection does a verified WRITE + READ and
    // an atomic increment.
    const std::size_t len = 1 + rng() % 4000;
    for (std::size_t i = 0; i < len; ++i) p.local[i] = static_cast<std::byte>(rng());
    ASSERT_TRUE(
        RunOne(*p.conn, Op::Write(p.local.data(), p.lmr.get(), len, region.addr, region.rkey))
            .ok());
    std::vector<std::byte> back(len);
    ASSERT_TRUE(
        RunOne(*p.conn, Op::Read(p.local.data() + 8192, p.lmr.get(), len, region.addr, region.rkey))
            .ok());
    ASSERT_EQ(std::memcmp(p.local.data() + 8192, p.local.data(), len), 0) << "iteration " << iter;
    ASSERT_TRUE(
        RunOne(*p.conn, Op::FetchAdd(counter, p.lmr.get(), region.addr + 4096 - 8, region.rkey, 1))
            .ok());
    ASSERT_EQ(*counter, expected_counter++);
    ASSERT_TRUE(p.conn->health().ok()) << p.conn->health();
  }
  // No abuser wrote anything outside the scratch part.
  for (std::size_t i = 4096; i < kScratch; ++i) {
    ASSERT_EQ(p.remote[i], std::byte{0}) << "stray write at offset " << i;
  }
  // And a brand-new connection still gets in.
  auto again = p.client->Connect(p.address, {}, DeadlineAfter(seconds(5)));
  EXPECT_TRUE(again.ok()) << again.status();
}

}  // namespace
}  // namespace rdmaps::transport::tcp

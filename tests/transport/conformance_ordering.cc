// The transport conformance suite (see conformance.h), part four: ordering
// (a READ after a WRITE, fences), WRITE_WITH_IMM and its notifications, and
// atomics from several peers. Written against transport/transport.h only;
// runs on every backend.
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

#include "tests/transport/conformance.h"

namespace rdmaps::transport {
namespace {

using conformance::Fill;
using conformance::HasPattern;
using conformance::kLongWait;
using std::chrono::milliseconds;
using std::chrono::seconds;

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

}  // namespace
}  // namespace rdmaps::transport

// The in-process parameter-server suite (see ps_suite.h): servers and
// clients in one process on the backend under test - pull, push, clocks,
// barrier, async calls, argument checks, layouts and the advice logged about
// them, registered buffers, flow control and exactly-once apply, optimizers.
// Every case is written against the public API (plus TEST_ hooks that need
// no particular backend) and runs on fake, tcp and verbs.
#include "tests/ps/ps_suite.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <latch>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rdmaps/log.h"
#include "src/ps/initializer.h"
#include "src/ps/optimizer.h"
#include "src/ps/test_hooks.h"
#include "src/ps/wire.h"
#include "tests/ps/ps_test_util.h"

namespace rdmaps::testing {
namespace {

TEST_P(PsTest, PullReturnsInitialValuesAcrossShards) {
  const auto init = Initializer::Uniform(-1.0f, 1.0f, 77);
  auto c = StartCluster(transport(), 3, 1, {MakeTable(4, "emb", 10, 5, kAsp, init)});
  ASSERT_EQ(c.clients.size(), 1u);
  std::vector<float> out(10 * 5);
  ASSERT_TRUE(c.clients[0]->Pull(4, RowRange{0, 10}, out).ok());
  std::vector<float> want(5);
  for (std::uint64_t r = 0; r < 10; ++r) {
    internal::InitRow(init, 4, r, want.data(), 5);
    for (int k = 0; k < 5; ++k) ASSERT_EQ(out[r * 5 + k], want[k]) << "row " << r;
  }
  // Each server holds exactly its range partition.
  for (std::uint32_t s = 0; s < 3; ++s) {
    const auto shard = internal::PartitionOf(10, 3, s);
    std::vector<float> local;
    ASSERT_TRUE(c.servers[s]->ReadLocal(4, RowRange{shard.begin, shard.count}, &local).ok());
    for (std::uint64_t i = 0; i < shard.count * 5; ++i) {
      ASSERT_EQ(local[i], out[shard.begin * 5 + i]);
    }
  }
  // A sub-range crossing a shard boundary, and scattered rows with repeats.
  std::vector<float> sub(3 * 5);
  ASSERT_TRUE(c.clients[0]->Pull(4, RowRange{3, 3}, sub).ok());
  for (int i = 0; i < 15; ++i) EXPECT_EQ(sub[i], out[15 + i]);
  std::vector<std::uint64_t> ids = {9, 0, 4, 4, 3};
  std::vector<float> sc(ids.size() * 5);
  ASSERT_TRUE(c.clients[0]->Pull(4, ids, sc).ok());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    for (int k = 0; k < 5; ++k) EXPECT_EQ(sc[i * 5 + k], out[ids[i] * 5 + k]);
  }
}

TEST_P(PsTest, MoreServersThanRows) {
  auto c = StartCluster(transport(), 4, 1,
                        {MakeTable(1, "tiny", 2, 3, kAsp, Initializer::Constant(2.0f))});
  ASSERT_EQ(c.clients.size(), 1u);
  std::vector<float> g(2 * 3, 1.0f), out(2 * 3);
  ASSERT_TRUE(c.clients[0]->Push(1, RowRange{0, 2}, g).ok());
  ASSERT_TRUE(c.clients[0]->Pull(1, RowRange{0, 2}, out).ok());
  for (float v : out) EXPECT_EQ(v, 1.0f);
}

TEST_P(PsTest, PushIsAppliedAndReadMyWrites) {
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 7, 4)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<float> g(7 * 4), out(7 * 4);
  // 100 rounds of push then pull: every pull must see every earlier push, which
  // it only does because it waits for the servers' applied_seq.
  for (int round = 1; round <= 100; ++round) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = -static_cast<float>(i % 3 + 1);
    ASSERT_TRUE(cl.Push(1, RowRange{0, 7}, g).ok());
    ASSERT_TRUE(cl.Pull(1, RowRange{0, 7}, out).ok());
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], static_cast<float>(round * static_cast<int>(i % 3 + 1))) << i;
    }
  }
  EXPECT_EQ(cl.stats().pushes, 100u);
}

// Flush() returns only once every server applied this worker's pushes: with
// the apply threads paused it cannot complete; once they run, it completes
// and the servers have applied every push exactly once.
TEST_P(PsTest, FlushReturnsOnceEveryPushIsApplied) {
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 9, 3)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  EXPECT_TRUE(cl.Flush().ok());  // nothing pushed: nothing to wait for
  for (auto& s : c.servers) internal::TEST_PauseApply(*s, true);
  std::vector<float> g(9 * 3, -1.0f);
  std::vector<std::uint64_t> ids = {8, 0, 4};
  std::vector<float> gi(3 * 3, -2.0f);
  ASSERT_TRUE(cl.Push(1, RowRange{0, 9}, g).ok());
  ASSERT_TRUE(cl.Push(1, ids, gi).ok());
  Handle h = cl.FlushAsync();
  // Paused servers apply nothing, so the flush cannot have finished, and
  // it polls (waits) rather than returning.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (cl.stats().pull_waits == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  EXPECT_GT(cl.stats().pull_waits, 0u);
  EXPECT_FALSE(h.done());
  for (auto& s : c.servers) EXPECT_EQ(s->stats().pushes_applied, 0u);
  for (auto& s : c.servers) internal::TEST_PauseApply(*s, false);
  ASSERT_TRUE(h.WaitFor(std::chrono::seconds(20)).ok());
  // Applied, each push once (the range push is one slot per server, the
  // scattered one touches both servers too).
  EXPECT_EQ(PushesApplied(c), 4u);
  for (std::uint32_t si = 0; si < 2; ++si) {
    const std::uint64_t begin = si == 0 ? 0 : 5, count = si == 0 ? 5 : 4;
    std::vector<float> local;
    ASSERT_TRUE(c.servers[si]->ReadLocal(1, RowRange{begin, count}, &local).ok());
    for (std::uint64_t r = 0; r < count; ++r) {
      const std::uint64_t row = begin + r;
      const float want = 1.0f + ((row == 8 || row == 0 || row == 4) ? 2.0f : 0.0f);
      EXPECT_EQ(local[r * 3], want) << row;
    }
  }
}

// Many scattered ids dense in their span are pulled as the span plus a
// gather; few sparse ones row by row. Both return exactly the rows a range
// pull returns, duplicates included, on every layout and across servers.
TEST_P(PsTest, ScatteredPullsBySpanOrByRowReturnTheSameRows) {
  TableOptions dense = MakeTable(1, "dense", 3000, 16, kAsp, Initializer::Uniform(-1, 1, 5));
  TableOptions tiny = MakeTable(2, "tiny", 70000, 1, kAsp, Initializer::Uniform(-1, 1, 6));
  tiny.layout = RowLayout::kAuto;  // inline, blocks of 64 rows
  TableOptions emb = MakeTable(3, "emb", 65536, 64, kAsp, Initializer::Uniform(-1, 1, 7));
  emb.layout = RowLayout::kAuto;  // inline, a row per block
  auto c = StartCluster(transport(), 2, 1, {dense, tiny, emb});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::mt19937_64 rng(9);
  struct Case {
    std::uint32_t table;
    std::uint64_t rows;
    std::uint32_t dim;
    std::size_t ids;
    bool span;
  };
  for (const Case& k : {Case{1, 3000, 16, 5000, true}, Case{2, 70000, 1, 70000, true},
                        Case{3, 65536, 64, 300, false}}) {
    std::vector<float> all(k.rows * k.dim);
    ASSERT_TRUE(cl.Pull(k.table, RowRange{0, k.rows}, all).ok());
    std::vector<std::uint64_t> ids(k.ids);
    for (auto& id : ids) id = rng() % k.rows;
    ids[1] = ids[0];  // a duplicate
    std::vector<float> out(ids.size() * k.dim);
    const std::uint64_t spans = cl.stats().span_pulls;
    ASSERT_TRUE(cl.Pull(k.table, ids, out).ok());
    EXPECT_EQ(cl.stats().span_pulls - spans, k.span ? 1u : 0u) << k.table;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      for (std::uint32_t d = 0; d < k.dim; ++d) {
        ASSERT_EQ(out[i * k.dim + d], all[ids[i] * k.dim + d]) << k.table << " " << i;
      }
    }
  }
}

// A push larger than a slot is pipelined: many slots in flight per server
// (and a control READ riding behind them), applied as they land. Every
// slot is applied exactly once, from registered and from staged gradients,
// and each PushPull sees its own push.
TEST_P(PsTest, PipelinedLargePushesApplyEverySlotOnce) {
  // 16 KiB slots carry 3 rows of 1024 floats: a 64-row push is 22 slots per
  // server, more than the ring's 8.
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 128, 1024)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<float> reg(128 * 1024, -1.0f), out(128 * 1024);
  std::vector<float> staged(128 * 1024, -1.0f);
  ASSERT_TRUE(cl.RegisterBuffer(reg).ok());
  ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  constexpr int kRounds = 20;
  for (int round = 1; round <= kRounds; ++round) {
    const std::vector<float>& g = round % 2 ? reg : staged;
    ASSERT_TRUE(cl.PushPull(1, RowRange{0, 128}, g, out).ok());
    for (std::size_t i = 0; i < out.size(); i += 97) ASSERT_EQ(out[i], round) << i;
  }
  ASSERT_TRUE(cl.Flush().ok());
  EXPECT_EQ(PushesApplied(c), kRounds * 2u * 22u);
  EXPECT_EQ(cl.stats().torn_retries, 0u);
  for (auto& s : c.servers) EXPECT_EQ(s->stats().protocol_errors, 0u);
}

// A PushPull of many slots per server (its push pipelined, its pull behind
// it) returns what Push, Flush and Pull of the same gradients return on a
// twin table, bit for bit, for a range that starts inside server 0's shard
// and ends inside server 1's, from registered and staged buffers, dense and
// inline; and it applies as many slots.
TEST_P(PsTest, PushPullEqualsPushFlushPull) {
  // 16 KiB slots carry 4 rows of 1000 floats (dense) or 13 of 300 (inline):
  // 12-19 slots per server, more than the ring's 8.
  TableOptions inl_a = InlineTable(3, "inl_a", 300, 300);
  TableOptions inl_b = InlineTable(4, "inl_b", 300, 300);
  for (TableOptions* t : {&inl_a, &inl_b}) t->optimizer = OptimizerOptions::Sgd(0.5f);
  auto c = StartCluster(
      transport(), 2, 1,
      {MakeTable(1, "dense_a", 160, 1000, kAsp, Initializer::Zeros(), OptimizerOptions::Sgd(0.5f)),
       MakeTable(2, "dense_b", 160, 1000, kAsp, Initializer::Zeros(), OptimizerOptions::Sgd(0.5f)),
       inl_a, inl_b});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  auto applied = [&] { return PushesApplied(c); };
  struct Case {
    std::uint32_t pushpull, twin, dim;
    RowRange range;
  };
  for (const Case& k : {Case{1, 2, 1000, RowRange{7, 147}}, Case{3, 4, 300, RowRange{3, 290}}}) {
    const std::size_t n = k.range.count * k.dim;
    std::vector<float> reg_g(n), reg_out(n), g(n), out(n), want(n);
    ASSERT_TRUE(cl.RegisterBuffer(reg_g).ok());
    ASSERT_TRUE(cl.RegisterBuffer(reg_out).ok());
    for (int round = 1; round <= 6; ++round) {
      SCOPED_TRACE("table " + std::to_string(k.pushpull) + " round " + std::to_string(round));
      const bool registered = round % 2 == 0;
      std::vector<float>& grads = registered ? reg_g : g;
      std::vector<float>& dst = registered ? reg_out : out;
      for (std::size_t i = 0; i < n; ++i) {
        grads[i] = static_cast<float>((i * 7 + round * 13) % 101) * 0.25f - 10.0f;
      }
      const std::uint64_t before = applied();
      ASSERT_TRUE(cl.Push(k.twin, k.range, grads).ok());
      ASSERT_TRUE(cl.Flush().ok());
      ASSERT_TRUE(cl.Pull(k.twin, k.range, want).ok());
      ASSERT_TRUE(cl.Flush().ok());
      const std::uint64_t push_slots = applied() - before;
      std::fill(dst.begin(), dst.end(), -1.0f);
      ASSERT_TRUE(cl.PushPull(k.pushpull, k.range, grads, dst).ok());
      ASSERT_TRUE(cl.Flush().ok());
      EXPECT_EQ(applied() - before - push_slots, push_slots);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], want[i]) << i;
    }
    ASSERT_TRUE(cl.UnregisterBuffer(reg_g).ok());
    ASSERT_TRUE(cl.UnregisterBuffer(reg_out).ok());
  }
  EXPECT_EQ(cl.stats().torn_retries, 0u);
  for (auto& s : c.servers) EXPECT_EQ(s->stats().protocol_errors, 0u);
}

// A pipelined PushPull (registered output, dense table: rows READ as the
// server applies the slots covering them, while the rest of the push is
// still sent) returns this push in every row, from a range across both
// servers' shards, with rows of one block each and rows checked in blocks
// of several (the range's end blocks wanted in part, left to the normal
// pull); each slot is applied once. Rounds go on (at least 8) until the
// follower pulled some rows, which it does in the first round unless the
// machine is loaded.
TEST_P(PsTest, PipelinedPushPullSeesItsPushAndAppliesEachSlotOnce) {
  auto c = StartCluster(transport(), 2, 1,
                        {MakeTable(1, "big", 96, 1000), MakeTable(2, "small", 600, 60)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  auto applied = [&] { return PushesApplied(c); };
  struct Case {
    std::uint32_t table, dim;
    RowRange range;
  };
  for (const Case& k : {Case{1, 1000, RowRange{5, 86}}, Case{2, 60, RowRange{7, 583}}}) {
    SCOPED_TRACE("table " + std::to_string(k.table));
    const std::size_t n = k.range.count * k.dim;
    std::vector<float> g(n, -1.0f), out(n);
    ASSERT_TRUE(cl.RegisterBuffer(g).ok());
    ASSERT_TRUE(cl.RegisterBuffer(out).ok());
    // The slots of one push of the range.
    std::uint64_t before = applied();
    ASSERT_TRUE(cl.Push(k.table, k.range, g).ok());
    ASSERT_TRUE(cl.Flush().ok());
    const std::uint64_t slots = applied() - before;
    before = applied();
    const std::uint64_t pipelined = cl.stats().rows_pulled_pipelined;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int round = 1;
    while (round < 8 || (cl.stats().rows_pulled_pipelined == pipelined &&
                         std::chrono::steady_clock::now() < deadline)) {
      ++round;
      std::fill(out.begin(), out.end(), -1.0f);
      ASSERT_TRUE(cl.PushPull(k.table, k.range, g, out).ok());
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], round) << i << " round " << round;
    }
    EXPECT_GT(cl.stats().rows_pulled_pipelined, pipelined);
    ASSERT_TRUE(cl.Flush().ok());
    EXPECT_EQ(applied() - before, slots * (round - 1));
    ASSERT_TRUE(cl.UnregisterBuffer(g).ok());
    ASSERT_TRUE(cl.UnregisterBuffer(out).ok());
  }
  for (auto& s : c.servers) EXPECT_EQ(s->stats().protocol_errors, 0u);
}

// An in-place PushPull (the output is the gradient buffer, registered) is
// not pipelined: a row READ could land on gradients not sent yet. It
// returns the rows after this push, and the push applied the gradients as
// they were.
TEST_P(PsTest, InPlacePushPullAppliesTheGradientsItWasGiven) {
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 64, 1000)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<float> buf(64 * 1000, -2.0f);
  ASSERT_TRUE(cl.RegisterBuffer(buf).ok());
  ASSERT_TRUE(cl.PushPull(1, RowRange{0, 64}, buf, buf).ok());
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], 2.0f) << i;
  std::fill(buf.begin(), buf.end(), -1.0f);
  ASSERT_TRUE(cl.PushPull(1, RowRange{0, 64}, buf, buf).ok());
  for (std::size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], 3.0f) << i;
  EXPECT_EQ(cl.stats().rows_pulled_pipelined, 0u);
}

// Under ASP a pull never waits for other workers; Barrier() still makes
// every push made before it visible to every pull after it. Worker 0 pushes
// while the server's apply is paused; worker 1's barrier cannot complete
// before that push is applied, so its pull sees it.
TEST_P(PsTest, BarrierMakesEveryPushBeforeItVisibleUnderAsp) {
  auto c = StartCluster(transport(), 1, 2, {MakeTable(1, "w", 4, 2, kAsp)});
  ASSERT_EQ(c.clients.size(), 2u);
  internal::TEST_PauseApply(*c.servers[0], true);
  std::vector<float> g(4 * 2, -3.0f), out(4 * 2, -1.0f);
  ASSERT_TRUE(c.clients[0]->Push(1, RowRange{0, 4}, g).ok());
  std::atomic<bool> puller_done{false};
  Status b0, b1, pull;
  std::thread w0([&] { b0 = c.clients[0]->Barrier(); });
  std::thread w1([&] {
    b1 = c.clients[1]->Barrier();
    if (b1.ok()) pull = c.clients[1]->Pull(1, RowRange{0, 4}, out);
    puller_done.store(true);
  });
  // Resume the apply once worker 0 waits for it (or, were the barrier not
  // to wait, once worker 1 already pulled: then the check below fails).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (c.clients[0]->stats().pull_waits == 0 && !puller_done.load() &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  internal::TEST_PauseApply(*c.servers[0], false);
  w0.join();
  w1.join();
  ASSERT_TRUE(b0.ok()) << b0;
  ASSERT_TRUE(b1.ok()) << b1;
  ASSERT_TRUE(pull.ok()) << pull;
  for (float v : out) EXPECT_EQ(v, 3.0f);
}

TEST_P(PsTest, ARefusedConnectionClaimingAWorkersIdDoesNotKillThatWorker) {
  // Regression: a connection that claimed "peer 0", was refused by the server
  // (no rdmaps hello) and hung up made the server declare worker 0 dead and
  // end the job. The peer's identity is the connection it bootstrapped on.
  auto c = StartCluster(transport(), 1, 1, {MakeTable(1, "w", 4, 2)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& worker0 = *c.clients[0];
  std::vector<float> g(4 * 2, -1.0f), out(4 * 2);
  ASSERT_TRUE(worker0.Push(1, RowRange{0, 4}, g).ok());
  {
    // A hand-written client of the job (it knows the secret) posing as worker 0.
    transport::EndpointOptions eo;
    eo.transport = transport();
    eo.job_token = "ps-test";
    eo.peer_id = 0;
    eo.address_hint = c.addresses[0];
    auto ep = transport::Endpoint::Create(eo);
    ASSERT_TRUE(ep.ok()) << ep.status();
    transport::ConnectOptions co;
    co.user_data.assign(24, 0xab);  // not a HelloMsg: the server refuses it
    auto conn =
        (*ep)->Connect(c.addresses[0], co, transport::DeadlineAfter(std::chrono::seconds(20)));
    ASSERT_TRUE(conn.ok()) << conn.status();
    (*conn)->Close();
  }
  // tcp reports the impostor's hang-up to the server (its ops socket
  // closes); fake and verbs do not once the server has closed its side.
  if (transport() == "tcp") {
    const auto deadline = transport::DeadlineAfter(std::chrono::seconds(20));
    while (c.servers[0]->stats().unbound_notifications == 0 &&
           transport::SteadyClock::now() < deadline) {
      std::this_thread::yield();
    }
    EXPECT_GE(c.servers[0]->stats().unbound_notifications, 1u)
        << "the impostor's disconnect never arrived";
  }
  const ServerStats st = c.servers[0]->stats();
  EXPECT_TRUE(st.dead_workers.empty()) << "worker " << st.dead_workers[0] << " declared dead";
  // Worker 0 goes on: its next push is applied and read back.
  ASSERT_TRUE(worker0.Push(1, RowRange{0, 4}, g).ok());
  ASSERT_TRUE(worker0.Pull(1, RowRange{0, 4}, out).ok());
  for (float v : out) EXPECT_EQ(v, 2.0f);
  EXPECT_TRUE(c.servers[0]->stats().dead_workers.empty());
}

TEST_P(PsTest, ScatteredPushAppliesDuplicatesEachTime) {
  auto c = StartCluster(transport(), 3, 1, {MakeTable(2, "emb", 11, 2)});
  ASSERT_EQ(c.clients.size(), 1u);
  std::vector<std::uint64_t> ids = {5, 0, 5, 10, 7};
  std::vector<float> g(ids.size() * 2, -1.0f), out(11 * 2);
  ASSERT_TRUE(c.clients[0]->Push(2, ids, g).ok());
  ASSERT_TRUE(c.clients[0]->Pull(2, RowRange{0, 11}, out).ok());
  std::vector<float> want(11, 0.0f);
  for (auto id : ids) want[id] += 1.0f;
  for (int r = 0; r < 11; ++r) {
    EXPECT_EQ(out[r * 2], want[r]) << r;
    EXPECT_EQ(out[r * 2 + 1], want[r]) << r;
  }
}

TEST_P(PsTest, BadArgumentsFailBeforeAnythingIsSent) {
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 8, 4)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<float> buf(8 * 4);
  Status s = cl.Pull(99, RowRange{0, 1}, std::span<float>(buf.data(), 4));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("99"), std::string::npos) << s;
  s = cl.Pull(1, RowRange{5, 4}, std::span<float>(buf.data(), 16));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("8 rows"), std::string::npos) << s;
  s = cl.Push(1, RowRange{0, 2}, std::span<const float>(buf.data(), 7));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("need 8"), std::string::npos) << s;
  std::vector<std::uint64_t> ids = {1, 8};
  s = cl.Push(1, ids, std::span<const float>(buf.data(), 8));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = cl.Pull(1, ids, std::span<float>(buf.data(), 8));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cl.FindTable("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(cl.FindTable("w")->rows, 8u);
  const ClientStats st = cl.stats();
  EXPECT_EQ(st.bytes_written, 0u);
  EXPECT_EQ(st.bytes_read, 0u);
  EXPECT_EQ(st.pushes + st.pulls, 0u);
}

TEST_P(PsTest, ServerRejectsBadOptions) {
  ServerOptions o = MakeServerOptions(transport(), 2, 2, 1, {MakeTable(1, "w", 8, 4)});
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = MakeServerOptions(transport(), 0, 1, 1, {MakeTable(1, "w", 8, 4), MakeTable(1, "v", 8, 4)});
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = MakeServerOptions(transport(), 0, 1, 1, {MakeTable(1, "w", 8, 100000)});
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);  // slot too small
  // Regression: 2^60 rows x 16 wrapped the shard size to a few KiB, and
  // initialising the rows wrote past the allocation.
  o = MakeServerOptions(transport(), 0, 1, 1, {MakeTable(1, "w", std::uint64_t{1} << 60, 16)});
  Status s = Server::Start(o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("1152921504606846976"));
  // Regression: a learning rate of inf (1e39 as a float) was accepted.
  o = MakeServerOptions(transport(), 0, 1, 1, {MakeTable(1, "w", 8, 4)});
  o.tables[0].optimizer.learning_rate = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Server::Start(o).status().code(), StatusCode::kInvalidArgument);
}

// RowLayout::kAuto: inline while the largest shard holds at most 64 KiB of
// rows, dense beyond; clients see the choice, and a ClientOptions.tables entry
// that says kAuto matches it.
TEST_P(PsTest, AutoLayoutIsInlineForSmallShardsAndDenseForLarge) {
  auto table = [](std::uint32_t id, const std::string& name, std::uint64_t rows,
                  std::uint32_t dim) {
    TableOptions t = MakeTable(id, name, rows, dim);
    t.layout = RowLayout::kAuto;
    return t;
  };
  // 2 servers. 64 KiB = 256 rows of 64 floats per shard.
  const std::vector<TableOptions> tables = {
      table(1, "at_limit", 512, 64),  // 256 rows per shard: inline
      table(2, "one_more", 513, 64),  // 257 on the first shard: dense
      table(3, "bias", 1, 10),        // inline
      table(4, "emb", 65536, 2),      // embedding-shaped: inline
      table(5, "wide", 65536, 256),   // 1 KiB rows: dense
  };
  auto c = StartCluster(transport(), 2, 1, tables, 8, [&](ClientOptions& o) { o.tables = tables; });
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  EXPECT_EQ(cl.FindTable("at_limit")->layout, RowLayout::kInline);
  EXPECT_EQ(cl.FindTable("one_more")->layout, RowLayout::kDense);
  EXPECT_EQ(cl.FindTable("bias")->layout, RowLayout::kInline);
  EXPECT_EQ(cl.FindTable("emb")->layout, RowLayout::kInline);
  EXPECT_EQ(cl.FindTable("wide")->layout, RowLayout::kDense);
  // Both work end to end.
  for (std::uint32_t id : {1u, 2u}) {
    const std::uint64_t rows = id == 1 ? 512 : 513;
    std::vector<float> g(rows * 64, -1.0f), out(rows * 64);
    ASSERT_TRUE(cl.Push(id, RowRange{0, rows}, g).ok());
    ASSERT_TRUE(cl.Pull(id, RowRange{0, rows}, out).ok());
    for (float v : out) ASSERT_EQ(v, 1.0f) << "table " << id;
  }
  // A client that expects another layout than the servers chose is refused.
  ClientOptions co = MakeClientOptions(transport(), 0, 1, c.addresses);
  co.tables = {tables[0]};
  co.tables[0].layout = RowLayout::kDense;
  auto wrong = Client::Connect(co);
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition) << wrong.status();
}

// Collects what the library logs, INFO included, while it lives (through
// rdmaps::SetLogSink; the previous threshold comes back after).
class LogCapture {
 public:
  LogCapture() : min_severity_(MinLogSeverity()) {
    SetMinLogSeverity(LogSeverity::kInfo);
    SetLogSink([this](LogSeverity, std::string_view, int, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(message);
    });
  }
  ~LogCapture() {
    SetLogSink(nullptr);
    SetMinLogSeverity(min_severity_);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::size_t Count(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<std::size_t>(std::count_if(lines_.begin(), lines_.end(), [&](const auto& l) {
      return l.find(needle) != std::string::npos;
    }));
  }

 private:
  const LogSeverity min_severity_;
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// Scattered pulls of a dense table of small rows log the inline advice once
// per table; range pulls and inline tables do not.
TEST_P(PsTest, ScatteredPullsOfADenseSmallRowTableLogAdviceOnce) {
  auto c =
      StartCluster(transport(), 2, 1,
                   {MakeTable(1, "dense_emb", 1000, 16), InlineTable(2, "inline_emb", 1000, 16)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < 32; ++i) ids.push_back(i * 31 % 1000);
  std::vector<float> out(ids.size() * 16), range(100 * 16);
  LogCapture logs;
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 100}, range).ok());
  EXPECT_EQ(logs.Count("'dense_emb' has the dense layout"), 0u) << "a range pull is no reason";
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cl.Pull(1, ids, out).ok());
  EXPECT_EQ(logs.Count("'dense_emb' has the dense layout and is pulled by scattered ids"), 1u);
  EXPECT_EQ(logs.Count("\"layout\": \"inline\""), 1u);
  ASSERT_TRUE(cl.Pull(2, ids, out).ok());
  EXPECT_EQ(logs.Count("'inline_emb'"), 0u);
}

TEST_P(PsTest, RegisteredBuffersSkipTheStagingCopy) {
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 9, 3)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  // One registered arena holding gradients and the pull destination.
  std::vector<float> arena(2 * 9 * 3, 0.0f);
  std::span<float> grads(arena.data(), 9 * 3), out(arena.data() + 9 * 3, 9 * 3);
  ASSERT_TRUE(cl.RegisterBuffer(arena).ok());
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = -static_cast<float>(i);
  ASSERT_TRUE(cl.Push(1, RowRange{0, 9}, grads).ok());
  // Scattered rows: 8, 2, 3, 4 (gradients in two pieces) and a duplicate.
  std::vector<std::uint64_t> ids = {8, 2, 3, 4, 8};
  ASSERT_TRUE(cl.Push(1, ids, grads.subspan(0, ids.size() * 3)).ok());
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 9}, out).ok());
  ClientStats st = cl.stats();
  EXPECT_EQ(st.bytes_staged, 0u);
  EXPECT_EQ(st.zero_copy_calls, 3u);
  std::vector<float> want(9 * 3);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    for (int d = 0; d < 3; ++d) want[ids[k] * 3 + d] += static_cast<float>(k * 3 + d);
  }
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out[i], want[i]) << i;
  // Scattered rows are parts of the shards' checked blocks (each shard is one
  // block of 12-byte rows): READ whole into staging, and just the wanted
  // rows copied out (ZeroCopyPullsStageOnlyPartlyWantedBlocks has rows that
  // land in place).
  std::vector<float> expect(out.begin(), out.end());
  std::fill(out.begin(), out.end(), 0.0f);
  ASSERT_TRUE(cl.Pull(1, std::span<const std::uint64_t>(ids), out.subspan(0, ids.size() * 3)).ok());
  for (std::size_t k = 0; k < ids.size(); ++k) {
    for (int d = 0; d < 3; ++d) ASSERT_EQ(out[k * 3 + d], expect[ids[k] * 3 + d]);
  }
  EXPECT_EQ(cl.stats().bytes_staged, ids.size() * 3 * sizeof(float));
  // Unregistered memory is staged (and still correct).
  std::vector<float> plain(9 * 3);
  std::uint64_t before = cl.stats().bytes_staged;
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 9}, plain).ok());
  EXPECT_EQ(cl.stats().bytes_staged - before, plain.size() * sizeof(float));
  EXPECT_EQ(plain, expect);
  // A push whose gradients are in more pieces than a slot gathers is copied:
  // rows alternate between the servers, so each server's gradients are 10
  // separate pieces of the caller's buffer.
  std::vector<std::uint64_t> many;
  for (int k = 0; k < 20; ++k) many.push_back(k % 2 == 0 ? 0 : 8);
  std::vector<float> many_grads(many.size() * 3, -1.0f);
  ASSERT_TRUE(cl.RegisterBuffer(many_grads).ok());
  before = cl.stats().bytes_staged;
  ASSERT_TRUE(cl.Push(1, many, many_grads).ok());
  EXPECT_EQ(cl.stats().bytes_staged - before, many_grads.size() * sizeof(float));
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 9}, out).ok());
  EXPECT_EQ(out[0], expect[0] + 10.0f);
  EXPECT_EQ(out[8 * 3 + 2], expect[8 * 3 + 2] + 10.0f);
  // Registration errors.
  EXPECT_EQ(cl.RegisterBuffer(out.subspan(1, 4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cl.RegisterBuffer({}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cl.UnregisterBuffer(out).code(), StatusCode::kNotFound);
  ASSERT_TRUE(cl.UnregisterBuffer(arena).ok());
  const std::uint64_t staged = cl.stats().bytes_staged;
  ASSERT_TRUE(cl.Pull(1, RowRange{0, 9}, out).ok());
  EXPECT_GT(cl.stats().bytes_staged, staged) << "an unregistered buffer was used zero-copy";
}

// A pull into a registered buffer READs the blocks it wants wholly straight
// into it, and a block it wants only part of (at either end of a range, or
// a scattered row of a table of small rows) into staging, copying out the
// wanted rows. Rows of 1 KiB and more are blocks of their own: scattered
// rows land in place.
TEST_P(PsTest, ZeroCopyPullsStageOnlyPartlyWantedBlocks) {
  const auto init = Initializer::Uniform(-1.0f, 1.0f, 9);
  // 100 rows of 64 bytes on one server: blocks of 32 rows (the last of 4).
  TableOptions small = MakeTable(1, "small", 100, 16, kAsp, init);
  small.layout = RowLayout::kDense;
  auto c = StartCluster(transport(), 1, 1, {small, MakeTable(2, "wide", 6, 256, kAsp, init)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  ASSERT_EQ(internal::RowsPerBlock(internal::kLayoutDense, 100, 16, 1), 32u);
  auto expect_rows = [&](std::uint32_t table, std::uint32_t dim, std::span<const std::uint64_t> ids,
                         std::span<const float> got) {
    std::vector<float> want(dim);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      internal::InitRow(init, table, ids[k], want.data(), dim);
      for (std::uint32_t d = 0; d < dim; ++d) ASSERT_EQ(got[k * dim + d], want[d]) << ids[k];
    }
  };
  std::vector<float> out(100 * 256);
  ASSERT_TRUE(cl.RegisterBuffer(out).ok());
  std::vector<std::uint64_t> ids;
  // Rows [10, 97): rows 10-31 and 96 staged, blocks [32, 96) in place.
  for (std::uint64_t r = 10; r < 97; ++r) ids.push_back(r);
  ASSERT_TRUE(cl.Pull(1, RowRange{10, 87}, std::span(out).first(87 * 16)).ok());
  expect_rows(1, 16, ids, out);
  EXPECT_EQ(cl.stats().bytes_staged, 23 * 64u);
  EXPECT_EQ(cl.stats().zero_copy_calls, 1u);
  // Rows [64, 100): two whole blocks (the short last one included), in place.
  ids.clear();
  for (std::uint64_t r = 64; r < 100; ++r) ids.push_back(r);
  ASSERT_TRUE(cl.Pull(1, RowRange{64, 36}, std::span(out).first(36 * 16)).ok());
  expect_rows(1, 16, ids, out);
  EXPECT_EQ(cl.stats().bytes_staged, 23 * 64u);
  // Rows [33, 35): inside one block, staged.
  ASSERT_TRUE(cl.Pull(1, RowRange{33, 2}, std::span(out).first(2 * 16)).ok());
  ids = {33, 34};
  expect_rows(1, 16, ids, out);
  EXPECT_EQ(cl.stats().bytes_staged, 25 * 64u);
  EXPECT_EQ(cl.stats().zero_copy_calls, 2u);
  // Scattered 1 KiB rows: in place.
  ids = {5, 0, 3, 3};
  ASSERT_TRUE(cl.Pull(2, ids, std::span(out).first(ids.size() * 256)).ok());
  expect_rows(2, 256, ids, out);
  EXPECT_EQ(cl.stats().bytes_staged, 25 * 64u);
  EXPECT_EQ(cl.stats().zero_copy_calls, 3u);
}

// Staging that holds a single block: every pull still completes, one block
// (or one run of header slots) per batch, staged or in place.
TEST_P(PsTest, StagingOfOneBlockStillPullsEverything) {
  const auto init = Initializer::Uniform(-1.0f, 1.0f, 3);
  TableOptions dense = MakeTable(1, "dense", 300, 16, kAsp, init);  // blocks of 32 rows
  dense.layout = RowLayout::kDense;
  TableOptions inl = MakeTable(2, "inline", 300, 16, kAsp, init);
  inl.layout = RowLayout::kInline;  // 9.4 KiB per shard: blocks of 32 rows too
  TableOptions wide = MakeTable(3, "wide", 20, 300, kAsp, init);  // 1200-byte rows
  auto c = StartCluster(transport(), 2, 1, {dense, inl, wide}, 8,
                        [](ClientOptions& o) { o.staging_bytes = 1; });
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<float> registered(300 * 300);
  ASSERT_TRUE(cl.RegisterBuffer(registered).ok());
  std::vector<float> plain(300 * 300), want(300);
  for (std::uint32_t table : {1u, 2u, 3u}) {
    const std::uint32_t dim = table == 3 ? 300 : 16;
    const std::uint64_t rows = table == 3 ? 20 : 300;
    std::vector<std::uint64_t> ids;
    for (std::uint64_t r = rows; r-- > 0;) ids.push_back(r * 7 % rows);
    for (std::vector<float>* out : {&plain, &registered}) {
      const std::span<float> range(out->data(), (rows - 3) * dim);
      ASSERT_TRUE(cl.Pull(table, RowRange{1, rows - 3}, range).ok()) << table;
      for (std::uint64_t r = 1; r < rows - 2; ++r) {
        internal::InitRow(init, table, r, want.data(), dim);
        for (std::uint32_t d = 0; d < dim; ++d) ASSERT_EQ(range[(r - 1) * dim + d], want[d]);
      }
      const std::span<float> scattered(out->data(), ids.size() * dim);
      ASSERT_TRUE(cl.Pull(table, ids, scattered).ok()) << table;
      for (std::size_t k = 0; k < ids.size(); ++k) {
        internal::InitRow(init, table, ids[k], want.data(), dim);
        for (std::uint32_t d = 0; d < dim; ++d) ASSERT_EQ(scattered[k * dim + d], want[d]);
      }
    }
  }
}

// Range pushes that start and end inside blocks, small and large enough to
// be applied on several cores, reseal every block they touch: the next pull
// verifies (a stale header would read torn until the deadline) and sees
// exactly the pushed rows changed.
TEST_P(PsTest, RangePushesResealEveryBlockTheyTouch) {
  // 64-byte rows, blocks of 32; 8192 x 16 floats is over the parallel apply
  // threshold.
  for (RowLayout layout : {RowLayout::kDense, RowLayout::kInline}) {
    TableOptions table = MakeTable(1, "w", 8192, 16, kAsp, Initializer::Constant(1.0f));
    table.layout = layout;
    table.optimizer = OptimizerOptions::Sgd(1.0f);
    auto c = StartCluster(transport(), 1, 1, {table}, 8,
                          [](ClientOptions& o) { o.wait_timeout = std::chrono::seconds(5); });
    ASSERT_EQ(c.clients.size(), 1u);
    Client& cl = *c.clients[0];
    std::vector<float> want(8192 * 16, 1.0f), out(8192 * 16);
    for (RowRange r : {RowRange{20, 30}, RowRange{5, 8180}, RowRange{8191, 1}}) {
      std::vector<float> g(r.count * 16, -1.0f);
      ASSERT_TRUE(cl.Push(1, r, g).ok());
      for (std::uint64_t i = r.begin * 16; i < (r.begin + r.count) * 16; ++i) want[i] += 1.0f;
      ASSERT_TRUE(cl.Pull(1, RowRange{0, 8192}, out).ok()) << RowLayoutName(layout);
      ASSERT_EQ(out, want) << RowLayoutName(layout) << " after pushing [" << r.begin << ", "
                           << r.begin + r.count << ")";
    }
    EXPECT_EQ(cl.stats().torn_retries, 0u);
  }
}

TEST_P(PsTest, InlineTablePullsPushesAndReportsItsLayout) {
  const auto init = Initializer::Uniform(-1.0f, 1.0f, 5);
  auto c = StartCluster(transport(), 3, 1,
                        {InlineTable(7, "emb", 10, 5, init), MakeTable(8, "d", 3, 2)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  auto info = cl.FindTable("emb");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->layout, RowLayout::kInline);
  EXPECT_EQ(cl.FindTable("d")->layout, RowLayout::kDense);
  std::vector<float> out(10 * 5), want(5);
  ASSERT_TRUE(cl.Pull(7, RowRange{0, 10}, out).ok());
  for (std::uint64_t r = 0; r < 10; ++r) {
    internal::InitRow(init, 7, r, want.data(), 5);
    for (int k = 0; k < 5; ++k) ASSERT_EQ(out[r * 5 + k], want[k]) << "row " << r;
  }
  // Scattered pull with repeats, range and scattered pushes.
  std::vector<std::uint64_t> ids = {9, 0, 4, 4, 3};
  std::vector<float> g(ids.size() * 5, -1.0f), range_g(10 * 5, -2.0f);
  ASSERT_TRUE(cl.Push(7, ids, g).ok());
  ASSERT_TRUE(cl.Push(7, RowRange{0, 10}, range_g).ok());
  std::vector<float> sc(ids.size() * 5);
  ASSERT_TRUE(cl.RegisterBuffer(sc).ok());  // rows under 1 KiB: staged all the same
  ASSERT_TRUE(cl.Pull(7, ids, sc).ok());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const float times = static_cast<float>(std::count(ids.begin(), ids.end(), ids[i]));
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(sc[i * 5 + k], out[ids[i] * 5 + k] + 2.0f + times) << i;
    }
  }
  // Staged: both pulls (rows this small always are) and both pushes
  // (unregistered buffers).
  EXPECT_EQ(cl.stats().bytes_staged, 2 * (10 + ids.size()) * 5 * sizeof(float));
  EXPECT_EQ(cl.stats().zero_copy_calls, 0u);
  // Every server holds its rows where ReadLocal finds them.
  for (std::uint32_t s = 0; s < 3; ++s) {
    const auto shard = internal::PartitionOf(10, 3, s);
    std::vector<float> local;
    ASSERT_TRUE(c.servers[s]->ReadLocal(7, RowRange{shard.begin, shard.count}, &local).ok());
    ASSERT_EQ(local.size(), shard.count * 5);
  }
}

TEST_P(PsTest, FastPushersAreFlowControlledAndEveryPushAppliesOnce) {
  constexpr int kWorkers = 3, kPushes = 400;
  auto c = StartCluster(transport(), 2, kWorkers, {MakeTable(1, "ctr", 5, 3)}, /*push_slots=*/2);
  ASSERT_EQ(c.clients.size(), static_cast<std::size_t>(kWorkers));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> g(5 * 3, -1.0f);
      std::vector<std::uint64_t> ids = {0, 4};
      std::vector<float> g2(2 * 3, -1.0f);
      for (int i = 0; i < kPushes; ++i) {
        Status s = (i % 2 == 0) ? c.clients[w]->Push(1, RowRange{0, 5}, g)
                                : c.clients[w]->Push(1, ids, g2);
        if (!s.ok()) {
          ADD_FAILURE() << s;
          ++failures;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  // Each client's own pull waits for its pushes; pull from every client.
  std::vector<float> out(5 * 3);
  for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(c.clients[w]->Pull(1, RowRange{0, 5}, out).ok());
  const float range_pushes = kWorkers * kPushes / 2.0f;
  for (int r = 0; r < 5; ++r) {
    const float want = range_pushes + ((r == 0 || r == 4) ? range_pushes : 0.0f);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(out[r * 3 + k], want) << "row " << r;
  }
  std::uint64_t applied = 0, errors = 0, credit_waits = 0;
  for (auto& s : c.servers) {
    applied += s->stats().pushes_applied;
    errors += s->stats().protocol_errors;
  }
  for (auto& cl : c.clients) credit_waits += cl->stats().credit_waits;
  EXPECT_EQ(applied, static_cast<std::uint64_t>(kWorkers) * kPushes * 2);  // 2 servers each
  EXPECT_EQ(errors, 0u);
  // On fake the apply thread lags the pushers every run, so the rings run
  // dry; on tcp and verbs each push's credit refresh READ often gives the
  // server time to catch up, and whether a ring ever runs dry is timing.
  if (transport() == "fake") {
    EXPECT_GT(credit_waits, 0u) << "a 2-slot ring never ran out of credits";
  }
}

TEST_P(PsTest, ClockBarrierAndStats) {
  constexpr int kWorkers = 3;
  auto c = StartCluster(transport(), 2, kWorkers, {MakeTable(1, "w", 6, 2, 0)});
  ASSERT_EQ(c.clients.size(), static_cast<std::size_t>(kWorkers));
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> g(6 * 2, -1.0f), out(6 * 2);
      for (int it = 0; it < 5; ++it) {
        ASSERT_TRUE(c.clients[w]->Pull(1, RowRange{0, 6}, out).ok());
        // BSP: at clock it, every worker's pushes of iterations < it are in.
        ASSERT_GE(out[0], static_cast<float>(kWorkers * it));
        ASSERT_TRUE(c.clients[w]->Push(1, RowRange{0, 6}, g).ok());
        auto clk = c.clients[w]->Clock();
        ASSERT_TRUE(clk.ok()) << clk.status();
        ASSERT_EQ(*clk, static_cast<std::uint64_t>(it + 1));
        ASSERT_TRUE(c.clients[w]->Barrier().ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& cl : c.clients) {
    EXPECT_EQ(cl->clock(), 5u);
    EXPECT_LE(cl->stats().staleness_max, 0u);  // BSP: never stale
    EXPECT_EQ(cl->stats().staleness_samples, 5u);
  }
  for (auto& cl : c.clients) ASSERT_TRUE(cl->Close().ok());
  for (auto& s : c.servers) {
    EXPECT_TRUE(s->RunUntil(std::chrono::steady_clock::now() + std::chrono::seconds(10)).ok());
    EXPECT_EQ(s->stats().clocks_applied, 15u);
    EXPECT_EQ(s->stats().workers_done, 3u);
    EXPECT_TRUE(s->stats().dead_workers.empty());
  }
}

TEST_P(PsTest, BspPullTimesOutNamingTheLaggingWorker) {
  auto c = StartCluster(transport(), 1, 2, {MakeTable(1, "w", 4, 1, 0)}, 8, [](ClientOptions& o) {
    o.wait_timeout = std::chrono::milliseconds(300);
    o.clock_waits = false;  // this test is about the pull's wait
  });
  ASSERT_EQ(c.clients.size(), 2u);
  Client& w0 = *c.clients[0];
  ASSERT_TRUE(w0.Clock().ok());
  // Worker 1 never clocks: worker 0's pull at clock 1 must wait for it.
  std::vector<float> out(4);
  Status s = w0.Pull(1, RowRange{0, 4}, out);
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s;
  EXPECT_NE(s.message().find("worker 1 (clock 0)"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("worker 0 ("), std::string::npos) << s;
  EXPECT_GT(w0.stats().blocked_time.count(), 0);
  EXPECT_EQ(w0.stats().pull_waits, 1u);
  // Once worker 1 clocks, the pull goes through.
  ASSERT_TRUE(c.clients[1]->Clock().ok());
  EXPECT_TRUE(w0.Pull(1, RowRange{0, 4}, out).ok());
}

TEST_P(PsTest, ClockHoldsAWorkerWithinTheStalenessBound) {
  // Staleness 1: worker 0 may finish clock 1 while worker 1 is at 0, but not
  // clock 2 - even though it never pulls.
  auto c =
      StartCluster(transport(), 2, 2, {MakeTable(1, "w", 4, 1, 1), MakeTable(2, "v", 4, 1, kAsp)},
                   8, [](ClientOptions& o) { o.wait_timeout = std::chrono::milliseconds(1000); });
  ASSERT_EQ(c.clients.size(), 2u);
  Client& w0 = *c.clients[0];
  Client& w1 = *c.clients[1];
  auto clk = w0.Clock();
  ASSERT_TRUE(clk.ok()) << clk.status();
  EXPECT_EQ(w0.stats().pull_waits, 0u);
  auto late = w0.Clock();
  ASSERT_EQ(late.status().code(), StatusCode::kTimedOut) << late.status();
  EXPECT_NE(late.status().message().find("worker 1 (clock 0)"), std::string::npos) << late.status();
  EXPECT_NE(late.status().message().find("staleness bound 1"), std::string::npos) << late.status();
  // The clock did advance (the servers know it); the wait is what failed.
  EXPECT_EQ(w0.clock(), 2u);
  // Once worker 1 catches up, worker 0's next Clock (to 3) waits for worker 1
  // to reach 2; run it on another thread and release it.
  ASSERT_TRUE(w1.Clock().ok());
  auto next = std::async(std::launch::async, [&] { return w0.Clock(); });
  ASSERT_TRUE(w1.Clock().ok());
  auto third = next.get();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*third, 3u);
}

// Interrupt() until `call` is ready (the first may come before the call
// began, which it does not affect); false when it is not within 10 s.
template <typename T>
bool InterruptUntilReady(Client& client, std::future<T>& call) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (call.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    client.Interrupt();
  }
  return true;
}

TEST_P(PsTest, InterruptCutsWaitsShortAndTheClientStaysUsable) {
  // SSP 1, worker 1 a straggler at clock 0; wait_timeout far above the
  // 10 s InterruptUntilReady allows, so only Interrupt() can end the waits.
  auto c = StartCluster(transport(), 2, 2, {MakeTable(1, "w", 4, 1, 1)}, 8, [](ClientOptions& o) {
    o.wait_timeout = std::chrono::seconds(60);
    o.clock_waits = false;
  });
  ASSERT_EQ(c.clients.size(), 2u);
  Client& w0 = *c.clients[0];
  Client& w1 = *c.clients[1];
  ASSERT_TRUE(w0.Clock().ok());
  ASSERT_TRUE(w0.Clock().ok());
  std::vector<float> out(4);
  auto pull = std::async(std::launch::async, [&] { return w0.Pull(1, RowRange{0, 4}, out); });
  ASSERT_TRUE(InterruptUntilReady(w0, pull)) << "Interrupt() did not end the pull's wait";
  Status s = pull.get();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find("pulling table 'w'"), std::string::npos) << s;
  EXPECT_EQ(w0.stats().pull_waits, 1u);  // the slices of one wait count once

  // Nothing is sticky: an Interrupt() with no call in progress changes
  // nothing, and once the straggler catches up the pull goes through.
  w0.Interrupt();
  ASSERT_TRUE(w1.Clock().ok());
  ASSERT_TRUE(w0.Pull(1, RowRange{0, 4}, out).ok());

  // A Barrier() interrupted after worker 0 arrived: its next Barrier()
  // resumes it (one arrival), so the two workers stay paired.
  auto barrier = std::async(std::launch::async, [&] { return w0.Barrier(); });
  ASSERT_TRUE(InterruptUntilReady(w0, barrier)) << "Interrupt() did not end the barrier's wait";
  s = barrier.get();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s;
  EXPECT_NE(s.message().find("arrived"), std::string::npos) << s;
  ASSERT_TRUE(w1.Barrier().ok());  // worker 0 has arrived: no wait
  ASSERT_TRUE(w0.Barrier().ok());  // resumed: the barrier is complete
  for (int round = 0; round < 2; ++round) {
    auto other = std::async(std::launch::async, [&] { return w1.Barrier(); });
    ASSERT_TRUE(w0.Barrier().ok());
    ASSERT_TRUE(other.get().ok());
  }
  for (auto& cl : c.clients) ASSERT_TRUE(cl->Close().ok());
}

TEST_P(PsTest, BspClockIsALockstep) {
  constexpr int kWorkers = 3, kClocks = 20;
  auto c = StartCluster(transport(), 2, kWorkers, {MakeTable(1, "w", 4, 1, 0)});
  ASSERT_EQ(c.clients.size(), static_cast<std::size_t>(kWorkers));
  // After Clock() returns c on any worker, every server has seen clock >= c
  // from every worker: check it through the servers' stats.
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 1; i <= kClocks; ++i) {
        auto clk = c.clients[w]->Clock();
        ASSERT_TRUE(clk.ok()) << clk.status();
        for (auto& s : c.servers) {
          if (s->stats().min_clock < *clk) ++violations;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
}

TEST_P(PsTest, AsyncHandlesAndCallbacks) {
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "w", 9, 3)});
  ASSERT_EQ(c.clients.size(), 1u);
  Client& cl = *c.clients[0];
  std::vector<float> g(9 * 3, -2.0f), out(9 * 3);
  Handle h = cl.PushAsync(1, RowRange{0, 9}, g);
  Handle p = cl.PullAsync(1, RowRange{0, 9}, out);  // runs after the push
  ASSERT_TRUE(h.WaitFor(std::chrono::seconds(10)).ok());
  ASSERT_TRUE(p.WaitFor(std::chrono::seconds(10)).ok());
  EXPECT_TRUE(p.done());
  for (float v : out) EXPECT_EQ(v, 2.0f);
  std::promise<Status> done;
  cl.PullAsync(1, RowRange{0, 9}, out, [&](const Status& s) { done.set_value(s); });
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(fut.get().ok());
  // Argument errors arrive through the handle too.
  Handle bad = cl.PullAsync(7, RowRange{0, 1}, out);
  EXPECT_EQ(bad.WaitFor(std::chrono::seconds(10)).code(), StatusCode::kInvalidArgument);
  // PushPull, and the scattered forms with callbacks.
  std::vector<float> g2(9 * 3, -1.0f), out2(9 * 3);
  Handle pp = cl.PushPullAsync(1, RowRange{0, 9}, g2, out2);
  ASSERT_TRUE(pp.WaitFor(std::chrono::seconds(10)).ok());
  for (float v : out2) EXPECT_EQ(v, 3.0f);  // sees its own push
  const std::vector<std::uint64_t> ids = {8, 1, 8};
  std::vector<float> gi(3 * 3, -1.0f), oi(3 * 3);
  std::promise<Status> pushed, pulled, both;
  cl.PushAsync(1, ids, gi, [&](const Status& s) { pushed.set_value(s); });
  cl.PullAsync(1, ids, oi, [&](const Status& s) { pulled.set_value(s); });
  cl.PushPullAsync(1, RowRange{0, 9}, g2, out2, [&](const Status& s) { both.set_value(s); });
  for (std::promise<Status>* pr : {&pushed, &pulled, &both}) {
    auto f = pr->get_future();
    ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
  }
  EXPECT_EQ(oi[0], 5.0f);  // row 8: 3, then twice +1
  EXPECT_EQ(oi[3], 4.0f);  // row 1
  EXPECT_EQ(out2[8 * 3], 6.0f);
  EXPECT_EQ(out2[1 * 3], 5.0f);
  EXPECT_TRUE(cl.FlushAsync().WaitFor(std::chrono::seconds(10)).ok());
}

// rdmaps-server's signal thread and its main thread may both call Stop() while
// Run() is blocked; once both return, Run() must have returned too.
TEST_P(PsTest, StopFromSeveralThreadsAtOnceEndsRun) {
  auto c = StartCluster(transport(), 1, 1, {MakeTable(1, "w", 4, 1)});
  ASSERT_EQ(c.clients.size(), 1u);
  Server& server = *c.servers[0];
  std::latch started(3);
  std::thread runner([&] {
    started.arrive_and_wait();
    EXPECT_TRUE(server.Run().ok());
  });
  std::vector<std::thread> stoppers;
  for (int i = 0; i < 2; ++i) {
    stoppers.emplace_back([&] {
      started.arrive_and_wait();
      server.Stop();
    });
  }
  for (auto& t : stoppers) t.join();
  runner.join();
  server.Stop();  // and once more, idempotent
}

TEST_P(PsTest, ServerOptimizersKeepStatePerRow) {
  // Adam through the whole server path (state indexed per row, per shard)
  // against the same optimizer applied locally.
  const auto adam = OptimizerOptions::Adam(0.05f);
  const auto init = Initializer::Normal(0.0f, 1.0f, 3);
  auto c = StartCluster(transport(), 2, 1, {MakeTable(1, "a", 5, 3, kAsp, init, adam)});
  ASSERT_EQ(c.clients.size(), 1u);
  std::vector<float> want(5 * 3);
  for (std::uint64_t r = 0; r < 5; ++r) internal::InitRow(init, 1, r, want.data() + r * 3, 3);
  internal::Optimizer opt(adam, 3);
  std::vector<float> state(5 * opt.state_floats());
  for (int r = 0; r < 5; ++r) opt.InitState(state.data() + r * opt.state_floats());
  auto apply_local = [&](std::uint64_t r, const float* g) {
    opt.Apply(want.data() + r * 3, state.data() + r * opt.state_floats(), g);
  };
  std::vector<float> g(5 * 3);
  for (int step = 0; step < 4; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.1f * static_cast<float>(i + step) - 0.5f;
    ASSERT_TRUE(c.clients[0]->Push(1, RowRange{0, 5}, g).ok());
    for (std::uint64_t r = 0; r < 5; ++r) apply_local(r, g.data() + r * 3);
    std::vector<std::uint64_t> ids = {4, 1, 4};
    ASSERT_TRUE(c.clients[0]->Push(1, ids, std::span<const float>(g.data(), 9)).ok());
    for (std::size_t i = 0; i < ids.size(); ++i) apply_local(ids[i], g.data() + i * 3);
  }
  std::vector<float> out(5 * 3);
  ASSERT_TRUE(c.clients[0]->Pull(1, RowRange{0, 5}, out).ok());
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_FLOAT_EQ(out[i], want[i]) << i;
}

}  // namespace
}  // namespace rdmaps::testing

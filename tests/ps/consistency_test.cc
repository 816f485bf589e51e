// Consistency on the fake backend.
//
// SspModelCheck: a single seeded driver thread interleaves the steps of
// several workers at random (push, async pull, clock, close). A pull stays
// pending while the client blocks on its staleness bound, and its worker gets
// no further steps until it completes, so every schedule the seed picks is a
// legal execution. Every pull is checked against a model of all pushes:
//   lower bound: every push by another worker at clock <= c - s - 1, plus
//                every push by the puller itself (read-my-writes);
//   upper bound: every push issued so far.
// Each push adds exactly 1.0 (SGD, lr 1, gradient -1), so a row's value counts
// the pushes applied to it.
//
// BspMatchesSingleProcessReference: 3 workers train linear regression under
// BSP; the result equals plain single-process full-batch gradient descent.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/ps/ps_test_util.h"

namespace rdmaps {
namespace {

using testing::MakeTable;
using testing::StartCluster;

struct PendingPull {
  Handle handle;
  RowRange range;
  std::uint64_t clock = 0;
  std::vector<std::uint64_t> lower;  // per row of the range
  std::vector<float> out;
};

// Returns how many pulls had to wait (so the caller can check the schedule
// exercised blocking).
std::uint64_t RunModelCheck(std::uint32_t staleness, std::uint32_t seed) {
  constexpr std::uint32_t kWorkers = 3, kServers = 2, kRows = 6, kDim = 2, kClocks = 6;
  // One thread drives every worker, so only pulls may wait (a Clock() that
  // waits for the others would wait for this very thread).
  auto c = StartCluster("fake", kServers, kWorkers, {MakeTable(1, "t", kRows, kDim, staleness)},
                        4, [](ClientOptions& o) { o.clock_waits = false; });
  EXPECT_EQ(c.clients.size(), kWorkers);
  if (c.clients.size() != kWorkers) return 0;
  std::mt19937 rng(seed);
  // pushed[w][clock][row]: pushes of worker w at that clock to that row.
  std::vector<std::vector<std::vector<std::uint64_t>>> pushed(
      kWorkers, std::vector<std::vector<std::uint64_t>>(kClocks + 1,
                                                        std::vector<std::uint64_t>(kRows, 0)));
  std::vector<std::uint64_t> total(kRows, 0);
  std::vector<std::uint64_t> clock(kWorkers, 0);
  std::vector<bool> finished(kWorkers, false);
  std::vector<std::unique_ptr<PendingPull>> pending(kWorkers);
  std::uint64_t pulls_checked = 0;

  auto lower_bound = [&](std::uint32_t w, std::uint64_t row) {
    std::uint64_t lb = 0;
    for (std::uint32_t v = 0; v < kWorkers; ++v) {
      for (std::uint64_t k = 0; k <= kClocks; ++k) {
        const bool visible = v == w || (staleness != kAsp && k + staleness + 1 <= clock[w]);
        if (visible) lb += pushed[v][k][row];
      }
    }
    return lb;
  };
  auto check_done = [&](std::uint32_t w) {
    PendingPull& p = *pending[w];
    Status s = p.handle.Wait(std::chrono::steady_clock::now());
    EXPECT_TRUE(s.ok()) << "worker " << w << ": " << s;
    for (std::uint64_t i = 0; i < p.range.count; ++i) {
      const std::uint64_t row = p.range.begin + i;
      const float v = p.out[i * kDim];
      EXPECT_EQ(v, p.out[i * kDim + 1]) << "torn row";
      EXPECT_EQ(v, std::floor(v));
      EXPECT_GE(v, static_cast<float>(p.lower[i]))
          << "seed " << seed << " staleness " << staleness << ": worker " << w << " at clock "
          << p.clock << " read row " << row << " missing updates it must see";
      EXPECT_LE(v, static_cast<float>(total[row])) << "row " << row << " has phantom updates";
    }
    ++pulls_checked;
    pending[w].reset();
  };

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    for (std::uint32_t w = 0; w < kWorkers; ++w) {
      if (pending[w] && pending[w]->handle.done()) check_done(w);
    }
    std::vector<std::uint32_t> ready;
    bool any_pending = false;
    for (std::uint32_t w = 0; w < kWorkers; ++w) {
      if (pending[w]) any_pending = true;
      else if (!finished[w]) ready.push_back(w);
    }
    if (ready.empty() && !any_pending) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "no progress: every live worker is blocked (SSP deadlock?)";
      break;
    }
    if (ready.empty()) {
      for (std::uint32_t w = 0; w < kWorkers; ++w) {
        if (pending[w]) (void)pending[w]->handle.WaitFor(std::chrono::milliseconds(1));
      }
      continue;
    }
    const std::uint32_t w = ready[rng() % ready.size()];
    Client& cl = *c.clients[w];
    const int action = static_cast<int>(rng() % 100);
    if (clock[w] == kClocks) {
      EXPECT_TRUE(cl.Close().ok());
      finished[w] = true;
    } else if (action < 45) {
      std::vector<std::uint64_t> ids = {rng() % kRows};
      if (rng() % 2) ids.push_back(rng() % kRows);
      std::vector<float> g(ids.size() * kDim, -1.0f);
      Status s = cl.Push(1, ids, g);
      EXPECT_TRUE(s.ok()) << s;
      for (auto id : ids) {
        ++pushed[w][clock[w]][id];
        ++total[id];
      }
    } else if (action < 80) {
      auto p = std::make_unique<PendingPull>();
      const std::uint64_t b = rng() % kRows;
      p->range = {b, 1 + rng() % (kRows - b)};
      p->clock = clock[w];
      for (std::uint64_t i = 0; i < p->range.count; ++i) {
        p->lower.push_back(lower_bound(w, p->range.begin + i));
      }
      p->out.resize(p->range.count * kDim);
      p->handle = cl.PullAsync(1, p->range, p->out);
      pending[w] = std::move(p);
    } else {
      auto r = cl.Clock();
      EXPECT_TRUE(r.ok()) << r.status();
      ++clock[w];
    }
  }
  std::uint64_t waits = 0;
  for (auto& cl : c.clients) {
    const ClientStats st = cl->stats();
    waits += st.pull_waits;
    if (staleness != kAsp) {
      EXPECT_LE(st.staleness_max, staleness) << "a pull saw a min clock further behind than allowed";
    }
  }
  EXPECT_GT(pulls_checked, 5u);
  return waits;
}

TEST(ConsistencyTest, SspModelCheckBsp) {
  std::uint64_t waits = 0;
  for (std::uint32_t seed = 1; seed <= 8; ++seed) waits += RunModelCheck(0, seed);
  EXPECT_GT(waits, 0u) << "no schedule made a pull wait: the check exercised nothing";
}

TEST(ConsistencyTest, SspModelCheckStaleness1) {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) RunModelCheck(1, seed);
}

TEST(ConsistencyTest, SspModelCheckStaleness2) {
  for (std::uint32_t seed = 1; seed <= 8; ++seed) RunModelCheck(2, seed);
}

TEST(ConsistencyTest, SspModelCheckAsp) {
  std::uint64_t waits = 0;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) waits += RunModelCheck(kAsp, seed);
  // ASP pulls wait only for their own pushes to land (read-my-writes).
  (void)waits;
}

// ---- BSP vs single-process reference ---------------------------------------------

struct Data {
  std::vector<std::vector<float>> x;  // per worker: samples x features
  std::vector<std::vector<float>> y;
};

constexpr int kFeatures = 5, kSamplesPerWorker = 24;

Data MakeData(int workers) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float w_true[kFeatures] = {1.0f, -2.0f, 3.0f, 0.5f, -1.0f};
  Data d;
  for (int w = 0; w < workers; ++w) {
    d.x.emplace_back();
    d.y.emplace_back();
    for (int i = 0; i < kSamplesPerWorker; ++i) {
      float y = 0;
      for (int f = 0; f < kFeatures; ++f) {
        const float v = nd(rng);
        d.x[w].push_back(v);
        y += v * w_true[f];
      }
      d.y[w].push_back(y);
    }
  }
  return d;
}

// Gradient of 0.5 * sum (x.w - y)^2 / total_samples over one worker's shard.
std::vector<float> Gradient(const Data& d, int w, const std::vector<float>& params, int total) {
  std::vector<float> g(kFeatures, 0.0f);
  for (int i = 0; i < kSamplesPerWorker; ++i) {
    float err = -d.y[w][i];
    for (int f = 0; f < kFeatures; ++f) err += d.x[w][i * kFeatures + f] * params[f];
    for (int f = 0; f < kFeatures; ++f) g[f] += err * d.x[w][i * kFeatures + f] / total;
  }
  return g;
}

TEST(ConsistencyTest, BspMatchesSingleProcessReference) {
  constexpr int kWorkers = 3, kIters = 25;
  constexpr float kLr = 0.3f;
  const Data data = MakeData(kWorkers);
  const int total = kWorkers * kSamplesPerWorker;
  // Parameters as a table of kFeatures rows x 1 float: spans both servers.
  auto c = StartCluster("fake", 2, kWorkers,
                        {MakeTable(1, "w", kFeatures, 1, kBsp, Initializer::Zeros(),
                                   OptimizerOptions::Sgd(kLr))});
  ASSERT_EQ(c.clients.size(), static_cast<std::size_t>(kWorkers));
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> final_w(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      Client& cl = *c.clients[w];
      std::vector<float> params(kFeatures);
      for (int it = 0; it < kIters; ++it) {
        ASSERT_TRUE(cl.Pull(1, RowRange{0, kFeatures}, params).ok());
        // Everyone has read iteration it's parameters before anyone pushes.
        ASSERT_TRUE(cl.Barrier().ok());
        auto g = Gradient(data, w, params, total);
        ASSERT_TRUE(cl.Push(1, RowRange{0, kFeatures}, g).ok());
        ASSERT_TRUE(cl.Clock().ok());
      }
      ASSERT_TRUE(cl.Pull(1, RowRange{0, kFeatures}, params).ok());
      final_w[w] = params;
    });
  }
  for (auto& t : threads) t.join();
  // Reference: the same full-batch gradient descent in one process.
  std::vector<float> ref(kFeatures, 0.0f);
  for (int it = 0; it < kIters; ++it) {
    std::vector<std::vector<float>> gs;
    for (int w = 0; w < kWorkers; ++w) gs.push_back(Gradient(data, w, ref, total));
    for (int w = 0; w < kWorkers; ++w) {
      for (int f = 0; f < kFeatures; ++f) ref[f] -= kLr * gs[w][f];
    }
  }
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(final_w[w].size(), static_cast<std::size_t>(kFeatures));
    for (int f = 0; f < kFeatures; ++f) {
      EXPECT_NEAR(final_w[w][f], ref[f], 1e-4f) << "worker " << w << " feature " << f;
    }
  }
  EXPECT_NEAR(ref[2], 3.0f, 0.5f) << "reference did not converge; test data broken";
}

}  // namespace
}  // namespace rdmaps

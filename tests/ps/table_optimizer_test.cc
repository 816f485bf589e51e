// rdmaps::TableOptimizer: the servers' optimizer over rows the caller holds,
// with per-row state.
#include "rdmaps/table_optimizer.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "src/ps/optimizer.h"

namespace rdmaps {
namespace {

TableOptions Table(const OptimizerOptions& o, std::uint64_t rows, std::uint32_t dim) {
  TableOptions t;
  t.id = 1;
  t.name = "t";
  t.rows = rows;
  t.dim = dim;
  t.optimizer = o;
  return t;
}

TEST(TableOptimizerTest, SgdStepIsLearningRateTimesGradient) {
  auto opt = TableOptimizer::Create(Table(OptimizerOptions::Sgd(0.5f), 1, 2));
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p = {1.0f, 2.0f};
  const std::vector<float> g = {2.0f, -4.0f};
  ASSERT_TRUE((*opt)->Apply(RowRange{0, 1}, g, p).ok());
  EXPECT_FLOAT_EQ(p[0], 0.0f);
  EXPECT_FLOAT_EQ(p[1], 4.0f);
}

// Every row keeps its own state: steps on overlapping ranges give exactly
// what the servers' internal::Optimizer gives row by row.
TEST(TableOptimizerTest, SameBitsAsTheServersOptimizerRowByRow) {
  constexpr std::uint64_t kRows = 6;
  constexpr std::uint32_t kDim = 5;
  for (const OptimizerOptions& o :
       {OptimizerOptions::Sgd(0.1f), OptimizerOptions::Momentum(0.05f),
        OptimizerOptions::Adagrad(0.1f), OptimizerOptions::Adam(0.01f)}) {
    SCOPED_TRACE(OptimizerKindName(o.kind));
    auto opt = TableOptimizer::Create(Table(o, kRows, kDim));
    ASSERT_TRUE(opt.ok()) << opt.status();
    const internal::Optimizer ref(o, kDim);
    const std::size_t sf = ref.state_floats();
    std::vector<float> ref_state(kRows * sf);
    for (std::uint64_t r = 0; r < kRows; ++r) ref.InitState(ref_state.data() + r * sf);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> w(kRows * kDim);
    for (float& x : w) x = nd(rng);
    std::vector<float> want = w;
    for (int step = 0; step < 5; ++step) {
      for (const RowRange range : {RowRange{1, 3}, RowRange{0, kRows}, RowRange{5, 1}}) {
        std::vector<float> g(range.count * kDim);
        for (float& x : g) x = nd(rng);
        ASSERT_TRUE((*opt)
                        ->Apply(range, g,
                                std::span<float>(w).subspan(range.begin * kDim, range.count * kDim))
                        .ok());
        for (std::uint64_t i = 0; i < range.count; ++i) {
          const std::uint64_t r = range.begin + i;
          ref.Apply(want.data() + r * kDim, sf ? ref_state.data() + r * sf : nullptr,
                    g.data() + i * kDim);
        }
      }
    }
    EXPECT_EQ(w, want);
  }
}

TEST(TableOptimizerTest, RefusesBadTablesSizesAndRows) {
  auto bad = Table(OptimizerOptions::Adam(0.01f), 4, 2);
  bad.optimizer.beta1 = 1.0f;
  EXPECT_EQ(TableOptimizer::Create(bad).status().code(), StatusCode::kInvalidArgument);
  auto opt = TableOptimizer::Create(Table(OptimizerOptions::Sgd(1.0f), 4, 2));
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> p(4, 1.0f), g(4, 1.0f), three(3);
  EXPECT_EQ((*opt)->Apply(RowRange{3, 2}, g, p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->Apply(RowRange{0, 2}, three, p).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*opt)->Apply(RowRange{5, 0}, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p, std::vector<float>(4, 1.0f)) << "a refused Apply changed the rows";
  EXPECT_TRUE((*opt)->Apply(RowRange{2, 2}, g, p).ok());
  EXPECT_EQ(p, std::vector<float>(4, 0.0f));
}

}  // namespace
}  // namespace rdmaps

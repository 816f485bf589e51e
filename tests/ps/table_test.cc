// The public functions of rdmaps/table.h: enum names both ways, and
// InitializeRows against the servers' initializer.
#include "rdmaps/table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "src/ps/initializer.h"

namespace rdmaps {
namespace {

using ::testing::HasSubstr;

TEST(TableNamesTest, EveryNameParsesBackToItsValue) {
  for (auto k : {Initializer::Kind::kZeros, Initializer::Kind::kConstant,
                 Initializer::Kind::kUniform, Initializer::Kind::kNormal}) {
    EXPECT_EQ(*ParseInitializerKind(InitializerKindName(k)), k) << InitializerKindName(k);
  }
  for (auto k : {OptimizerOptions::Kind::kSgd, OptimizerOptions::Kind::kMomentum,
                 OptimizerOptions::Kind::kAdagrad, OptimizerOptions::Kind::kAdam}) {
    EXPECT_EQ(*ParseOptimizerKind(OptimizerKindName(k)), k) << OptimizerKindName(k);
  }
  for (auto l : {RowLayout::kDense, RowLayout::kInline, RowLayout::kAuto}) {
    EXPECT_EQ(*ParseRowLayout(RowLayoutName(l)), l) << RowLayoutName(l);
  }
  EXPECT_STREQ(InitializerKindName(Initializer::Kind::kNormal), "normal");
  EXPECT_STREQ(OptimizerKindName(OptimizerOptions::Kind::kAdam), "adam");
  EXPECT_STREQ(RowLayoutName(RowLayout::kInline), "inline");
  EXPECT_STREQ(RowLayoutName(static_cast<RowLayout>(7)), "unknown");
}

TEST(TableNamesTest, UnknownNamesAreInvalidArgumentListingTheNames) {
  const Result<OptimizerOptions::Kind> o = ParseOptimizerKind("lamb");
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(),
              HasSubstr("optimizer kind 'lamb' is not sgd, momentum, adagrad or adam"));
  const Result<Initializer::Kind> i = ParseInitializerKind("Normal");  // case matters
  EXPECT_THAT(i.status().message(),
              HasSubstr("initializer kind 'Normal' is not zeros, constant, uniform or normal"));
  const Result<RowLayout> l = ParseRowLayout("");
  EXPECT_THAT(l.status().message(), HasSubstr("row layout '' is not dense, inline or auto"));
}

TEST(InitializeRowsTest, FillsRowsAsTheServersDo) {
  TableOptions t;
  t.id = 9;
  t.name = "emb";
  t.rows = 10;
  t.dim = 3;
  t.init = Initializer::Normal(0.5f, 2.0f, 4);
  std::vector<float> out(4 * 3);
  ASSERT_TRUE(InitializeRows(t, 6, out).ok());
  for (std::uint64_t r = 0; r < 4; ++r) {
    std::vector<float> want(3);
    internal::InitRow(t.init, t.id, 6 + r, want.data(), t.dim);
    EXPECT_EQ(std::vector<float>(out.begin() + 3 * r, out.begin() + 3 * (r + 1)), want) << r;
  }
}

TEST(InitializeRowsTest, RefusesPartRowsAndRowsPastTheTable) {
  TableOptions t;
  t.name = "w";
  t.rows = 4;
  t.dim = 2;
  std::vector<float> three(3), four(4);
  EXPECT_EQ(InitializeRows(t, 0, three).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(InitializeRows(t, 3, four).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(InitializeRows(t, 5, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(InitializeRows(t, 2, four).ok());
  EXPECT_TRUE(InitializeRows(t, 4, {}).ok());
}

}  // namespace
}  // namespace rdmaps

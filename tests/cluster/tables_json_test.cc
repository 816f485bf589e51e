// The job's table list as JSON: round trip and malformed input.
#include "rdmaps/tables_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rdmaps/cluster.h"

namespace rdmaps {
namespace {

using ::testing::HasSubstr;

TEST(TablesJsonTest, RoundTrips) {
  TableOptions a;
  a.id = 3;
  a.name = "emb";
  a.rows = 1000;
  a.dim = 16;
  a.init = Initializer::Uniform(-0.5f, 0.5f, 7);
  a.optimizer = OptimizerOptions::Adam(0.01f);
  a.staleness = 2;
  a.layout = RowLayout::kInline;
  TableOptions b;
  b.id = 4;
  b.name = "bias";
  b.init = Initializer::Constant(1.5f);
  b.staleness = kAsp;
  TableOptions c = b;
  c.id = 5;
  c.name = "dense";
  c.layout = RowLayout::kDense;
  auto r = ParseTablesJson(TablesToJson({a, b, c}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 3u);
  const TableOptions& x = (*r)[0];
  EXPECT_EQ(x.id, 3u);
  EXPECT_EQ(x.name, "emb");
  EXPECT_EQ(x.rows, 1000u);
  EXPECT_EQ(x.dim, 16u);
  EXPECT_EQ(x.init.kind, Initializer::Kind::kUniform);
  EXPECT_FLOAT_EQ(x.init.low, -0.5f);
  EXPECT_EQ(x.init.seed, 7u);
  EXPECT_EQ(x.optimizer.kind, OptimizerOptions::Kind::kAdam);
  EXPECT_FLOAT_EQ(x.optimizer.learning_rate, 0.01f);
  EXPECT_EQ(x.staleness, 2u);
  EXPECT_EQ(x.layout, RowLayout::kInline);
  EXPECT_EQ((*r)[1].staleness, kAsp);
  EXPECT_EQ((*r)[1].layout, RowLayout::kAuto);  // the default
  EXPECT_EQ((*r)[2].layout, RowLayout::kDense);
  EXPECT_FLOAT_EQ((*r)[1].init.value, 1.5f);
}

TEST(TablesJsonTest, MinimalFormTakesDefaults) {
  auto r = ParseTablesJson(R"([{"name": "w", "rows": 4, "dim": 2, "staleness": "bsp"}])");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].id, 0u);
  EXPECT_EQ((*r)[0].staleness, kBsp);
  EXPECT_EQ((*r)[0].optimizer.kind, OptimizerOptions::Kind::kSgd);
}

TEST(TablesJsonTest, MalformedIsInvalidArgumentNamingThePart) {
  struct Case {
    const char* json;
    const char* message;
  } cases[] = {
      {"[{", "not valid JSON"},
      {R"({"tabels": []})", "unknown key \"tabels\""},
      {R"([{"name": "w", "rows": 0}])", "rows >= 1"},
      {R"([{"name": "w", "rows": 2, "dim": 1, "layout": "sparse"}])",
       "layout '\"sparse\"' is not \"dense\", \"inline\" or \"auto\""},
      {R"([{"name": "w", "rows": -3}])", "\"rows\" must be a non-negative integer, got '-3'"},
      {R"([{"name": "w", "dims": 3}])", "unknown key \"dims\""},
      {R"([{"name": "w", "optimizer": {"kind": "lamb"}}])", "kind 'lamb'"},
      {R"([{"name": "w", "init": {"kind": "xavier"}}])", "kind 'xavier'"},
      {R"([{"name": "w", "staleness": "ssp"}])", "staleness '\"ssp\"'"},
      {R"([{"name": "w"}, {"name": "w", "id": 1}])", "repeats name 'w'"},
      {R"([{"name": "a", "id": 1}, {"name": "b", "id": 1}])", "repeats id 1"},
  };
  for (const auto& c : cases) {
    auto r = ParseTablesJson(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.json;
  }
}

TEST(TablesJsonTest, DescribeTablesOnlyWhenAsked) {
  TableOptions t;
  t.name = "w";
  auto no = DescribeTablesIfAsked({t}, {});
  ASSERT_TRUE(no.ok());
  EXPECT_FALSE(*no);
  std::string path = ::testing::TempDir() + "rdmaps_describe_tables.json";
  auto yes = DescribeTablesIfAsked({t}, {{kDescribeTablesEnv, path}});
  ASSERT_TRUE(yes.ok()) << yes.status();
  EXPECT_TRUE(*yes);
  auto back = ReadTablesFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0].name, "w");
  auto missing = ReadTablesFile("/nonexistent/tables.json");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// The "checkpoint" object beside the list: parsed, applied to
// ServerOptions, and every bad value refused naming its key.
TEST(TablesJsonTest, CheckpointSettingsParseAndApply) {
  const std::string text =
      R"({"tables": [{"name": "w", "rows": 4, "dim": 2}],
          "checkpoint": {"dir": "/shared/ckpt", "every_clocks": 100, "every_seconds": 600,
                         "keep": 5, "timeout_seconds": 30}})";
  auto tables = ParseTablesJson(text);
  ASSERT_TRUE(tables.ok()) << tables.status();
  EXPECT_EQ(tables->size(), 1u);
  auto c = ParseCheckpointSettings(text);
  ASSERT_TRUE(c.ok()) << c.status();
  ServerOptions o;
  c->ApplyTo(&o);
  EXPECT_EQ(o.checkpoint_dir, "/shared/ckpt");
  EXPECT_EQ(o.checkpoint_every, 100u);
  EXPECT_EQ(o.checkpoint_interval, std::chrono::seconds(600));
  EXPECT_EQ(o.checkpoint_keep, 5u);
  EXPECT_EQ(o.checkpoint_timeout, std::chrono::seconds(30));
  // Absent keys leave the options alone.
  auto none = ParseCheckpointSettings(R"({"tables": [], "checkpoint": {}})");
  ASSERT_TRUE(none.ok()) << none.status();
  ServerOptions d;
  none->ApplyTo(&d);
  EXPECT_EQ(d.checkpoint_keep, ServerOptions{}.checkpoint_keep);
  EXPECT_TRUE(d.checkpoint_dir.empty());
  auto list_only = ParseCheckpointSettings(R"([{"rows": 1, "dim": 1}])");
  ASSERT_TRUE(list_only.ok()) << list_only.status();
  EXPECT_FALSE(list_only->dir.has_value());
}

TEST(TablesJsonTest, CheckpointSettingsRefuseBadValuesNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"("checkpoint": 3)", "must be an object"},
      {R"("checkpoint": {"dri": "/x"})", "unknown key \"dri\""},
      {R"("checkpoint": {"dir": ""})", "\"dir\" must be a folder path"},
      {R"("checkpoint": {"dir": 7})", "\"dir\" must be a string"},
      {R"("checkpoint": {"every_clocks": -1})", "\"every_clocks\" must be a non-negative"},
      {R"("checkpoint": {"every_clocks": 1.5})", "\"every_clocks\" must be a non-negative"},
      {R"("checkpoint": {"every_clocks": 18446744073709551616})", "every_clocks"},
      {R"("checkpoint": {"every_seconds": 99999999999})", "\"every_seconds\" 99999999999 is more"},
      {R"("checkpoint": {"timeout_seconds": 18446744073709551615})", "timeout_seconds"},
      {R"("checkpoint": {"keep": 4294967296})", "keep"},
      {R"("checkpoint": {"keep": "3"})", "\"keep\" must be a non-negative"},
  };
  for (const auto& [body, want] : bad) {
    SCOPED_TRACE(body);
    const std::string text = R"({"tables": [{"rows": 1, "dim": 1}], )" + body + "}";
    auto c = ParseCheckpointSettings(text);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr(want));
    // The table list's parser refuses the file too.
    auto t = ParseTablesJson(text);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace rdmaps

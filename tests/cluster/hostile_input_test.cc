// Numbers and nesting from config files and the environment are checked,
// never truncated or wrapped (issue 13, "every number that arrives from the
// network or a config file"): each case is a regression test of an input
// that was once misread, or of the class around it.
#include <endian.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "rdmaps/cluster.h"
#include "rdmaps/tables_json.h"
#include "src/base/checked.h"
#include "src/cluster/host_lists.h"
#include "src/cluster/json_parse.h"
#include "src/cluster/rendezvous.h"

namespace rdmaps {
namespace {

using ::testing::HasSubstr;

Status TablesStatus(const std::string& table) {
  return ParseTablesJson(R"({"tables": [)" + table + "]}").status();
}

void ExpectInvalid(const Status& s, const std::string& text) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr(text)) << s;
}

TEST(CheckedTest, AddMulSubAndNarrowRefuseWhatDoesNotFit) {
  using internal::CheckedAdd;
  using internal::CheckedMul;
  const std::uint64_t max = ~0ull;
  EXPECT_EQ(CheckedAdd<std::uint64_t>(max - 1, 1), max);
  EXPECT_FALSE(CheckedAdd<std::uint64_t>(max, 1));
  EXPECT_FALSE(CheckedMul<std::uint64_t>(std::uint64_t{1} << 60, 16));
  EXPECT_EQ(CheckedMul<std::uint64_t>(1 << 20, 16), 16u << 20);
  EXPECT_FALSE(internal::CheckedSub<std::uint64_t>(1, 2));
  EXPECT_FALSE(CheckedAdd(CheckedMul<std::uint64_t>(max, 2), std::uint64_t{1}));
  EXPECT_TRUE(internal::RangeWithin(10, 6, 16));
  EXPECT_FALSE(internal::RangeWithin(11, 6, 16));
  EXPECT_FALSE(internal::RangeWithin(max, 2, 16));
  auto n = internal::CheckedNarrow<std::uint32_t>(std::uint64_t{1} << 32, "dim");
  ExpectInvalid(n.status(), "dim = 4294967296 is out of range (0..4294967295)");
  EXPECT_EQ(*internal::CheckedNarrow<std::uint32_t>(std::uint64_t{7}, "dim"), 7u);
  ExpectInvalid(internal::CheckedFiniteFloat(1e39, "lr").status(), "lr");
  EXPECT_EQ(*internal::CheckedFiniteFloat(0.5, "lr"), 0.5f);
}

// Regression: dim 2^32+1 was read as 1.
TEST(TablesJsonLimitsTest, DimBeyondThirtyTwoBitsIsRefusedNotTruncated) {
  ExpectInvalid(TablesStatus(R"({"name": "w", "rows": 4, "dim": 4294967297})"),
                "\"dim\" = 4294967297 is out of range");
  ExpectInvalid(TablesStatus(R"({"name": "w", "rows": 4, "dim": 4, "id": 4294967296})"),
                "\"id\" = 4294967296");
}

// Regression: staleness 2^32 was read as 0 (BSP).
TEST(TablesJsonLimitsTest, StalenessBeyondThirtyTwoBitsIsRefused) {
  ExpectInvalid(TablesStatus(R"({"name": "w", "rows": 4, "dim": 4, "staleness": 4294967296})"),
                "\"staleness\" = 4294967296 is out of range");
}

// Regression: a learning rate of 1e39 became inf.
TEST(TablesJsonLimitsTest, FloatsMustStayFinite) {
  ExpectInvalid(
      TablesStatus(R"({"name": "w", "rows": 4, "dim": 4, "optimizer": {"learning_rate": 1e39}})"),
      "\"learning_rate\"");
  ExpectInvalid(TablesStatus(R"({"name": "w", "rows": 4, "dim": 4,
                                 "init": {"kind": "uniform", "low": -1e300, "high": 1}})"),
                "\"low\"");
}

// Regression: a deeply nested tables JSON overflowed the stack.
TEST(TablesJsonLimitsTest, DeepNestingIsRefusedWithAClearError) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ExpectInvalid(ParseTablesJson(deep).status(), "nested more than 32 levels");
  ExpectInvalid(TablesStatus(R"({"name": "w", "rows": 4, "dim": 4, "init": )" +
                             std::string(40, '[') + std::string(40, ']') + "}"),
                "nested");
  // Nesting up to the limit is parsed as before.
  ExpectInvalid(ParseTablesJson(std::string(32, '[') + std::string(32, ']')).status(),
                "table #0 is");
}

TEST(JsonParseTest, ReportsInvalidJsonAndOversizedText) {
  ExpectInvalid(internal::ParseJsonLimited("{", "TF_CONFIG").status(),
                "TF_CONFIG is not valid JSON");
  ExpectInvalid(
      internal::ParseJsonLimited(std::string(internal::kMaxJsonBytes + 1, ' '), "x").status(),
      "exceed the limit");
}

Result<ClusterLayout> FromTfConfig(const std::string& task) {
  return ResolveCluster(
      {}, {{"TF_CONFIG", R"({"cluster": {"ps": ["p:1"], "chief": ["c:1"], "worker": ["w0:1"]},
                             "task": )" +
                             task + "}"}});
}

// Regression: a TF_CONFIG index of 2^32 was read as 0.
TEST(TfConfigLimitsTest, IndexBeyondAnIntIsRefused) {
  ExpectInvalid(FromTfConfig(R"({"type": "worker", "index": 4294967296})").status(),
                "TF_CONFIG task.index = 4294967296 is out of range");
  ExpectInvalid(FromTfConfig(R"({"type": "worker", "index": -4294967296})").status(),
                "TF_CONFIG task.index");
  ExpectInvalid(FromTfConfig(R"({"type": "worker", "index": 2147483647})").status(),
                "out of range");
}

// Regression: "index": "0" (a string, as Kubeflow may write it) threw
// nlohmann::json::type_error out of the resolver (SIGABRT).
TEST(TfConfigLimitsTest, StringIndexIsAcceptedWithoutAnException) {
  auto r = FromTfConfig(R"({"type": "worker", "index": "0"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->index, 1);  // after the chief
  ExpectInvalid(FromTfConfig(R"({"type": "worker", "index": "x"})").status(), "'x'");
}

TEST(TfConfigLimitsTest, DeepNestingIsRefused) {
  ExpectInvalid(ResolveCluster({}, {{"TF_CONFIG", std::string(5000, '[')}}).status(),
                "TF_CONFIG: JSON nested more than");
}

TEST(SlurmLimitsTest, ANodeListThatExpandsBeyondTheLimitIsRefused) {
  auto r = internal::ExpandSlurmNodeList("a[0-99999]b[0-99999]");
  ExpectInvalid(r.status(), "expands to more than 65536 nodes");
  EXPECT_TRUE(internal::ExpandSlurmNodeList("n[0-65535]").ok());
}

TEST(EnvCountLimitsTest, CountsBeyondAnIntAreRefused) {
  ExpectInvalid(internal::ParseCount("WORLD_SIZE", "4294967296").status(), "'4294967296'");
  ExpectInvalid(internal::ParseCount("WORLD_SIZE", "-1").status(), "WORLD_SIZE");
}

TEST(EnvCountLimitsTest, WorldSizesBeyondTheLimitAreRefused) {
  ExpectInvalid(ResolveCluster({}, {{"DMLC_ROLE", "worker"},
                                    {"DMLC_PS_ROOT_URI", "10.0.0.1"},
                                    {"DMLC_PS_ROOT_PORT", "9000"},
                                    {"DMLC_NUM_SERVER", "2147483647"},
                                    {"DMLC_NUM_WORKER", "2147483647"}})
                    .status(),
                "overflows");
  ExpectInvalid(ResolveCluster({}, {{"RANK", "1"},
                                    {"WORLD_SIZE", "2000000000"},
                                    {"MASTER_ADDR", "10.0.0.1"},
                                    {"MASTER_PORT", "29500"}})
                    .status(),
                "exceed the limit of 1048576");
  ClusterOptions o;
  o.num_servers = 2000000000;
  ExpectInvalid(ResolveCluster(o, {}).status(), "num_servers=2000000000");
}

// --- Rendezvous messages -----------------------------------------------------

internal::AnswerHeader Answer(std::uint8_t role, std::int32_t index, std::uint32_t S,
                              std::uint32_t W, std::string_view body) {
  internal::AnswerHeader h{};
  h.magic = internal::kRendezvousAnswerMagic;
  h.version = internal::kRendezvousVersion;
  h.role = role;
  h.index = index;
  h.num_servers = S;
  h.num_workers = W;
  h.body_len = static_cast<std::uint32_t>(body.size());
  return h;
}

TEST(RendezvousParseTest, AnAnswerGivesRoleIndexAndLists) {
  auto r =
      internal::RendezvousResultOf(Answer(1, 0, 1, 2, "p:1\nw:1\nw:2"), "p:1\nw:1\nw:2", "root");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->role, Role::kWorker);
  EXPECT_THAT(r->servers, ::testing::ElementsAre("p:1"));
  EXPECT_THAT(r->workers, ::testing::ElementsAre("w:1", "w:2"));
}

// Regression: counts were cast to int and summed, so num_servers 2^32-1 and
// num_workers = lines + 1 summed to the line count, and the server list was
// cut at begin() - 1.
TEST(RendezvousParseTest, CountsThatWrapAreRefused) {
  const std::string body = "a:1\nb:1";
  auto r = internal::RendezvousResultOf(Answer(1, 0, 0xffffffffu, 3, body), body, "root");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();
  r = internal::RendezvousResultOf(Answer(1, 5, 1, 1, body), body, "root");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();  // index beyond its role
  r = internal::RendezvousResultOf(Answer(9, 0, 1, 1, body), body, "root");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();  // unknown role
  internal::AnswerHeader h = Answer(1, 0, 1, 1, body);
  h.code = 200;
  r = internal::RendezvousResultOf(h, body, "root");
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status();  // unknown status code
}

TEST(RendezvousParseTest, HelloNeedsExactlyItsBytesAndAKnownRoleAndLength) {
  internal::HelloHeader h{};
  h.magic = htobe32(internal::kRendezvousHelloMagic);
  h.addr_len = htobe32(3);
  std::string bytes(sizeof(h), '\0');
  std::memcpy(bytes.data(), &h, sizeof(h));
  auto parse = [](const std::string& b) {
    return internal::ParseRendezvousHello(std::as_bytes(std::span<const char>(b.data(), b.size())));
  };
  ExpectInvalid(parse(bytes).status(), "an address of 3 bytes");  // the address is missing
  auto p = parse(bytes + "a:1");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->address, "a:1");
  h.addr_len = htobe32(0xffffffffu);
  std::memcpy(bytes.data(), &h, sizeof(h));
  ExpectInvalid(parse(bytes).status(), "(at most");
  h.addr_len = 0;
  h.role = 77;
  std::memcpy(bytes.data(), &h, sizeof(h));
  ExpectInvalid(parse(bytes).status(), "role 77");
}

}  // namespace
}  // namespace rdmaps

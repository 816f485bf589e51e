// etcd's replies are hostile: the pure parsers accept what etcd 3.4's JSON
// gateway sends (proto3 JSON: int64 as strings, defaults omitted) and refuse
// everything else with a clear status.
#include <gtest/gtest.h>

#include <vector>

#include "src/cluster/etcd_coordinator.h"

namespace rdmaps::internal {
namespace {

using nlohmann::json;

json Parse(const std::string& s) {
  auto j = ParseEtcdReply(s);
  EXPECT_TRUE(j.ok()) << j.status();
  return j.ok() ? *j : json();
}

std::string B64(std::string_view s) { return Base64Encode(s); }

CoordinatorOptions Opts(std::string address, std::string prefix = "", std::string user = "",
                        std::string password_file = "", std::string ca = "") {
  CoordinatorOptions o;
  o.address = std::move(address);
  o.job_prefix = std::move(prefix);
  o.etcd_user = std::move(user);
  o.etcd_password_file = std::move(password_file);
  o.etcd_ca_file = std::move(ca);
  return o;
}

TEST(EtcdReplyTest, Base64IsStrict) {
  EXPECT_EQ(B64("foo"), "Zm9v");
  EXPECT_EQ(*Base64Decode("Zm9v", 16), "foo");
  EXPECT_EQ(*Base64Decode("", 16), "");
  EXPECT_FALSE(Base64Decode("Zm9", 16).ok());
  EXPECT_FALSE(Base64Decode("Zm9v\n", 16).ok());
  EXPECT_FALSE(Base64Decode("Zm!v", 16).ok());
  EXPECT_FALSE(Base64Decode("Zm9vZm9v", 4).ok());
}

TEST(EtcdReplyTest, ErrorsMapFromTheirGrpcCode) {
  auto lease = ParseEtcdReply(
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})");
  EXPECT_EQ(lease.status().code(), StatusCode::kNotFound);
  EXPECT_NE(lease.status().message().find("lease not found"), std::string::npos);
  auto auth = ParseEtcdReply(R"({"error":{"grpc_code":16,"message":"invalid auth token"}})");
  EXPECT_EQ(auth.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(ParseEtcdReply(R"({"error":"x","code":14})").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(ParseEtcdReply("[1]").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseEtcdReply("{").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseEtcdReply(std::string(kMaxEtcdReplyBytes + 1, ' ')).status().code(),
            StatusCode::kDataLoss);
}

TEST(EtcdReplyTest, IntegersAreStringsOrNumbersAndAbsentIsZero) {
  json j = {{"a", "42"},
            {"b", 7},
            {"c", "-3"},
            {"d", "9223372036854775807"},
            {"e", "9223372036854775808"},
            {"f", "4x"},
            {"g", true},
            {"h", ""},
            {"i", "-"}};
  EXPECT_EQ(*EtcdInt(j, "a"), 42);
  EXPECT_EQ(*EtcdInt(j, "b"), 7);
  EXPECT_EQ(*EtcdInt(j, "c"), -3);
  EXPECT_EQ(*EtcdInt(j, "d"), INT64_MAX);
  EXPECT_EQ(*EtcdInt(j, "missing"), 0);
  for (const char* bad : {"e", "f", "g", "h", "i"}) {
    EXPECT_EQ(EtcdInt(j, bad).status().code(), StatusCode::kDataLoss) << bad;
  }
}

TEST(EtcdReplyTest, RangeReplyOfEtcd34) {
  const std::string reply =
      R"({"header":{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"2"},"kvs":[{"key":")" +
      B64("job/shard_map") +
      R"(","create_revision":"2","mod_revision":"8","version":"3","value":")" + B64("v") +
      R"(","lease":"77"}],"count":"1"})";
  auto r = ParseEtcdRange(Parse(reply), "job/");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->revision, 9);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "shard_map");
  EXPECT_EQ(r->kvs[0].value, "v");
  EXPECT_EQ(r->kvs[0].mod_revision, 8);
  EXPECT_EQ(r->kvs[0].lease, 77);
  // The same reply seen by another job's prefix: refused, not misread.
  EXPECT_EQ(ParseEtcdRange(Parse(reply), "other/").status().code(), StatusCode::kDataLoss);
  // An empty range (etcd omits kvs and count).
  auto empty = ParseEtcdRange(Parse(R"({"header":{"revision":"3"}})"), "job/");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->kvs.empty());
  // Truncated by the limit: never silently partial.
  auto more = ParseEtcdRange(Parse(R"({"header":{"revision":"3"},"more":true})"), "job/");
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
}

TEST(EtcdReplyTest, HostileRangeRepliesAreRefused) {
  const std::string k = B64("job/k");
  for (const std::string& bad : std::vector<std::string>{
           std::string(R"({"kvs":[]})"),                            // no header
           std::string(R"({"header":{"revision":"0"}})"),           // revision 0
           std::string(R"({"header":{"revision":"5"},"kvs":{}})"),  // kvs not an array
           R"({"header":{"revision":"5"},"kvs":[{"key":")" + k + R"(","mod_revision":"6"}]})",
           R"({"header":{"revision":"5"},"kvs":[{"key":")" + k + R"(","mod_revision":"0"}]})",
           R"({"header":{"revision":"5"},"kvs":[{"key":")" + k +
               R"(","mod_revision":"2","create_revision":"3"}]})",
           R"({"header":{"revision":"5"},"kvs":[{"key":")" + B64("job/a b") +
               R"(","mod_revision":"2"}]})",
           R"({"header":{"revision":"5"},"kvs":[{"key":")" + k +
               R"(","mod_revision":"2","value":"!!"}]})",
           R"({"header":{"revision":"5"},"kvs":[{"key":5,"mod_revision":"2"}]})",
       }) {
    auto j = ParseEtcdReply(bad);
    ASSERT_TRUE(j.ok()) << bad;
    EXPECT_FALSE(ParseEtcdRange(*j, "job/").ok()) << "accepted: " << bad;
  }
}

TEST(EtcdReplyTest, TxnReplies) {
  auto won = ParseEtcdCas(Parse(R"({"header":{"revision":"12"},"succeeded":true,
      "responses":[{"response_put":{"header":{"revision":"12"}}}]})"),
                          "j/");
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_TRUE(won->swapped);
  EXPECT_EQ(won->revision, 12);
  // proto3 omits succeeded=false.
  auto lost =
      ParseEtcdCas(Parse(R"({"header":{"revision":"12"},"responses":[{"response_range":
      {"header":{"revision":"12"},"kvs":[{"key":")" +
                         B64("j/m") + R"(","create_revision":"3","mod_revision":"11","value":")" +
                         B64("x") + R"("}],"count":"1"}}]})"),
                   "j/");
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_FALSE(lost->swapped);
  ASSERT_TRUE(lost->current);
  EXPECT_EQ(lost->current->mod_revision, 11);
  auto absent = ParseEtcdCas(
      Parse(R"({"header":{"revision":"4"},"responses":[{"response_range":{"header":{}}}]})"), "j/");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->current);
  EXPECT_FALSE(ParseEtcdCas(Parse(R"({"header":{"revision":"4"}})"), "j/").ok());
  EXPECT_FALSE(ParseEtcdCas(Parse(R"({"header":{"revision":"4"},"succeeded":"yes"})"), "j/").ok());
}

TEST(EtcdReplyTest, WatchMessages) {
  EXPECT_EQ(
      *ParseEtcdWatchMessage(Parse(R"({"result":{"header":{"revision":"5"},"created":true}})"), 4),
      0);
  auto ev = ParseEtcdWatchMessage(
      Parse(
          R"({"result":{"header":{"revision":"7"},"events":[{"type":"DELETE","kv":{"key":"eA==","mod_revision":"7"}}]}})"),
      4);
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_EQ(*ev, 7);
  auto compacted = ParseEtcdWatchMessage(
      Parse(R"({"result":{"header":{"revision":"90"},"compact_revision":"50","canceled":true}})"),
      4);
  ASSERT_TRUE(compacted.ok());
  EXPECT_EQ(*compacted, 50);
  auto cancelled = ParseEtcdWatchMessage(
      Parse(R"({"result":{"canceled":true,"cancel_reason":"permission denied"}})"), 4);
  EXPECT_EQ(cancelled.status().code(), StatusCode::kUnavailable);
  auto past =
      ParseEtcdWatchMessage(Parse(R"({"result":{"events":[{"kv":{"mod_revision":"3"}}]}})"), 4);
  EXPECT_EQ(past.status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(ParseEtcdWatchMessage(Parse(R"({"x":1})"), 4).ok());
}

TEST(EtcdReplyTest, OptionsParseEndpointsAndRefuseMixups) {
  auto o = ParseEtcdOptions(Opts("etcd://127.0.0.1:2379,[::1]:2380", "j/"));
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->endpoints.size(), 2u);
  EXPECT_EQ(o->endpoints[0], "http://127.0.0.1:2379");
  EXPECT_EQ(o->endpoints[1], "http://[::1]:2380");
  auto tls = ParseEtcdOptions(Opts("etcd+https://h:2379"));
  ASSERT_TRUE(tls.ok());
  EXPECT_EQ(tls->endpoints[0], "https://h:2379");
  EXPECT_FALSE(ParseEtcdOptions(Opts("etcd://")).ok());
  EXPECT_FALSE(ParseEtcdOptions(Opts("etcd://h")).ok());
  EXPECT_FALSE(ParseEtcdOptions(Opts("etcd://h:0")).ok());
  EXPECT_FALSE(ParseEtcdOptions(Opts("etcd://h:1", "", "", "", "/ca")).ok());
  EXPECT_FALSE(ParseEtcdOptions(Opts("etcd://h:1", "", "root")).ok());
}

}  // namespace
}  // namespace rdmaps::internal

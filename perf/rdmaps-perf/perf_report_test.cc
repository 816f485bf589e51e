#include "perf/rdmaps-perf/perf_report.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace rdmaps::perf {
namespace {

TEST(ComputeLatencyTest, PercentilesAreNearestRankOfSortedSamples) {
  std::vector<std::int64_t> ns(1000);
  // 1..1000 microseconds, shuffled by a stride coprime to 1000.
  for (std::size_t i = 0; i < ns.size(); ++i) ns[i] = static_cast<std::int64_t>((i * 7 % 1000) + 1) * 1000;
  LatencyStats s = ComputeLatency(64, ns);
  EXPECT_EQ(s.bytes, 64u);
  EXPECT_EQ(s.iterations, 1000u);
  EXPECT_DOUBLE_EQ(s.min_us, 1);
  EXPECT_DOUBLE_EQ(s.max_us, 1000);
  EXPECT_DOUBLE_EQ(s.p50_us, 500);
  EXPECT_DOUBLE_EQ(s.typical_us, 500);
  EXPECT_DOUBLE_EQ(s.p90_us, 900);
  EXPECT_DOUBLE_EQ(s.p99_us, 990);
  EXPECT_DOUBLE_EQ(s.p999_us, 999);
  EXPECT_DOUBLE_EQ(s.avg_us, 500.5);
  EXPECT_NEAR(s.stdev_us, 288.67, 0.01);
}

TEST(ComputeLatencyTest, EmptyGivesZeros) {
  std::vector<std::int64_t> none;
  LatencyStats s = ComputeLatency(8, none);
  EXPECT_EQ(s.iterations, 0u);
  EXPECT_EQ(s.max_us, 0);
}

TEST(ComputeBandwidthTest, AverageAndPeak) {
  // 100 messages of 1 MiB: the first 50 in 0.5 s, the last 50 in 0.25 s.
  std::vector<BandwidthSample> samples;
  for (std::uint64_t i = 1; i <= 50; ++i) samples.push_back({static_cast<std::int64_t>(i * 10'000'000), i});
  for (std::uint64_t i = 51; i <= 100; ++i) {
    samples.push_back({500'000'000 + static_cast<std::int64_t>((i - 50) * 5'000'000), i});
  }
  BandwidthStats s = ComputeBandwidth(1 << 20, 100, 750'000'000, samples, 10);
  EXPECT_NEAR(s.bw_avg_mib, 100 / 0.75, 1e-6);
  EXPECT_NEAR(s.bw_peak_mib, 200, 1e-6);
  EXPECT_NEAR(s.msg_rate_mpps, 100 / 0.75 / 1e6, 1e-12);
}

TEST(ComputeBandwidthTest, BurstOfCompletionsDoesNotInflatePeak) {
  // All completions but the last arrive together at the end: the peak cannot
  // exceed what windows of >= min_window messages show.
  std::vector<BandwidthSample> samples = {{1'000'000'000, 1}, {1'000'000'001, 64}};
  BandwidthStats s = ComputeBandwidth(1024, 64, 1'000'000'001, samples, 64);
  EXPECT_NEAR(s.bw_peak_mib, s.bw_avg_mib, 1e-3);
}

TEST(ParseOutputFormatTest, KnownAndUnknown) {
  EXPECT_EQ(*ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(*ParseOutputFormat("csv"), OutputFormat::kCsv);
  EXPECT_EQ(*ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_EQ(ParseOutputFormat("xml").status().code(), StatusCode::kInvalidArgument);
}

std::string Capture(OutputFormat format) {
  std::FILE* f = std::tmpfile();
  Reporter r(format, f, "test-tool", {{"transport", "tcp"}});
  std::vector<std::int64_t> ns = {1000, 2000, 3000};
  r.AddLatency(ComputeLatency(64, ns), true);
  std::vector<BandwidthSample> samples = {{1'000'000'000, 10}};
  r.AddBandwidth(ComputeBandwidth(1 << 20, 10, 1'000'000'000, samples, 1), true);
  r.Finish();
  std::rewind(f);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

TEST(ReporterTest, JsonIsValidAndComplete) {
  const nlohmann::json doc = nlohmann::json::parse(Capture(OutputFormat::kJson));
  EXPECT_EQ(doc["tool"], "test-tool");
  EXPECT_EQ(doc["transport"], "tcp");
  ASSERT_EQ(doc["latency"].size(), 1u);
  EXPECT_EQ(doc["latency"][0]["bytes"], 64);
  EXPECT_DOUBLE_EQ(doc["latency"][0]["t_typical_usec"].get<double>(), 2.0);
  ASSERT_EQ(doc["bandwidth"].size(), 1u);
  EXPECT_DOUBLE_EQ(doc["bandwidth"][0]["bw_avg_mib_s"].get<double>(), 10.0);
}

TEST(ReporterTest, TableHasPerftestColumns) {
  const std::string out = Capture(OutputFormat::kTable);
  for (const char* col : {"#bytes", "#iterations", "t_min[usec]", "t_max[usec]", "t_typical[usec]",
                          "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]",
                          "99.9% percentile[usec]", "BW peak[MiB/sec]", "BW average[MiB/sec]",
                          "MsgRate[Mpps]"}) {
    EXPECT_NE(out.find(col), std::string::npos) << col << " missing in\n" << out;
  }
}

TEST(ReporterTest, CsvRowsMatchHeader) {
  const std::string out = Capture(OutputFormat::kCsv);
  std::vector<std::string> lines;
  std::size_t pos = 0;
  while (pos < out.size()) {
    std::size_t nl = out.find('\n', pos);
    lines.push_back(out.substr(pos, nl - pos));
    pos = nl + 1;
  }
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_EQ(lines[0], CsvHeader());
  auto commas = [](const std::string& s) { return std::count(s.begin(), s.end(), ','); };
  EXPECT_EQ(commas(lines[1]), commas(lines[0]));
  EXPECT_EQ(commas(lines[2]), commas(lines[0]));
  EXPECT_EQ(lines[1].rfind("lat,64,3,", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("bw,1048576,10,", 0), 0u) << lines[2];
}

}  // namespace
}  // namespace rdmaps::perf

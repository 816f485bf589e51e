#include "perf/rdmaps-perf/perf_report.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace rdmaps::perf {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr const char* kRule =
    "-----------------------------------------------------------------------------------------"
    "--------------------------------------------------\n";

// Nearest-rank percentile of sorted samples, in microseconds.
double Percentile(const std::vector<std::int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  // The epsilon keeps 99.9 % of 1000 at rank 999 despite rounding.
  auto rank = static_cast<std::size_t>(
      std::ceil(p / 100.0 * static_cast<double>(sorted.size()) - 1e-9));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return static_cast<double>(sorted[rank - 1]) / 1e3;
}

// JSON numbers rounded to what the table shows (and no NaN/inf, which JSON
// cannot carry).
double Round(double v, int digits) {
  if (!std::isfinite(v)) return 0;
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}

}  // namespace

LatencyStats ComputeLatency(std::uint64_t bytes, std::vector<std::int64_t>& samples_ns) {
  LatencyStats s;
  s.bytes = bytes;
  s.iterations = samples_ns.size();
  if (samples_ns.empty()) return s;
  std::sort(samples_ns.begin(), samples_ns.end());
  const auto n = static_cast<double>(samples_ns.size());
  const double sum = std::accumulate(samples_ns.begin(), samples_ns.end(), 0.0,
                                     [](double a, std::int64_t b) { return a + static_cast<double>(b); });
  const double mean = sum / n;
  double sq = 0;
  for (std::int64_t v : samples_ns) {
    const double d = static_cast<double>(v) - mean;
    sq += d * d;
  }
  s.min_us = static_cast<double>(samples_ns.front()) / 1e3;
  s.max_us = static_cast<double>(samples_ns.back()) / 1e3;
  s.avg_us = mean / 1e3;
  s.stdev_us = std::sqrt(sq / n) / 1e3;
  s.p50_us = Percentile(samples_ns, 50);
  s.typical_us = s.p50_us;
  s.p90_us = Percentile(samples_ns, 90);
  s.p99_us = Percentile(samples_ns, 99);
  s.p999_us = Percentile(samples_ns, 99.9);
  return s;
}

BandwidthStats ComputeBandwidth(std::uint64_t bytes, std::uint64_t iterations,
                                std::int64_t total_ns, std::span<const BandwidthSample> samples,
                                std::uint64_t min_window) {
  BandwidthStats s;
  s.bytes = bytes;
  s.iterations = iterations;
  if (total_ns <= 0 || iterations == 0) return s;
  const double secs = static_cast<double>(total_ns) / 1e9;
  s.bw_avg_mib = static_cast<double>(bytes) * static_cast<double>(iterations) / secs / kMiB;
  s.msg_rate_mpps = static_cast<double>(iterations) / secs / 1e6;
  // Peak: the best rate over consecutive windows of >= window messages. A
  // window that would end with too few messages left is merged into the
  // previous one, so short tails do not produce inflated peaks.
  const std::uint64_t window = std::max<std::uint64_t>({min_window, iterations / 16, 1});
  double peak = 0;
  BandwidthSample start{};
  for (const BandwidthSample& cur : samples) {
    if (cur.done - start.done < window || cur.t_ns <= start.t_ns) continue;
    if (iterations - cur.done < window && cur.done != iterations) continue;
    const double dt = static_cast<double>(cur.t_ns - start.t_ns) / 1e9;
    peak = std::max(peak, static_cast<double>(bytes) * static_cast<double>(cur.done - start.done) /
                              dt / kMiB);
    start = cur;
  }
  s.bw_peak_mib = std::max(peak, s.bw_avg_mib);
  return s;
}

Result<OutputFormat> ParseOutputFormat(std::string_view name) {
  if (name == "table") return OutputFormat::kTable;
  if (name == "csv") return OutputFormat::kCsv;
  if (name == "json") return OutputFormat::kJson;
  return InvalidArgumentError("unknown --output='" + std::string(name) +
                              "'; use table, csv or json");
}

std::string_view CsvHeader() {
  return "kind,bytes,iterations,t_min_usec,t_max_usec,t_typical_usec,t_avg_usec,t_stdev_usec,"
         "p99_usec,p99_9_usec,p50_usec,p90_usec,bw_peak_mib_s,bw_avg_mib_s,msg_rate_mpps,"
         "verified";
}

Reporter::Reporter(OutputFormat format, std::FILE* out, std::string tool, nlohmann::json info)
    : format_(format), out_(out) {
  doc_ = std::move(info);
  doc_["tool"] = std::move(tool);
  doc_["latency"] = nlohmann::json::array();
  doc_["bandwidth"] = nlohmann::json::array();
}

void Reporter::PrintInfoOnce() {
  if (info_printed_) return;
  info_printed_ = true;
  if (format_ == OutputFormat::kCsv) {
    std::fprintf(out_, "%.*s\n", static_cast<int>(CsvHeader().size()), CsvHeader().data());
    return;
  }
  if (format_ != OutputFormat::kTable) return;
  std::fputs(kRule, out_);
  for (const auto& [key, value] : doc_.items()) {
    if (value.is_array() && value.empty()) continue;
    std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    std::fprintf(out_, " %-22s: %s\n", key.c_str(), text.c_str());
  }
}

void Reporter::AddLatency(const LatencyStats& s, bool verified) {
  PrintInfoOnce();
  if (format_ == OutputFormat::kTable) {
    if (table_ != Table::kLatency) {
      table_ = Table::kLatency;
      std::fputs(kRule, out_);
      std::fprintf(out_, " %-8s %-12s %-14s %-14s %-16s %-14s %-15s %-22s %-24s %-21s %-21s\n",
                   "#bytes", "#iterations", "t_min[usec]", "t_max[usec]", "t_typical[usec]",
                   "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]",
                   "99.9% percentile[usec]", "50% percentile[usec]", "90% percentile[usec]");
    }
    std::fprintf(out_,
                 " %-8llu %-12llu %-14.2f %-14.2f %-16.2f %-14.2f %-15.2f %-22.2f %-24.2f "
                 "%-21.2f %-21.2f%s\n",
                 static_cast<unsigned long long>(s.bytes),
                 static_cast<unsigned long long>(s.iterations), s.min_us, s.max_us, s.typical_us,
                 s.avg_us, s.stdev_us, s.p99_us, s.p999_us, s.p50_us, s.p90_us,
                 verified ? "" : "  (data not verified)");
  } else if (format_ == OutputFormat::kCsv) {
    std::fprintf(out_, "lat,%llu,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,,,,%d\n",
                 static_cast<unsigned long long>(s.bytes),
                 static_cast<unsigned long long>(s.iterations), s.min_us, s.max_us, s.typical_us,
                 s.avg_us, s.stdev_us, s.p99_us, s.p999_us, s.p50_us, s.p90_us, verified ? 1 : 0);
  }
  std::fflush(out_);
  doc_["latency"].push_back({{"bytes", s.bytes},
                             {"iterations", s.iterations},
                             {"t_min_usec", Round(s.min_us, 3)},
                             {"t_max_usec", Round(s.max_us, 3)},
                             {"t_typical_usec", Round(s.typical_us, 3)},
                             {"t_avg_usec", Round(s.avg_us, 3)},
                             {"t_stdev_usec", Round(s.stdev_us, 3)},
                             {"p50_usec", Round(s.p50_us, 3)},
                             {"p90_usec", Round(s.p90_us, 3)},
                             {"p99_usec", Round(s.p99_us, 3)},
                             {"p99_9_usec", Round(s.p999_us, 3)},
                             {"verified", verified}});
}

void Reporter::AddBandwidth(const BandwidthStats& s, bool verified) {
  PrintInfoOnce();
  if (format_ == OutputFormat::kTable) {
    if (table_ != Table::kBandwidth) {
      table_ = Table::kBandwidth;
      std::fputs(kRule, out_);
      std::fprintf(out_, " %-10s %-14s %-19s %-22s %-14s\n", "#bytes", "#iterations",
                   "BW peak[MiB/sec]", "BW average[MiB/sec]", "MsgRate[Mpps]");
    }
    std::fprintf(out_, " %-10llu %-14llu %-19.2f %-22.2f %-14.6f%s\n",
                 static_cast<unsigned long long>(s.bytes),
                 static_cast<unsigned long long>(s.iterations), s.bw_peak_mib, s.bw_avg_mib,
                 s.msg_rate_mpps, verified ? "" : "  (data not verified)");
  } else if (format_ == OutputFormat::kCsv) {
    std::fprintf(out_, "bw,%llu,%llu,,,,,,,,,,%.3f,%.3f,%.6f,%d\n",
                 static_cast<unsigned long long>(s.bytes),
                 static_cast<unsigned long long>(s.iterations), s.bw_peak_mib, s.bw_avg_mib,
                 s.msg_rate_mpps, verified ? 1 : 0);
  }
  std::fflush(out_);
  doc_["bandwidth"].push_back({{"bytes", s.bytes},
                               {"iterations", s.iterations},
                               {"bw_peak_mib_s", Round(s.bw_peak_mib, 3)},
                               {"bw_avg_mib_s", Round(s.bw_avg_mib, 3)},
                               {"msg_rate_mpps", Round(s.msg_rate_mpps, 6)},
                               {"verified", verified}});
}

void Reporter::SetExtra(const std::string& key, nlohmann::json value) {
  doc_[key] = std::move(value);
}

void Reporter::Finish() {
  if (format_ == OutputFormat::kTable) {
    PrintInfoOnce();
    std::fputs(kRule, out_);
  } else if (format_ == OutputFormat::kJson) {
    std::fprintf(out_, "%s\n", doc_.dump(2).c_str());
  }
  std::fflush(out_);
}

}  // namespace rdmaps::perf

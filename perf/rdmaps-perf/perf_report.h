// Statistics and output formats shared by rdmaps-perf and socket-baseline, so
// that both print the same tables (perftest's columns), the same CSV and the
// same JSON, and perf/tcp_vs_socket.sh can compare them row by row.
//
//   Latency:   #bytes #iterations t_min[usec] t_max[usec] t_typical[usec]
//              t_avg[usec] t_stdev[usec] 99% percentile[usec]
//              99.9% percentile[usec] 50% percentile[usec] 90% percentile[usec]
//   Bandwidth: #bytes #iterations BW peak[MiB/sec] BW average[MiB/sec]
//              MsgRate[Mpps]
//
// t_typical is the median (as in perftest). Percentiles are nearest-rank.
// BW peak is the best rate over windows of at least max(tx_depth, iters/16)
// completed messages; BW average is all bytes over the whole timed run.
//
// Thread safety: the functions are pure; a Reporter is used by one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rdmaps/status.h"

namespace rdmaps::perf {

struct LatencyStats {
  std::uint64_t bytes = 0;
  std::uint64_t iterations = 0;
  double min_us = 0;
  double max_us = 0;
  double typical_us = 0;  // The median.
  double avg_us = 0;
  double stdev_us = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double p999_us = 0;
};

// Stats of one latency run; `samples_ns` holds one duration per iteration
// (sorted in place). Empty samples give all-zero stats.
LatencyStats ComputeLatency(std::uint64_t bytes, std::vector<std::int64_t>& samples_ns);

// Progress of a bandwidth run: `done` messages had completed `t_ns` after the
// run started. Recorded whenever completions arrive, in increasing order.
struct BandwidthSample {
  std::int64_t t_ns = 0;
  std::uint64_t done = 0;
};

struct BandwidthStats {
  std::uint64_t bytes = 0;
  std::uint64_t iterations = 0;
  double bw_peak_mib = 0;  // MiB/s
  double bw_avg_mib = 0;   // MiB/s
  double msg_rate_mpps = 0;
};

// `total_ns` is the whole timed run; `iterations` the messages it moved;
// `min_window` the smallest window (in messages) the peak is taken over.
BandwidthStats ComputeBandwidth(std::uint64_t bytes, std::uint64_t iterations,
                                std::int64_t total_ns, std::span<const BandwidthSample> samples,
                                std::uint64_t min_window);

enum class OutputFormat { kTable, kCsv, kJson };

// "table", "csv" or "json".
Result<OutputFormat> ParseOutputFormat(std::string_view name);

// The CSV header both tools print (one schema for both kinds of rows).
std::string_view CsvHeader();

// Prints results as they come (table and CSV) or as one JSON document at
// Finish(). Table and CSV rows are flushed at once, so a long -a run shows
// progress.
class Reporter {
 public:
  // `title` heads the table ("RDMA_Read Latency Test" style); `info` is the
  // configuration: printed as "key : value" lines above a table, as the
  // top-level object of the JSON document.
  Reporter(OutputFormat format, std::FILE* out, std::string tool, nlohmann::json info);

  void AddLatency(const LatencyStats& stats, bool verified);
  void AddBandwidth(const BandwidthStats& stats, bool verified);
  // Adds a key to the JSON document (e.g. the server's summary).
  void SetExtra(const std::string& key, nlohmann::json value);
  // Ends the tables; prints the JSON document.
  void Finish();

  const nlohmann::json& document() const { return doc_; }

 private:
  void PrintInfoOnce();

  const OutputFormat format_;
  std::FILE* const out_;
  nlohmann::json doc_;
  bool info_printed_ = false;
  enum class Table { kNone, kLatency, kBandwidth } table_ = Table::kNone;
};

}  // namespace rdmaps::perf

#include "src/ps/scatter_plan.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace rdmaps::internal {

PullCosts CostsOf(std::string_view kind) {
  // Only the ratios decide (both estimates scale with the constants):
  // c_op / c_byte is the crossover in bytes of span per run of wanted ids.
  // Measured with perf/ps_costs.sh (docs/ps.md, "Scattered pulls"):
  // tcp loopback here, 2026-12-01: c_op 0.45-2.4 us, c_byte 0.38-1.0 ns, a
  // crossover of 1.16-1.18 KB in two runs and 2.4 KB in the most loaded one;
  // a gathered row a few ns (random reads of the scratch; tens of ns on a
  // loaded box). The quietest run's constants are used.
  // fake: a READ is a memcpy under a lock. verbs: Soft-RoCE in the TCG VM
  // measured c_op 178-240 us, c_byte 49-98 ns, a crossover of 2.4-3.7 KB; an
  // HCA's order of magnitude (1.5 us per op in a batch, 0.1 ns per byte) is
  // about 15 KB, which cannot be measured here. One backend name covers
  // both, so verbs takes the geometric mean, 6 KB: wrong on either device
  // only between its crossover and 6 KB, where the choice made costs at
  // most about 2x the other (instead of up to 4-6x with either one's
  // constants on the other device).
  if (kind == "fake") return {0.25, 0.0001, 0.004};
  if (kind == "verbs") return {1.5, 0.00025, 0.004};
  return {0.45, 0.00038, 0.004};
}

namespace {

std::uint32_t ServerOf(const RemoteTable& t, std::uint32_t num_servers, std::uint64_t row) {
  return num_servers == 1 ? 0 : ServerOfRow(t.info.rows, num_servers, row);
}

// Remote bytes a READ of shard-local rows [lo, hi] moves (whole blocks,
// headers included).
std::uint64_t SpanBytes(const ShardGeometry& g, std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t blocks = g.block_of(hi) - g.block_of(lo) + 1;
  if (g.inline_headers()) return blocks * g.block_stride;
  return blocks * (g.rows_per_block * g.row_bytes + sizeof(BlockHeader));
}

}  // namespace

std::uint64_t MaxId(std::span<const std::uint64_t> ids) {
  // Four independent maxima (cmov chains), then theirs.
  std::uint64_t m[4] = {0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 4 <= ids.size(); i += 4) {
    for (std::size_t k = 0; k < 4; ++k) m[k] = std::max(m[k], ids[i + k]);
  }
  for (; i < ids.size(); ++i) m[0] = std::max(m[0], ids[i]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

IdSummary SummarizeIds(std::span<const std::uint64_t> rows) {
  // Two of each (independent cmov chains), then theirs. (The general
  // planning loop below keeps per-server counts in memory: a store-to-load
  // chain per id, 1.8 ms for a million ids here.)
  if (rows.empty()) return {};
  std::uint64_t l0 = rows[0], l1 = rows[0], h0 = rows[0], h1 = rows[0];
  std::uint64_t r0 = 1, r1 = 0;
  std::size_t i = 1;
  for (; i + 2 <= rows.size(); i += 2) {
    const std::uint64_t a = rows[i], b = rows[i + 1];
    l0 = std::min(l0, a);
    l1 = std::min(l1, b);
    h0 = std::max(h0, a);
    h1 = std::max(h1, b);
    r0 += a != rows[i - 1] + 1 ? 1 : 0;
    r1 += b != a + 1 ? 1 : 0;
  }
  for (; i < rows.size(); ++i) {
    l0 = std::min(l0, rows[i]);
    h0 = std::max(h0, rows[i]);
    r0 += rows[i] != rows[i - 1] + 1 ? 1 : 0;
  }
  return {std::min(l0, l1), std::max(h0, h1), r0 + r1};
}

SpanPlan PlanScatteredPull(const RemoteTable& t, std::uint32_t num_servers,
                           std::span<const std::uint64_t> rows, const PullCosts& costs,
                           const IdSummary* summary) {
  SpanPlan p;
  const std::uint32_t S = num_servers;
  p.lo.assign(S, std::numeric_limits<std::uint64_t>::max());
  p.hi.assign(S, 0);
  p.scratch_row.assign(S, 0);
  std::vector<std::uint64_t> runs(S, 0), n(S, 0);
  std::uint32_t prev_server = S;
  std::uint64_t prev_local = 0;
  if (S == 1 && !rows.empty() && t.shards[0].begin == 0) {
    // (One shard, from row 0: shard-local rows are the ids.)
    const IdSummary sum = summary != nullptr ? *summary : SummarizeIds(rows);
    p.lo[0] = sum.min;
    p.hi[0] = sum.max;
    runs[0] = sum.runs;
    n[0] = rows.size();
    rows = {};
  }
  for (std::uint64_t id : rows) {
    const std::uint32_t si = ServerOf(t, S, id);
    const std::uint64_t local = id - t.shards[si].begin;
    if (si != prev_server || local != prev_local + 1) ++runs[si];
    prev_server = si;
    prev_local = local;
    p.lo[si] = std::min(p.lo[si], local);
    p.hi[si] = std::max(p.hi[si], local);
    ++n[si];
  }
  std::uint64_t span_bytes = 0;
  for (std::uint32_t si = 0; si < S; ++si) {
    if (n[si] == 0) continue;
    p.involved.push_back(si);
    const ShardGeometry& g = t.shards[si].geo;
    // Per row: each run READs its blocks (one, as a rule) and their header.
    const std::uint64_t run_bytes =
        g.inline_headers() ? g.block_stride : g.rows_per_block * g.row_bytes + sizeof(BlockHeader);
    p.per_row_us += static_cast<double>(runs[si]) *
                    (costs.op_us + static_cast<double>(run_bytes) * costs.byte_us);
    const std::uint64_t bytes = SpanBytes(g, p.lo[si], p.hi[si]);
    span_bytes += bytes;
    p.span_us += static_cast<double>(bytes / (256 * 1024) + 1) * costs.op_us +
                 static_cast<double>(bytes) * costs.byte_us +
                 static_cast<double>(n[si]) * costs.gather_row_us;
    p.scratch_row[si] = p.scratch_rows;
    p.scratch_rows += p.hi[si] - p.lo[si] + 1;
  }
  p.use_span = span_bytes <= kSpanMaxBytes && p.span_us < p.per_row_us;
  return p;
}

void GatherFromSpans(const RemoteTable& t, std::uint32_t num_servers, const SpanPlan& plan,
                     std::span<const std::uint64_t> rows, const float* scratch, float* out) {
  const std::uint32_t dim = t.info.dim;
  const std::uint32_t S = num_servers;
  if (S == 1) {
    const std::uint64_t first = t.shards[0].begin + plan.lo[0];
    if (dim == 1) {
      for (std::size_t i = 0; i < rows.size(); ++i) out[i] = scratch[rows[i] - first];
      return;
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::memcpy(out + i * dim, scratch + (rows[i] - first) * dim, dim * sizeof(float));
    }
    return;
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint32_t si = ServerOf(t, S, rows[i]);
    const std::uint64_t at = plan.scratch_row[si] + (rows[i] - t.shards[si].begin - plan.lo[si]);
    std::memcpy(out + i * dim, scratch + at * dim, dim * sizeof(float));
  }
}

}  // namespace rdmaps::internal

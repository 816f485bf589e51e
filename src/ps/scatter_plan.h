// How a pull of scattered row ids is carried out, chosen per call from a
// cost model whose constants were measured per transport (docs/ps.md,
// "Scattered pulls: one-sided per row, or the span"):
//
//   per row:  the pull reader's READ of each run of consecutive ids (its
//             checked block, with its header); op count = runs;
//   span:     one range pull (through the same checked-block reader, so no
//             torn row) of each server's span [min id, max id] into the
//             client's registered scratch, then a gather of the wanted rows
//             into the caller's buffer; a few large READs and one copy per
//             row instead of an op per run.
//
// Both are one-sided (no server CPU) and verified block by block. The span
// wins when the wanted rows are dense in it (a million shuffled ids of a
// million-row table: every row); the per-row path when they are sparse (32
// ids of 65536 rows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "src/ps/directory.h"

namespace rdmaps::internal {

// Microseconds per op, per byte read and per row gathered.
struct PullCosts {
  double op_us;
  double byte_us;
  double gather_row_us;
};

// The constants for a transport kind (Endpoint::kind(): "tcp", "verbs",
// "fake"), measured with perf/ps_costs.sh: tcp on loopback, verbs on
// Soft-RoCE in the VM (tests/vm/ps_shapes_in_vm.sh) and set between that
// and an HCA's crossover (scatter_plan.cc says why; docs/ps.md).
PullCosts CostsOf(std::string_view transport_kind);

// Pulls with fewer ids take the per-row path without planning (the shapes
// that were fast before keep their code path).
inline constexpr std::size_t kSpanMinRows = 256;
// The most bytes of spans one pull READs into scratch.
inline constexpr std::uint64_t kSpanMaxBytes = std::uint64_t{64} << 20;

struct SpanPlan {
  bool use_span = false;
  std::vector<std::uint32_t> involved;  // servers, ascending
  // Per server (indexed by server): wanted shard-local rows [lo, hi] and
  // where that span starts in scratch (rows), for involved servers.
  std::vector<std::uint64_t> lo, hi, scratch_row;
  std::uint64_t scratch_rows = 0;
  double per_row_us = 0, span_us = 0;  // the model's estimates
};

// The largest of `ids` (0 when empty), without a branch per id: the
// client's range check of a million ids costs a pass over them, not more.
std::uint64_t MaxId(std::span<const std::uint64_t> ids);

// The span of `ids` and the runs of consecutive ids they make (each id not
// one more than the one before it starts a run), in one pass without a
// branch per id. All 0 when empty.
struct IdSummary {
  std::uint64_t min = 0, max = 0, runs = 0;
};
IdSummary SummarizeIds(std::span<const std::uint64_t> ids);

// Plans a pull of `rows` (each < t.info.rows) of `t` on `num_servers`.
// `summary`: SummarizeIds(rows) when the caller has it (one server needs
// no other pass over the ids).
SpanPlan PlanScatteredPull(const RemoteTable& t, std::uint32_t num_servers,
                           std::span<const std::uint64_t> rows, const PullCosts& costs,
                           const IdSummary* summary = nullptr);

// out[i] = row rows[i] of the span the plan put in `scratch`.
void GatherFromSpans(const RemoteTable& t, std::uint32_t num_servers, const SpanPlan& plan,
                     std::span<const std::uint64_t> rows, const float* scratch, float* out);

}  // namespace rdmaps::internal

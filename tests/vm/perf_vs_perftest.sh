#!/usr/bin/env bash
# Benchmark (not a test): in ONE Soft-RoCE VM run, perftest (ib_read_lat,
# ib_atomic_lat, ib_read_bw, ib_write_bw) against rdmaps-perf
# --transport=verbs with the same sizes and iterations on the same rxe device;
# prints a table with ratios (ours / perftest): the median of ROUNDS rounds
# (default 3) in which the two run back to back (perf_guest.sh). Only compare
# figures from the same run: TCG emulation is slow and noisy.
#   tests/vm/perf_vs_perftest.sh [BUILD_DIR] [ITERS_LAT] [ITERS_BW] [ROUNDS]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
perf="$build/perf/rdmaps-perf/rdmaps-perf"
[[ -x "$perf" ]] || { echo "perf_vs_perftest.sh: build rdmaps-perf first ($perf missing)" >&2; exit 1; }
rounds="${4:-3}"
# A round took up to ~6 min at host load 12-16 (2026-12-02).
exec "$here/run_in_vm.sh" --build "$build" --timeout $((600 + 600 * rounds)) -- \
  "ROUNDS=$rounds sh $here/perf_guest.sh $perf ${2:-300} ${3:-200}"

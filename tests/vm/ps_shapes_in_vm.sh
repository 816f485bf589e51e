#!/usr/bin/env bash
# Benchmark (not a test): perf/ps-shapes on verbs in one Soft-RoCE VM run
# (server and worker processes on rxe0), ROUNDS rounds; the per-op, per-byte
# and per-gathered-row costs of scattered pulls on verbs come from these
# figures (docs/ps.md, "Scattered pulls"; perf/ps_vs_stream.sh --costs-from).
#   tests/vm/ps_shapes_in_vm.sh [BUILD_DIR] [ROUNDS] [SECONDS_PER_SHAPE]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
shapes="$build/perf/ps-shapes/ps-shapes"
[[ -x "$shapes" ]] || { echo "ps_shapes_in_vm.sh: build ps-shapes first ($shapes missing)" >&2; exit 1; }
exec "$here/run_in_vm.sh" --build "$build" --timeout 1500 -- \
  "sh $here/ps_shapes_guest.sh $shapes ${2:-3} ${3:-0.3}"

#!/usr/bin/env bash
# Benchmark (not a test): perf/ps-bench on verbs, in one Soft-RoCE VM run. The
# ps server, the client and the raw endpoint pair all use rxe0; each ps op is
# compared with raw verbs ops of the same bytes in the same run (ratios only:
# TCG emulation is slow and noisy).
#   tests/vm/ps_bench_in_vm.sh [BUILD_DIR] [ITERS] [extra ps-bench flags...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
iters="${2:-200}"
shift $(( $# > 2 ? 2 : $# ))
bench="$build/perf/ps-bench/ps-bench"
[[ -x "$bench" ]] || { echo "ps_bench_in_vm.sh: build ps-bench first ($bench missing)" >&2; exit 1; }
exec "$here/run_in_vm.sh" --build "$build" --timeout 1500 -- \
  "$bench --transport=verbs --host=\$RDMAPS_TEST_VERBS_ADDR --iters=$iters --apply_mib=16 $*"

#!/usr/bin/env bash
# Long fuzzing of every tests/fuzz target: builds the libFuzzer binaries with
# clang (build-fuzz/, RDMAPS_FUZZ=ON; ASan+UBSan inside the binaries) and runs
# each for at least RDMAPS_FUZZ_RUNS executions (default 10^6), starting from
# the committed corpus. New interesting inputs go to build-fuzz/soak/<name>/
# (copy the small meaningful ones into tests/fuzz/corpus/<name>/ by hand); a
# crash leaves build-fuzz/soak/crash-* and makes the script exit 1.
#
#   scripts/fuzz-soak.sh                 every target, 10^6 runs each
#   scripts/fuzz-soak.sh push_slot       only the named targets
#   RDMAPS_FUZZ_RUNS=10000000 RDMAPS_FUZZ_MAX_SECONDS=3600 scripts/fuzz-soak.sh
#
# Prints one line per target: executions, seconds, corpus size, finding or not.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build-fuzz"
runs="${RDMAPS_FUZZ_RUNS:-1000000}"
max_seconds="${RDMAPS_FUZZ_MAX_SECONDS:-1800}"  # per target, a safety net
jobs="${RDMAPS_JOBS:-$(nproc)}"
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=()
  for f in "$here"/tests/fuzz/*_fuzz.cc; do
    n="$(basename "$f" _fuzz.cc)"
    targets+=("$n")
  done
fi

cmake -S "$here" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DRDMAPS_FUZZ=ON \
  ${CCACHE_BASEDIR:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache} \
  -DRDMAPS_BUILD_PERF=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz

status=0
mkdir -p "$build/soak"
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/${t}_fuzz"
  [[ -x "$bin" ]] || { echo "fuzz-soak: no target $t" >&2; exit 2; }
  out="$build/soak/$t"
  mkdir -p "$out"
  log="$build/soak/$t.log"
  start=$(date +%s)
  if ASAN_OPTIONS=detect_leaks=1 "$bin" -runs="$runs" -max_total_time="$max_seconds" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/soak/" \
      "$out" "$here/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    verdict="no finding"
  else
    verdict="FINDING (see $log)"
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' || true)
  printf '%-12s %10s execs %5ss  corpus %4s new inputs  %s\n' "$t" "${execs:-?}" \
    "$(($(date +%s) - start))" "$(ls "$out" | wc -l)" "$verdict"
done
exit $status

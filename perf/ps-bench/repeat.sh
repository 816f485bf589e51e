#!/usr/bin/env bash
# Runs ps-bench N times and prints, per op and shape, the p50 ratio ps/raw of
# every run and their median: on a shared, noisy machine one run can land in
# a slow mode (of the raw baseline or of the ps op); the median of several is
# the figure to quote, the spread says how noisy the box was.
#   perf/ps-bench/repeat.sh N build/perf/ps-bench/ps-bench [ps-bench flags...]
#   perf/ps-bench/repeat.sh N tests/vm/ps_bench_in_vm.sh build 200 [flags...]
set -euo pipefail
runs="$1"
shift
for ((i = 0; i < runs; ++i)); do
  "$@" 2>/dev/null | awk '$1 == "pull" || $1 == "push" { print $1 " " $2 " " $3 "\t" $8 }'
done | awk -F'\t' '
  { r[$1] = r[$1] " " $2; n[$1]++; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
  END {
    printf "%-24s %8s   %s\n", "op shape", "median", "p50 ratio ps/raw per run"
    for (i = 1; i <= k; ++i) {
      key = order[i]; m = split(r[key], v, " ")
      for (a = 1; a <= m; ++a) for (b = a + 1; b <= m; ++b) if (v[b] < v[a]) { t = v[a]; v[a] = v[b]; v[b] = t }
      med = (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
      printf "%-24s %8.2f  %s\n", key, med, r[key]
    }
  }'

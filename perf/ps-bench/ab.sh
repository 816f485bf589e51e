#!/usr/bin/env bash
# A/B of two ps-bench binaries (e.g. main against a change): runs them in
# alternation N times each with the same flags, so both meet the same moods
# of a shared machine, and prints per op and shape the median p50 ratio
# ps/raw and the median ps p50 latency (us) of each.
#   git worktree add /tmp/base HEAD~1 && cmake -S /tmp/base -B /tmp/base/build -G Ninja \
#       -DRDMAPS_BUILD_TESTS=OFF -DRDMAPS_BUILD_TOOLS=OFF && ninja -C /tmp/base/build ps-bench
#   perf/ps-bench/ab.sh 7 /tmp/base/build/perf/ps-bench/ps-bench \
#       build/perf/ps-bench/ps-bench --transport=tcp --iters=2000
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 N A_PS_BENCH B_PS_BENCH [ps-bench flags...]" >&2
  exit 2
fi
runs="$1" a="$2" b="$3"
shift 3
for ((i = 0; i < runs; ++i)); do
  for side in A B; do
    bin="$a"
    [[ $side == B ]] && bin="$b"
    "$bin" "$@" 2>/dev/null |
      awk -v side="$side" '$1 == "pull" || $1 == "push" { print side "\t" $1 " " $2 " " $3 "\t" $8 "\t" $4 }'
  done
done | awk -F'\t' '
  function median(s,    v, m, x, y, t) {
    m = split(s, v, " ")
    for (x = 1; x <= m; ++x) for (y = x + 1; y <= m; ++y) if (v[y] + 0 < v[x] + 0) { t = v[x]; v[x] = v[y]; v[y] = t }
    return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
  }
  { ratio[$1, $2] = ratio[$1, $2] " " $3; lat[$1, $2] = lat[$1, $2] " " $4
    if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
  END {
    printf "%-24s %9s %9s %10s %10s\n", "op shape", "A ratio", "B ratio", "A p50 us", "B p50 us"
    for (i = 1; i <= k; ++i) {
      key = order[i]
      printf "%-24s %9.2f %9.2f %10.1f %10.1f\n", key, median(ratio["A", key]), median(ratio["B", key]),
             median(lat["A", key]), median(lat["B", key])
    }
  }'

#!/usr/bin/env bash
# The fault matrix as a soak (issue 17): runs tests/ps/fault_matrix.cc's
# cells (ps_fault_matrix_test: fake and tcp) for many seeds, one process per
# seed under a timeout, and prints the seed of every failure and a summary
# table per cell and transport (runs, failures, failover time p50/max).
# Each seed makes 15 faults: kill_primary, kill_primary_checkpoint,
# kill_backup and kill_both_restore on fake and tcp kill 1, 1, 1 and 2
# servers, workers_with_replication on fake and tcp a primary and a worker,
# primary_cut_off on fake cuts a link; --seeds 4 already makes more than 50.
#
#   scripts/fault-soak.sh [--build DIR] [--seeds N] [--first S] [--master M] [--timeout SECS]
#
# Seeds are M*1000 + S .. M*1000 + S + N - 1 (M, the master seed, default
# the date's day number), so a run is reproduced by its master seed and a
# failure by RDMAPS_FAULT_SOAK=1 RDMAPS_FAULT_SEEDS=<seed> ps_fault_matrix_test
# (RDMAPS_FAULT_SOAK=1 also runs the cell ctest skips, see docs/ps.md).
# Exit 0 when every seed passed, 1 otherwise.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
seeds=10
first=0
master="$(( $(date -u +%s) / 86400 % 1000 ))"
per_run=240
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --first) first="$2"; shift 2 ;;
    --master) master="$2"; shift 2 ;;
    --timeout) per_run="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "fault-soak.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$seeds" =~ ^[0-9]+$ && "$first" =~ ^[0-9]+$ && "$master" =~ ^[0-9]+$ && "$per_run" =~ ^[0-9]+$ ]] ||
  { echo "fault-soak.sh: --seeds, --first, --master and --timeout take whole numbers" >&2; exit 2; }
bin="$build/tests/ps/ps_fault_matrix_test"
[[ -x "$bin" ]] || { echo "fault-soak.sh: build ps_fault_matrix_test first ($bin missing)" >&2; exit 2; }

out="$(mktemp -d "${TMPDIR:-/tmp}/rdmaps-fault-soak.XXXXXX")"
trap 'rm -rf "$out"' EXIT
failed=()
start=$SECONDS
echo "fault-soak: master seed $master, seeds $((master * 1000 + first))..$((master * 1000 + first + seeds - 1)), $bin"
for ((k = first; k < first + seeds; ++k)); do
  seed=$((master * 1000 + k))
  log="$out/seed-$seed.log"
  rc=0
  RDMAPS_FAULT_SOAK=1 RDMAPS_FAULT_SEEDS="$seed" timeout "$per_run" "$bin" --gtest_color=no >"$log" 2>&1 || rc=$?
  grep '^FAULT-MATRIX ' "$log" >>"$out/lines" || true
  if ((rc != 0)); then
    failed+=("$seed")
    why="$(grep -E '^\[  FAILED  \] Backends' "$log" | sed 's/, where.*//' | sort -u | head -5 | tr '\n' ' ')"
    ((rc == 124)) && why="timed out after ${per_run}s; $why"
    echo "fault-soak: seed $seed FAILED (exit $rc): $why"
    cp "$log" "${TMPDIR:-/tmp}/rdmaps-fault-soak-seed-$seed.log"
    echo "fault-soak:   log kept in ${TMPDIR:-/tmp}/rdmaps-fault-soak-seed-$seed.log;" \
         "reproduce: RDMAPS_FAULT_SOAK=1 RDMAPS_FAULT_SEEDS=$seed $bin"
  else
    echo "fault-soak: seed $seed ok"
  fi
done

# The summary: per cell and transport, runs, and the failover
# time (kill to the first acknowledged push after it) where it applies.
echo
/usr/bin/awk -v failed="${#failed[@]}" -v secs="$((SECONDS - start))" '
  function val(k,   i, kv) { for (i = 2; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
  {
    key = val("cell") " " val("transport")
    runs[key]++
    kills += (val("cell") == "kill_both_restore" || val("cell") == "workers_with_replication") ? 2 : 1
    f = val("failover_ms")
    if (f != "" && f >= 0) { n[key]++; ms[key, n[key]] = f + 0 }
  }
  END {
    printf "%-26s %-5s %5s %14s %14s\n", "cell", "trans", "runs", "failover p50", "failover max"
    for (key in runs) {
      split(key, p, " ")
      m = n[key]; p50 = "-"; mx = "-"
      if (m > 0) {
        for (i = 1; i <= m; ++i) v[i] = ms[key, i]
        for (i = 2; i <= m; ++i) { x = v[i]; j = i - 1; while (j > 0 && v[j] > x) { v[j + 1] = v[j]; --j } v[j + 1] = x }
        p50 = sprintf("%.2f ms", v[int((m + 1) / 2)]); mx = sprintf("%.2f ms", v[m])
      }
      printf "%-26s %-5s %5d %14s %14s\n", p[1], p[2], runs[key], p50, mx
    }
    printf "passed cells: %d, faults (servers and workers killed, links cut): %d, failed seeds: %d, %d s\n", NR, kills, failed, secs > totals
  }' totals="$out/totals" "$out/lines" 2>/dev/null | { read -r head; echo "$head"; sort; } || true
cat "$out/totals" 2>/dev/null || true
if ((${#failed[@]})); then
  echo "fault-soak: FAILED seeds: ${failed[*]}"
  exit 1
fi
echo "fault-soak: every seed passed"

#!/bin/sh
# Runs INSIDE the Soft-RoCE VM (see perf_vs_perftest.sh): perftest and
# rdmaps-perf --transport=verbs with matching sizes, iterations and depths on
# the one rxe device, and prints a table with ratios. Each measure runs in
# ROUNDS rounds (default 3), perftest and rdmaps-perf back to back in every
# round (which goes first alternates): the table gives each tool's median
# and the median of the per-round ratios, so a swing of the (shared) host
# between rounds hits both tools alike.
# A benchmark, not a test: it exits non-zero only when a tool fails to run.
#   [ROUNDS=N] perf_guest.sh RDMAPS_PERF [ITERS_LAT] [ITERS_BW]
perf="$1"
n_lat="${2:-300}"
n_bw="${3:-200}"
rounds="${ROUNDS:-3}"
addr="${RDMAPS_TEST_VERBS_ADDR:?run inside the VM harness}"
dev=rxe0
tmp="${TMPDIR:-/var/tmp}/rdmaps-perf.$$"
mkdir -p "$tmp"

# perftest NAME SIZE ITERS COLUMN: runs server and client over rdma_cm, prints
# COLUMN of the row for SIZE from the client's table.
perftest() {
  tool="$1"; size="$2"; iters="$3"; col="$4"; extra="$5"
  args="-d $dev -R -n $iters $extra"
  [ "$size" != "-" ] && args="$args -s $size"
  timeout 120 "$tool" $args >"$tmp/srv.txt" 2>&1 &
  srv=$!
  i=0
  # The server needs a moment to listen; retry the client until it connects.
  while [ $i -lt 30 ]; do
    if timeout 120 "$tool" $args "$addr" >"$tmp/cli.txt" 2>&1; then break; fi
    i=$((i + 1)); sleep 0.3
  done
  wait $srv
  awk -v s="${size#-}" -v c="$col" '$1 ~ /^[0-9]+$/ && (s == "" || $1 == s) && NF >= c {print $c; exit}' "$tmp/cli.txt"
}

# ours OP MODE SIZE ITERS COLUMN
ours() {
  op="$1"; mode="$2"; size="$3"; iters="$4"; col="$5"
  # Busy polling, like perftest's default (rdmaps' default spins 50 us, then
  # sleeps in the kernel).
  timeout 300 "$perf" --transport=verbs --loopback --bind="$addr" --op="$op" --mode="$mode" \
    -s "$size" -n "$iters" --busy_poll_us=10000000 >"$tmp/ours.txt" 2>&1
  v=$(awk -v s="$size" -v c="$col" '$1 == s && NF >= c {print $c; exit}' "$tmp/ours.txt")
  if [ -z "$v" ]; then cat "$tmp/ours.txt" >&2; v="?"; fi
  grep -q "^rdmaps-perf: " "$tmp/ours.txt" && grep "^rdmaps-perf: " "$tmp/ours.txt" | sed 's/^/  note: /' >&2
  echo "$v"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "?" }'; }
# median of the words of $1 ("?" when none is a number)
median() { echo "$1" | tr ' ' '\n' | awk '$1 + 0 > 0' | sort -g | awk '{v[NR] = $1} END { if (NR == 0) print "?"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "rdmaps-perf vs perftest on $dev ($addr), lat iters $n_lat, bw iters $n_bw, $rounds rounds"
printf "%-28s %14s %14s %8s %-8s %s\n" "measure" "perftest" "rdmaps" "ratio" "target" "per-round ratios"
# measure NAME TARGET "PERFTEST ARGS" "OURS ARGS": ROUNDS alternating rounds.
measure() {
  name="$1"; target="$2"; ps=""; os=""; rs=""; r=0
  while [ $r -lt "$rounds" ]; do
    if [ $((r % 2)) -eq 0 ]; then p=$(perftest $3); o=$(ours $4); else o=$(ours $4); p=$(perftest $3); fi
    ps="$ps $p"; os="$os $o"; rs="$rs $(ratio "$o" "$p")"
    r=$((r + 1))
  done
  printf "%-28s %14s %14s %8s %-8s%s\n" "$name" "$(median "$ps")" "$(median "$os")" "$(median "$rs")" "$target" "$rs"
}

measure "READ 64 B lat typ [us]" "<= 1.2" "ib_read_lat 64 $n_lat 5" "read lat 64 $n_lat 5"
measure "FETCH_ADD lat typ [us]" "<= 1.2" "ib_atomic_lat - $n_lat 5" "atomic lat 8 $n_lat 5"
for s in 65536 1048576; do
  measure "READ $s B bw [MiB/s]" ">= 0.8" "ib_read_bw $s $n_bw 4" "read bw $s $n_bw 4"
  measure "WRITE $s B bw [MiB/s]" ">= 0.8" "ib_write_bw $s $n_bw 4" "write bw $s $n_bw 4"
done
rm -rf "$tmp"

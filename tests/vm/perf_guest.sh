#!/bin/sh
# Runs INSIDE the Soft-RoCE VM (see perf_vs_perftest.sh): perftest and
# rdmaps-perf --transport=verbs with matching sizes, iterations and depths on
# the one rxe device, one after the other, and prints a table with ratios.
# A benchmark, not a test: it exits non-zero only when a tool fails to run.
#   perf_guest.sh RDMAPS_PERF [ITERS_LAT] [ITERS_BW]
perf="$1"
n_lat="${2:-300}"
n_bw="${3:-200}"
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

echo "rdmaps-perf vs perftest on $dev ($addr), lat iters $n_lat, bw iters $n_bw"
printf "%-28s %14s %14s %8s %s\n" "measure" "perftest" "rdmaps" "ratio" "target"
row() { printf "%-28s %14s %14s %8s %s\n" "$1" "$2" "$3" "$(ratio "$3" "$2")" "$4"; }

p=$(perftest ib_read_lat 64 "$n_lat" 5); o=$(ours read lat 64 "$n_lat" 5)
row "READ 64 B lat typ [us]" "$p" "$o" "<= 1.2"
p=$(perftest ib_atomic_lat - "$n_lat" 5); o=$(ours atomic lat 8 "$n_lat" 5)
row "FETCH_ADD lat typ [us]" "$p" "$o" "<= 1.2"
for s in 65536 1048576; do
  p=$(perftest ib_read_bw "$s" "$n_bw" 4); o=$(ours read bw "$s" "$n_bw" 4)
  row "READ $s B bw [MiB/s]" "$p" "$o" ">= 0.8"
  p=$(perftest ib_write_bw "$s" "$n_bw" 4); o=$(ours write bw "$s" "$n_bw" 4)
  row "WRITE $s B bw [MiB/s]" "$p" "$o" ">= 0.8"
done
rm -rf "$tmp"

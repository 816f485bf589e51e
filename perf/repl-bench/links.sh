#!/usr/bin/env bash
# repl-bench on shaped links: replicated against unreplicated push throughput
# where the wire, not this machine's CPU, is the bound.
#
# On tcp loopback every server of the job shares this machine's two cores, so
# a replicated push, which costs the servers twice the CPU (the log's send
# and receive copies, the backup's apply), runs at about half the rate
# whenever the CPU is the bound (docs/perf.md, "repl-bench"). On a cluster
# each server has its own CPU and NIC. This script gives the primary and the
# backup a link each: loopback traffic to 127.0.0.2 (the primary: the
# worker's pushes) and to 127.0.0.3 (the backup: the primary's log) goes
# through an htb class of RATE, everything else is unshaped. Per rate, in one
# run: iperf3 through the primary's link (the yardstick: what one TCP stream
# gets through it), then repl-bench, both modes, with the primary and the
# backup on those addresses. Prints, per size and rate, both push rates in
# MB/s, each as a fraction of the stream, and the replicated/unreplicated
# ratio (the issue's target is >= 0.9).
#
#   perf/repl-bench/links.sh [BUILD_DIR]
#   RATES_4M="1gbit 2gbit 4gbit" RATES_1K="100mbit 200mbit" DURATION=2 REPEAT=3 \
#     OUT=/tmp/links perf/repl-bench/links.sh build
#
# Needs root (tc qdisc on lo), tc (iproute2) and iperf3; scripts/dev.sh deps
# installs both. It refuses to run when lo already has a root qdisc other
# than noqueue, and removes its own on every exit. A benchmark, not a test:
# exits 0 when every run succeeded, whatever the ratios. Raw outputs stay in OUT.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-build}"
[[ "$build" = /* ]] || build="$here/$build"
bench="$build/perf/repl-bench/repl-bench"
rates_4m="${RATES_4M:-1gbit 2gbit 4gbit 8gbit}"
rates_1k="${RATES_1K:-100mbit 200mbit 400mbit}"
duration="${DURATION:-2}"
repeat="${REPEAT:-3}"
out="${OUT:-$(mktemp -d /tmp/repl_links.XXXXXX)}"
mkdir -p "$out"
py=/usr/bin/python3
primary=127.0.0.2
backup=127.0.0.3

die() { echo "links.sh: $*" >&2; exit 2; }
[[ "$duration" =~ ^[1-9][0-9]{0,3}$ ]] || die "DURATION='$duration': whole seconds, 1 to 9999"
[[ "$repeat" =~ ^[1-9][0-9]{0,2}$ ]] || die "REPEAT='$repeat': a count, 1 to 999"
[[ -x "$bench" ]] || die "no $bench: build it first (cmake --build $build --target repl-bench)"
command -v tc >/dev/null || die "tc is missing (apt-get install iproute2)"
command -v iperf3 >/dev/null || die "iperf3 is missing (apt-get install iperf3, or scripts/dev.sh deps)"
[[ $(id -u) -eq 0 ]] || die "shaping lo needs root (tc qdisc add dev lo ...)"
if tc qdisc show dev lo | grep -q "root" && ! tc qdisc show dev lo | grep -q "^qdisc noqueue"; then
  die "lo already has a root qdisc ($(tc qdisc show dev lo | head -1)); remove it first"
fi

unshape() { tc qdisc del dev lo root 2>/dev/null || true; }
trap unshape EXIT

shape() {  # RATE
  unshape
  tc qdisc add dev lo root handle 1: htb default 99 r2q 1000
  # (Unshaped: the worker's side, the control blocks, the coordinator.)
  tc class add dev lo parent 1: classid 1:99 htb rate 100gbit burst 16mb cburst 16mb quantum 60000
  local c
  for c in 2 3; do
    tc class add dev lo parent 1: classid "1:$c" htb rate "$1" ceil "$1" burst 4mb cburst 4mb \
      quantum 60000
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst "127.0.0.$c/32" \
      flowid "1:$c"
  done
}

# shellcheck source=perf/lib/stream.sh
source "$here/perf/lib/stream.sh"

run() {  # BYTES RATE
  local tag="$1.$2"
  if [[ "$2" == none ]]; then unshape; else shape "$2"; fi
  # One stream to the primary's address, through its link.
  iperf_stream "$primary" "$duration" "$out/stream.$tag.json" "$out/stream.$tag.err"
  "$bench" --json --drills=0 --catchup_mib=0 --push_bytes_list="$1" --repeat="$repeat" \
    --seconds="$duration" --primary_host="$primary" --backup_host="$backup" \
    >"$out/bench.$tag.json" 2>"$out/bench.$tag.err" ||
    die "repl-bench failed for $1 bytes at $2: see $out/bench.$tag.err"
  echo "$1 $2" >>"$out/runs"
}

: >"$out/runs"
load_before="$(cut -d' ' -f1 /proc/loadavg)"
for r in $rates_4m none; do run 4194304 "$r"; done
for r in $rates_1k none; do run 1024 "$r"; done
unshape
load_after="$(cut -d' ' -f1 /proc/loadavg)"

"$py" - "$out" "$load_before" "$load_after" <<'EOF'
import json, sys
out, before, after = sys.argv[1:4]
print(f"repl-bench on shaped links (primary 127.0.0.2, backup 127.0.0.3, each its own "
      f"htb class of the rate), load average {before} before, {after} after; raw: {out}")
print(f"{'push bytes':>10} {'link':>8} {'stream MB/s':>11} {'r=1 MB/s':>9} {'r=1/stream':>10} "
      f"{'r=2 MB/s':>9} {'r=2/stream':>10} {'r=2/r=1':>8}")
for line in open(f"{out}/runs"):
    size, rate = line.split()
    tag = f"{size}.{rate}"
    s = json.load(open(f"{out}/stream.{tag}.json"))["end"]["sum_received"]["bits_per_second"] / 8e6
    p = json.load(open(f"{out}/bench.{tag}.json"))["push"][0]
    one, two = p["unreplicated_per_s"] * p["bytes"] / 1e6, p["replicated_per_s"] * p["bytes"] / 1e6
    print(f"{size:>10} {rate:>8} {s:11.0f} {one:9.1f} {one / s:10.3f} {two:9.1f} {two / s:10.3f} "
          f"{p['ratio']:8.3f}")
EOF

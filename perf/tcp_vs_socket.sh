#!/usr/bin/env bash
# Compares the rdmaps tcp backend with plain TCP sockets on this machine, in
# one run: rdmaps-perf --transport=tcp --loopback --op=read against
# socket-baseline --loopback, same sizes, latency and bandwidth, several
# repetitions (alternating which tool goes first), medians, ratios.
#
#   perf/tcp_vs_socket.sh [BUILD_DIR]        (default: build)
#
# Builds nothing: build rdmaps-perf and socket-baseline first, e.g.
#   cmake --build build --target rdmaps-perf socket-baseline
# Environment: REPS (default 5), DURATION seconds per size and mode (default 1),
# SIZES (default 64,4K,64K,1M), TX_DEPTH (default 128), OUT (directory for the
# raw JSON; default a temporary one, kept and printed).
#
# Targets (from the task): 1 MiB READ bandwidth >= 0.8x the plain stream;
# 64 B READ round-trip latency (median) <= 1.3x the plain ping-pong. The
# script reports MET/MISSED; it is a benchmark, not a test, and exits 0 when
# every run succeeded whatever the ratios.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build}"
[[ "$build" = /* ]] || build="$here/$build"
perf="$build/perf/rdmaps-perf/rdmaps-perf"
base="$build/perf/socket-baseline/socket-baseline"
for tool in "$perf" "$base"; do
  if [[ ! -x "$tool" ]]; then
    echo "tcp_vs_socket.sh: $tool is missing; build it first:" >&2
    echo "  cmake --build $build --target rdmaps-perf socket-baseline" >&2
    exit 2
  fi
done

reps="${REPS:-5}"
duration="${DURATION:-1}"
sizes="${SIZES:-64,4K,64K,1M}"
tx_depth="${TX_DEPTH:-128}"
out="${OUT:-$(mktemp -d /tmp/tcp_vs_socket.XXXXXX)}"
mkdir -p "$out"
# Each run has its own deadline on top of the tools' own --timeout.
limit=$((60 + 20 * reps))

run_tcp() {
  timeout "$limit" "$perf" --transport=tcp --loopback --op=read -s "$sizes" -D "$duration" \
    -t "$tx_depth" --output=json --timeout=20 >"$out/tcp.$1.json"
}
run_socket() {
  timeout "$limit" "$base" --loopback -s "$sizes" -D "$duration" --output=json --timeout=20 \
    >"$out/socket.$1.json"
}

echo "tcp_vs_socket: $reps repetitions, ${duration}s per size and mode, sizes $sizes; raw JSON in $out" >&2
for ((r = 1; r <= reps; r++)); do
  if ((r % 2)); then run_tcp "$r"; run_socket "$r"; else run_socket "$r"; run_tcp "$r"; fi
  echo "  repetition $r/$reps done" >&2
done

python3 - "$out" "$reps" <<'PY'
import json, statistics, sys

out, reps = sys.argv[1], int(sys.argv[2])

def load(kind):
    docs = [json.load(open(f"{out}/{kind}.{r}.json")) for r in range(1, reps + 1)]
    lat, bw = {}, {}
    for d in docs:
        for row in d["latency"]:
            lat.setdefault(row["bytes"], []).append(row)
        for row in d["bandwidth"]:
            bw.setdefault(row["bytes"], []).append(row)
    return lat, bw

def med(rows, key):
    return statistics.median(r[key] for r in rows)

def human(n):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"

tcp_lat, tcp_bw = load("tcp")
sock_lat, sock_bw = load("socket")
sizes = sorted(set(tcp_lat) | set(tcp_bw))

print(f"Medians of {reps} runs. Latency: t_typical (median round trip) and p99, usec; "
      "bandwidth: BW average, MiB/s.")
print()
print("| size | READ lat tcp | ping-pong socket | ratio | READ p99 tcp | p99 socket "
      "| READ bw tcp | stream socket | ratio |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
ratios = {}
for s in sizes:
    lt, ls = med(tcp_lat[s], "t_typical_usec"), med(sock_lat[s], "t_typical_usec")
    pt, ps = med(tcp_lat[s], "p99_usec"), med(sock_lat[s], "p99_usec")
    bt, bs = med(tcp_bw[s], "bw_avg_mib_s"), med(sock_bw[s], "bw_avg_mib_s")
    ratios[s] = (lt / ls, bt / bs)
    print(f"| {human(s)} | {lt:.2f} | {ls:.2f} | {lt / ls:.2f}x | {pt:.2f} | {ps:.2f} "
          f"| {bt:.1f} | {bs:.1f} | {bt / bs:.2f}x |")
print()
if 1 << 20 in ratios:
    r = ratios[1 << 20][1]
    print(f"target 1 MiB READ bw >= 0.80x stream:    {r:.2f}x  {'MET' if r >= 0.8 else 'MISSED'}")
if 64 in ratios:
    r = ratios[64][0]
    print(f"target 64 B READ latency <= 1.30x ping-pong: {r:.2f}x  {'MET' if r <= 1.3 else 'MISSED'}")
PY

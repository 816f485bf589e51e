#!/usr/bin/env bash
# Issue 15's table: rdmaps against a plain TCP stream on this machine, in one
# run. Per round (ROUNDS of them, the order rotating so that every tool meets
# the same moods of a shared machine):
#   - iperf3 -c 127.0.0.1 -l 1M (one stream, DURATION seconds): the yardstick;
#   - ps-shapes: a server and a worker process (tcp loopback, registered
#     buffers, ASP): 4 MiB dense push until applied (Push + Flush), 4 MiB
#     PushPull, 4 MiB dense range pull, 1M x 1-float range pull, 1M shuffled
#     ids x 1 float scattered pull, and the small shapes that were fast before;
#   - rdmaps-perf --op=read --mode=bw -s 1M: the tcp backend's 1 MiB READ
#     (server and client processes);
#   - the same two from BASELINE_DIR when given (e.g. a build of main), so the
#     change and its baseline are A/B'd in the same run.
# Then prints medians, the ratios to the stream and the issue's targets.
#
#   perf/ps_vs_stream.sh [BUILD_DIR] [BASELINE_DIR]
#     BUILD_DIR: a build tree (default build/): BUILD/perf/ps-shapes/ps-shapes
#       and BUILD/perf/rdmaps-perf/rdmaps-perf
#     BASELINE_DIR: a build tree of the same layout, or a directory holding
#       ps-shapes and rdmaps-perf
#   ROUNDS=5 DURATION=2 OUT=/tmp/x SECONDS_PER_SHAPE=0.4 perf/ps_vs_stream.sh build
#
# A benchmark, not a test: exits 0 when every run succeeded whatever the
# ratios. Needs iperf3 (Debian's; scripts/dev.sh installs it). Raw outputs
# stay in OUT.
set -euo pipefail
# ps-shapes proves a job secret: a fresh one per run.
RDMAPS_JOB_SECRET="$(od -An -N16 -tx1 /dev/urandom | tr -d " \n")"
export RDMAPS_JOB_SECRET

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
abs() { [[ "$1" = /* ]] && echo "$1" || echo "$here/$1"; }
find_tool() {  # DIR NAME
  if [[ -x "$1/perf/$2/$2" ]]; then echo "$1/perf/$2/$2"; else echo "$1/$2"; fi
}
build="$(abs "${1:-build}")"
declare -A shapes_bin perf_bin
shapes_bin[new]="$(find_tool "$build" ps-shapes)"
perf_bin[new]="$(find_tool "$build" rdmaps-perf)"
sides=(new)
if [[ $# -ge 2 ]]; then
  base="$(abs "$2")"
  shapes_bin[base]="$(find_tool "$base" ps-shapes)"
  perf_bin[base]="$(find_tool "$base" rdmaps-perf)"
  sides=(base new)
fi
for side in "${sides[@]}"; do
  for tool in "${shapes_bin[$side]}" "${perf_bin[$side]}"; do
    if [[ ! -x "$tool" ]]; then
      echo "ps_vs_stream.sh: $tool is missing; build it: cmake --build BUILD --target ps-shapes rdmaps-perf" >&2
      exit 2
    fi
  done
done
if ! command -v iperf3 >/dev/null; then
  echo "ps_vs_stream.sh: iperf3 is missing (apt-get install iperf3, or scripts/dev.sh deps)" >&2
  exit 2
fi

rounds="${ROUNDS:-5}"
duration="${DURATION:-2}"
per_shape="${SECONDS_PER_SHAPE:-0.4}"
out="${OUT:-$(mktemp -d /tmp/ps_vs_stream.XXXXXX)}"
mkdir -p "$out"
py=/usr/bin/python3

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (up to 20 s) for FILE to contain a line matching REGEX; prints field FIELD.
wait_for() {  # FILE AWK_PATTERN FIELD
  for _ in $(seq 200); do
    local v
    v="$(awk "$2 { print \$$3; exit }" "$1" 2>/dev/null || true)"
    if [[ -n "$v" ]]; then echo "$v"; return 0; fi
    sleep 0.1
  done
  echo "ps_vs_stream.sh: no address in $1" >&2
  return 1
}

run_stream() {  # ROUND
  local port pid
  port="$(free_port)"
  iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  timeout $((duration + 30)) iperf3 -c 127.0.0.1 -p "$port" -l 1M -t "$duration" -J \
    >"$out/stream.$1.json" 2>"$out/stream.$1.err"
  wait "$pid"
}

run_shapes() {  # SIDE ROUND
  local srv="$out/server.$1.$2.log" pid addr
  timeout 600 "${shapes_bin[$1]}" --role=server >"$srv" 2>&1 &
  pid=$!
  addr="$(wait_for "$srv" '/^address/' 2)"
  timeout 600 "${shapes_bin[$1]}" --role=worker --server="$addr" --seconds="$per_shape" \
    >"$out/shapes.$1.$2.txt" 2>"$out/shapes.$1.$2.err"
  wait "$pid"
}

run_read() {  # SIDE ROUND
  local srv="$out/perfsrv.$1.$2.log" pid addr
  timeout 120 "${perf_bin[$1]}" --transport=tcp --bind=127.0.0.1 >"$srv" 2>&1 &
  pid=$!
  addr="$(wait_for "$srv" '/listening on/' 3)"
  timeout 120 "${perf_bin[$1]}" --transport=tcp --op=read --mode=bw -s 1M -D "$duration" \
    --output=json "$addr" >"$out/read.$1.$2.json" 2>"$out/read.$1.$2.err"
  wait "$pid"
}

echo "ps_vs_stream: $rounds rounds (${sides[*]}), raw outputs in $out" >&2
steps=(stream)
for side in "${sides[@]}"; do steps+=("shapes:$side" "read:$side"); done
for ((r = 1; r <= rounds; r++)); do
  n=${#steps[@]}
  for ((k = 0; k < n; k++)); do
    step="${steps[$(((k + r) % n))]}"
    case "$step" in
      stream) run_stream "$r" ;;
      shapes:*) run_shapes "${step#shapes:}" "$r" ;;
      read:*) run_read "${step#read:}" "$r" ;;
    esac
  done
  echo "  round $r/$rounds done" >&2
done

"$py" - "$out" "$rounds" "${sides[@]}" <<'PY'
import json, statistics, sys

out, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median

stream = med(json.load(open(f"{out}/stream.{r}.json"))["end"]["sum_received"]["bits_per_second"] / 8e6
             for r in range(1, rounds + 1))

def shapes(side):
    rows = {}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/shapes.{side}.{r}.txt"):
            f = line.split()
            if len(f) != 8 or f[0] == "shape":
                continue
            rows.setdefault(f[0], []).append((float(f[4]), float(f[6]), float(f[7])))
    return {k: (med(v[0] for v in vs), med(v[1] for v in vs), med(v[2] for v in vs))
            for k, vs in rows.items()}

def read_bw(side):
    return med(json.load(open(f"{out}/read.{side}.{r}.json"))["bandwidth"][0]["bw_avg_mib_s"] * 1.048576
               for r in range(1, rounds + 1))

res = {s: shapes(s) for s in sides}
rd = {s: read_bw(s) for s in sides}
print(f"\nplain TCP stream (iperf3 -l 1M, one stream): {stream:.0f} MB/s (median of {rounds})\n")
# shape, label, target ratio (None: a fast shape, judged against the baseline), rate column
big = [("push_4m_applied", "4 MiB dense push, applied (Push + Flush)", 0.75, 2),
       ("pushpull_4m", "4 MiB PushPull (bytes both ways)", 0.75, 2),
       ("pull_4m", "4 MiB dense range pull", 0.8, 2),
       ("read_1m", "tcp backend 1 MiB READ (rdmaps-perf bw)", 0.8, None),
       ("pull_1m_x1", "1M x 1-float range pull (payload)", 0.5, 1),
       ("scatter_1m_x1", "1M shuffled ids x 1 float scattered pull (payload)", 0.15, 1)]
hdr = "| shape | " + " | ".join(f"{s} MB/s | {s} x stream" for s in sides) + " | target | |"
print(hdr)
print("|---|" + "---:|---:|" * len(sides) + "---:|---|")
for key, label, target, col in big:
    cells, last = [], None
    for s in sides:
        if key == "read_1m":
            rate = rd[s]
        elif key in res[s]:
            rate = res[s][key][col]
        else:
            cells += ["-", "-"]; continue
        last = rate / stream
        cells += [f"{rate:.0f}", f"{last:.2f}"]
    verdict = "" if last is None else ("MET" if last >= target else "MISSED")
    print(f"| {label} | " + " | ".join(cells) + f" | >= {target}x | {verdict} |")
small = ["pull_1k", "push_1k", "pull_64x64", "pull_256x256", "scatter_32x64",
         "push_4m_applied", "pushpull_4m", "pull_4m", "pull_1m_x1", "scatter_1m_x1"]
print("\n| shape | " + " | ".join(f"{s} p50 us" for s in sides) +
      (" | new / base |" if len(sides) == 2 else " |"))
print("|---|" + "---:|" * len(sides) + ("---:|" if len(sides) == 2 else ""))
for key in small:
    vals = [res[s].get(key, (float("nan"),))[0] for s in sides]
    extra = f" | {vals[1] / vals[0]:.2f}" if len(sides) == 2 else ""
    print(f"| {key} | " + " | ".join(f"{v:.1f}" for v in vals) + extra + " |")
PY

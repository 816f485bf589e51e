# shellcheck shell=bash
# Sourced by the perf scripts that measure against one plain TCP stream
# (perf/ps_vs_stream.sh, perf/repl-bench/links.sh). Needs iperf3, ss
# (iproute2) and Debian's /usr/bin/python3.

# A port free on HOST now (the kernel's pick for port 0).
free_port() {  # HOST
  /usr/bin/python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])' "$1"
}

# One iperf3 stream (-l 1M) to a one-shot server on HOST for SECONDS; its
# JSON report in JSON, its stderr in ERR.
iperf_stream() {  # HOST SECONDS JSON ERR
  local port pid
  port="$(free_port "$1")"
  iperf3 -s -1 -B "$1" -p "$port" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  timeout $(($2 + 30)) iperf3 -c "$1" -p "$port" -l 1M -t "$2" -J >"$3" 2>"$4"
  wait "$pid"
}

#!/usr/bin/env bash
# rdmaps-perf's job secret (docs/perf.md): no --job_token flag; a server
# started by hand with no secret writes a generated one to a 0600 file and
# removes it when it exits; a client without it is refused naming the
# sources, a client with RDMAPS_JOB_SECRET_FILE runs.
#   secret_test.sh RDMAPS_PERF
set -euo pipefail
tool="$1"
tmp="$(mktemp -d)"
trap 'kill "${srv_pid:-}" 2>/dev/null || true; rm -rf "$tmp"' EXIT
unset RDMAPS_JOB_SECRET RDMAPS_JOB_TOKEN RDMAPS_JOB_SECRET_FILE RDMAPS_INSECURE
export XDG_RUNTIME_DIR="$tmp/run"
mkdir -m 700 "$XDG_RUNTIME_DIR"
fail() { echo "FAIL: $*" >&2; exit 1; }

if "$tool" --loopback --job_token=x -n 1 >"$tmp/flag.txt" 2>&1; then
  fail "--job_token is still accepted"
fi

coproc SRV { exec timeout 60 "$tool" --transport=tcp --bind=127.0.0.1 -p 0 --timeout=20 2>&1; }
srv_pid=$SRV_PID
file="" addr=""
while [[ -z "$addr" ]]; do
  IFS= read -r -t 30 -u "${SRV[0]}" line || fail "the server printed no address"
  echo "server: $line"
  [[ "$line" =~ RDMAPS_JOB_SECRET_FILE=([^ ]+) ]] && file="${BASH_REMATCH[1]}"
  [[ "$line" =~ ^listening\ on\ ([^ ]+) ]] && addr="${BASH_REMATCH[1]}"
done
[[ -n "$file" && -f "$file" ]] || fail "no secret file announced"
[[ "$(stat -c %a "$file")" == 600 ]] || fail "secret file mode $(stat -c %a "$file")"
[[ "$file" == "$XDG_RUNTIME_DIR"/* ]] || fail "secret file $file not under XDG_RUNTIME_DIR"

if "$tool" --transport=tcp -n 5 -s 8 --mode=lat --timeout=20 "$addr" >"$tmp/bare.txt" 2>&1; then
  fail "a client without the secret ran"
fi
grep -q "RDMAPS_JOB_SECRET_FILE" "$tmp/bare.txt" || { cat "$tmp/bare.txt"; fail "no fix named"; }

RDMAPS_JOB_SECRET_FILE="$file" "$tool" --transport=tcp -n 5 -s 8 --mode=lat --timeout=20 \
  "$addr" >"$tmp/ok.txt" 2>&1 || { cat "$tmp/ok.txt"; fail "the client with the secret failed"; }
grep -Eq '^ *8 +5 ' "$tmp/ok.txt" || { cat "$tmp/ok.txt"; fail "no result row"; }

wait "$srv_pid" || fail "the server exited $?"
srv_pid=""
[[ ! -e "$file" ]] || fail "the server left $file behind"
echo "PASS"

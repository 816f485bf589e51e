#!/bin/sh
# Runs INSIDE the Soft-RoCE VM (see ps_shapes_in_vm.sh): perf/ps-shapes on
# verbs, a server and a worker process on the one rxe device, ROUNDS times,
# printing each round's table. perf/ps_vs_stream.sh's cost-constant
# derivation reads them (the same shapes as on tcp).
#   ps_shapes_guest.sh PS_SHAPES [ROUNDS] [SECONDS_PER_SHAPE]
shapes="$1"
rounds="${2:-3}"
per_shape="${3:-0.3}"
addr="${RDMAPS_TEST_VERBS_ADDR:?run inside the VM harness}"
tmp="${TMPDIR:-/var/tmp}/ps-shapes.$$"
mkdir -p "$tmp"
RDMAPS_JOB_SECRET="ps-shapes-in-vm-$$"
export RDMAPS_JOB_SECRET
status=0
r=1
while [ "$r" -le "$rounds" ]; do
  timeout 600 "$shapes" --role=server --transport=verbs --host="$addr" >"$tmp/srv.txt" 2>&1 &
  srv=$!
  a=""
  i=0
  while [ -z "$a" ] && [ $i -lt 300 ]; do
    a=$(awk '/^address/ { print $2; exit }' "$tmp/srv.txt")
    [ -z "$a" ] && sleep 0.1
    i=$((i + 1))
  done
  if [ -z "$a" ]; then cat "$tmp/srv.txt" >&2; exit 1; fi
  echo "round $r"
  timeout 900 "$shapes" --role=worker --transport=verbs --server="$a" --seconds="$per_shape" \
    --min_iters=3 || status=1
  wait $srv || status=1
  r=$((r + 1))
done
exit $status

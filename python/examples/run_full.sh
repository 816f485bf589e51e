#!/usr/bin/env bash
# The full-size runs of the two examples whose figures docs/python.md records:
#   1. the Fashion-MNIST CNN, 2 servers + 4 workers, under torchrun;
#   2. the same under rdmaps-local;
#   3. the factorization machine with a 10 M-row embedding table, 2 servers + 4
#      workers under rdmaps-local.
# Each prints its JSON report line (and the wall time of the whole job) to
# $OUT/<name>.json; the full logs go to $OUT/<name>.log.
#
#   python/examples/run_full.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR (default: build) is a configured and built tree (scripts/dev.sh
# build); OUT_DIR defaults to a new temporary directory. Takes about an hour
# on 2 busy cores. RUN_FULL_ONLY="cnn_torchrun fm" runs just those.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
out=${2:-$(mktemp -d /tmp/rdmaps-full.XXXXXX)}
mkdir -p "$out"
python=${PYTHON:-/usr/bin/python3}
only=${RUN_FULL_ONLY:-cnn_torchrun cnn_local fm}

export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
# torchrun's processes share one job secret (rdmaps-local makes its own).
export RDMAPS_JOB_SECRET=${RDMAPS_JOB_SECRET:-full-run-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}

# Runs "$@", its stdout to $out/$name.log, then writes the JSON report line
# with the job's wall seconds added to $out/$name.json.
run() {
  local name=$1
  shift
  local start end
  start=$(date +%s.%N)
  echo "[run_full] $name: $*" >&2
  "$@" >"$out/$name.log" 2>&1 || {
    echo "[run_full] $name failed (exit $?), see $out/$name.log" >&2
    return 1
  }
  end=$(date +%s.%N)
  # The last JSON line (a launcher may prefix it, e.g. torchrun's "[default0]:").
  "$python" - "$out/$name.log" "$start" "$end" >"$out/$name.json" <<'EOF'
import json, sys
lines = [l[l.index("{"):] for l in open(sys.argv[1]) if "{" in l and l.rstrip().endswith("}")]
r = json.loads(lines[-1])
r["wall_seconds"] = round(float(sys.argv[3]) - float(sys.argv[2]), 1)
print(json.dumps(r))
EOF
  cat "$out/$name.json"
}

for job in $only; do
  case $job in
    cnn_torchrun)
      rm -f "$out/rendezvous"
      # The first RDMAPS_NUM_SERVERS ranks serve. --redirects/--tee 1: Debian's
      # torch 1.13 on Python 3.11 cannot parse their default "0".
      RDMAPS_NUM_SERVERS=2 RDMAPS_TRANSPORT=tcp RDMAPS_RENDEZVOUS="file:$out/rendezvous" \
        run cnn_torchrun "$python" -m torch.distributed.run --standalone --nproc_per_node 6 \
        --redirects 1 --tee 1 --log_dir "$out/torchrun-logs" "$here/fashion_mnist_cnn.py"
      ;;
    cnn_local)
      run cnn_local "$build/tools/local/rdmaps-local" --servers 2 --workers 4 --transport tcp \
        --startup_timeout_s 300 -- "$python" "$here/fashion_mnist_cnn.py"
      ;;
    fm)
      run fm "$build/tools/local/rdmaps-local" --servers 2 --workers 4 --transport tcp \
        --startup_timeout_s 300 -- "$python" "$here/ctr_fm.py" --rows 10000000
      ;;
    *)
      echo "[run_full] unknown job $job (cnn_torchrun, cnn_local, fm)" >&2
      exit 2
      ;;
  esac
done
echo "[run_full] reports in $out" >&2

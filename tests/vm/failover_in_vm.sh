#!/usr/bin/env bash
# Replication and elastic workers on verbs, inside the Soft-RoCE VM (ctest
# softroce_vm_failover, label vm): the fault matrix of tests/ps/fault_matrix.cc
# (ps_fault_matrix_verbs_test) on rxe - a primary killed during pushes and
# during checkpoints (failover to its backup), a backup killed, both killed
# (restore and resume), and workers that join, die and stop while a primary
# is killed - with the seeds of RDMAPS_FAULT_SEEDS (default 1). Prints each
# cell's FAULT-MATRIX line (failover time, longest call). Then re-protection
# on rxe (tests/ps/reprotect_test.cc, ps_reprotect_verbs_test, its elastic
# case): a replacement backup copies the promoted primary's shard and
# membership, becomes its backup and takes over when that primary is killed.
#   tests/vm/failover_in_vm.sh [BUILD_DIR]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:-$here/../../build}" && pwd)"
bin="$build/tests/ps/ps_fault_matrix_verbs_test"
[[ -x "$bin" ]] || { echo "failover_in_vm.sh: build ps_fault_matrix_verbs_test first ($bin missing)" >&2; exit 1; }
cmds=("env RDMAPS_FAULT_SEEDS=${RDMAPS_FAULT_SEEDS:-1} timeout 900 $bin --gtest_color=no")
reprotect="$build/tests/ps/ps_reprotect_verbs_test"
if [[ -x "$reprotect" ]]; then
  # The elastic case only (about 12 s on rxe under TCG): it copies, catches
  # up, becomes the backup and takes over like the others, with the
  # membership besides; all cases run on fake and tcp.
  cmds+=("timeout 300 $reprotect --gtest_color=no --gtest_filter=*Elastic*")
fi
exec "$here/run_in_vm.sh" --build "$build" --timeout 1200 -- "${cmds[@]}"

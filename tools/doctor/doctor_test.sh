#!/usr/bin/env bash
# doctor_test.sh DOCTOR: checks rdmaps-doctor's verdict and exit code against
# what this machine has (an ACTIVE RDMA port or not).
set -uo pipefail
doctor="$1"
out="$("$doctor" --memory=1048576 2>&1)"
rc=$?
echo "$out"
active=0
for s in /sys/class/infiniband/*/ports/*/state; do
  [[ -r "$s" ]] && grep -q ACTIVE "$s" && active=1
done
fail() { echo "doctor_test: $*" >&2; exit 1; }
if ((active)); then
  ((rc == 0)) || fail "an ACTIVE RDMA port exists but the doctor exited $rc"
  grep -q "verdict: READY" <<<"$out" || fail "no READY verdict"
  grep -q "auto picks verbs" <<<"$out" || fail "does not say auto picks verbs"
else
  ((rc == 1)) || fail "no RDMA device here, yet the doctor exited $rc (want 1)"
  grep -q "\[FAIL\] no RDMA device found" <<<"$out" || fail "does not name the missing device"
  grep -q "verdict: NOT READY" <<<"$out" || fail "no NOT READY verdict"
  grep -q -- "--transport=tcp" <<<"$out" || fail "does not recommend --transport=tcp"
  grep -q "auto picks tcp" <<<"$out" || fail "does not say auto picks tcp"
fi
echo "doctor_test: verdict and exit code ($rc) match this machine"

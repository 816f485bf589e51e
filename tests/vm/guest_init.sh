#!/bin/busybox sh
# /init of the rdmaps test VM (see run_in_vm.sh). Loads the modules, mounts
# the host root and the project trees over 9p, sets up two rxe devices, each on
# its own veth pair (rxe loops its own traffic back; two rxe devices in one
# namespace cannot reach each other on this kernel, so every connection stays
# on one device):
#   rxe0 on veth0: 10.77.0.1 (RDMAPS_TEST_VERBS_ADDR) and 10.77.0.2
#                  (RDMAPS_TEST_VERBS_ALT_ADDR, a second GID for gid_index tests)
#   rxe1 on veth2: 10.78.0.1 (RDMAPS_TEST_VERBS_ADDR2); 10.78.0.2
#                  (RDMAPS_TEST_VERBS_ROUTED2) is not local but routed out of
#                  veth2 with a permanent neighbour entry, so rdma_resolve_addr
#                  reaches it through rxe1 without anyone answering
# rxe0 is created first, so it is the first device (the default without
# ib_dev or address_hint). Runs each line of /commands in a chroot of the
# host root, and prints the verdict for the host.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

setup_fail() {
  echo "rdmaps-vm: setup failed: $*"
  echo "RDMAPS_VM_RESULT setup=1"
  poweroff -f
}

for m in $(cat /mods/order); do
  insmod "/mods/$m" || setup_fail "insmod $m"
done
. /run.env

opts=trans=virtio,version=9p2000.L,msize=1048576,cache=none
mount -t 9p -o "$opts" hostroot /host || setup_fail "mount of the host root over 9p"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs shm /host/dev/shm 2>/dev/null
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
mount -t tmpfs vartmp /host/var/tmp
# The trees are shared separately: they may live under the (now hidden) /tmp.
mkdir -p "/host$RDMAPS_SOURCE" 2>/dev/null
mount -t 9p -o "$opts,ro" srctree "/host$RDMAPS_SOURCE" || setup_fail "mount of the source tree"
mkdir -p "/host$RDMAPS_BUILD" 2>/dev/null
mount -t 9p -o "$opts" buildtree "/host$RDMAPS_BUILD" || setup_fail "mount of the build tree"

addr=10.77.0.1
alt=10.77.0.2
addr2=10.78.0.1
routed2=10.78.0.2
in_host() { chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp "$@"; }
in_host ip link set lo up || setup_fail "ip link set lo up"
in_host ip link add veth0 type veth peer name veth1 || setup_fail "veth pair"
in_host ip addr add "$addr/24" dev veth0
in_host ip link set veth0 up
in_host ip link set veth1 up
in_host rdma link add rxe0 type rxe netdev veth0 || setup_fail "rdma link add rxe0 type rxe netdev veth0"
in_host ip addr add "$alt/24" dev veth0
in_host ip link add veth2 type veth peer name veth3 || setup_fail "second veth pair"
in_host ip addr add "$addr2/24" dev veth2
in_host ip link set veth2 up
in_host ip link set veth3 up
in_host ip neigh replace "$routed2" lladdr "$(cat /sys/class/net/veth3/address)" dev veth2 nud permanent ||
  setup_fail "neighbour entry for $routed2"
in_host rdma link add rxe1 type rxe netdev veth2 || setup_fail "rdma link add rxe1 type rxe netdev veth2"
for dev in rxe0 rxe1; do
  i=0
  while [ "$i" -lt 50 ]; do
    grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null && break
    i=$((i + 1)); sleep 0.1
  done
done
echo "rdmaps-vm: rxe0 on veth0 ($addr, $alt), port $(cat /sys/class/infiniband/rxe0/ports/1/state)"
echo "rdmaps-vm: rxe1 on veth2 ($addr2), port $(cat /sys/class/infiniband/rxe1/ports/1/state)"

failed=0
n=0
while IFS= read -r cmd; do
  n=$((n + 1))
  echo "rdmaps-vm: [$n] \$ $cmd"
  in_host RDMAPS_TEST_VERBS_ADDR="$addr" RDMAPS_TEST_VERBS_ALT_ADDR="$alt" \
    RDMAPS_TEST_VERBS_ADDR2="$addr2" RDMAPS_TEST_VERBS_ROUTED2="$routed2" RDMAPS_IN_VM=1 TMPDIR=/var/tmp \
    /bin/sh -c "ulimit -l unlimited; cd '$RDMAPS_BUILD' && $cmd" </dev/null
  rc=$?
  echo "rdmaps-vm: [$n] exit $rc"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
done </commands
sync
echo "RDMAPS_VM_RESULT failed=$failed"
poweroff -f

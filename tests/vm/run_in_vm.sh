#!/usr/bin/env bash
# Runs commands on real Soft-RoCE (rdma_rxe) inside a throwaway qemu VM.
#
#   tests/vm/run_in_vm.sh [--build DIR] [--commands FILE] [--timeout SECS] [-- CMD...]
#
# The host kernel here has no rdma_rxe, a stock Debian kernel booted in qemu
# does. This script
#   1. finds a Debian 6.1 kernel with modules: /boot + /lib/modules if
#      linux-image-amd64 is installed, else `apt-get download`s the versioned
#      package into a cache folder and unpacks it there with `dpkg -x`
#      (RDMAPS_VM_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/rdmaps-vm);
#   2. builds (once, cached) a tiny busybox initramfs with the modules rxe
#      needs, and per run appends a second cpio holding the commands;
#   3. boots qemu (TCG: the /dev/kvm here cannot run stock kernels) with the
#      host root shared read-only over 9p, plus the source and build trees as
#      their own 9p tags (CI may clone under /tmp, which the guest hides
#      behind a tmpfs), sets up a veth pair and ONE rxe device on it, and runs
#      each command in a chroot of the host root with
#      RDMAPS_TEST_VERBS_ADDR=<the rxe device's IPv4 address>;
#   4. prints the guest's output and exits 0 only when every command
#      exited 0. Exit 77 (ctest SKIP_RETURN_CODE) when qemu or a kernel
#      genuinely cannot be had, saying why.
#
# Commands come from --commands FILE (one shell command per line, '#'
# comments; @BUILD@ and @SOURCE@ expand to the trees) and/or after `--`.
# Every command must bound its own run time; --timeout (default 900 s)
# bounds the whole VM run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source_dir="$(cd "$here/../.." && pwd)"
build_dir=""
commands_file=""
timeout_secs=900
extra_cmds=()
while (($#)); do
  case "$1" in
    --build) build_dir="$(cd "$2" && pwd)"; shift 2 ;;
    --commands) commands_file="$2"; shift 2 ;;
    --timeout) timeout_secs="$2"; shift 2 ;;
    --) shift; extra_cmds=("$@"); break ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "run_in_vm.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
build_dir="${build_dir:-$source_dir/build}"

skip() { echo "run_in_vm.sh: SKIP: $*"; exit 77; }
die() { echo "run_in_vm.sh: ERROR: $*" >&2; exit 1; }

command -v qemu-system-x86_64 >/dev/null ||
  skip "qemu-system-x86_64 not found; install it with: apt-get install qemu-system-x86"
busybox_bin=""
for b in /bin/busybox /usr/bin/busybox; do
  if [[ -x "$b" ]] && { ldd "$b" 2>&1 || true; } | grep -q "not a dynamic"; then busybox_bin="$b"; break; fi
done
[[ -n "$busybox_bin" ]] ||
  skip "a static busybox is needed for the initramfs; install it with: apt-get install busybox-static"
for tool in cpio modprobe; do
  command -v "$tool" >/dev/null || skip "$tool not found; install it with: apt-get install cpio kmod"
done

cache="${RDMAPS_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmaps-vm}"
mkdir -p "$cache"
# ctest starts both VM tests at once (COST): on a fresh machine both would
# fetch the kernel and build the initramfs into the cache together, each
# removing the other's files. One does it under this lock; the other then
# finds it done. (Released before the VM starts.)
exec {cache_lock}>"$cache/.lock"
flock -w 900 "$cache_lock" ||
  die "$cache/.lock was held for 15 min by another run_in_vm.sh; find it with: lslocks -o PID,COMMAND,PATH"

# --- 1. Kernel ------------------------------------------------------------
find_kernel() {
  local root="$1" v
  for v in $(ls -1 "$root/lib/modules" 2>/dev/null | sort -rV); do
    if [[ -f "$root/boot/vmlinuz-$v" ]] &&
       find "$root/lib/modules/$v" -name 'rdma_rxe.ko*' 2>/dev/null | grep -q .; then
      echo "$v"; return 0
    fi
  done
  return 1
}
kroot=""
if kver="$(find_kernel "")"; then
  kroot=""
elif kver="$(find_kernel "$cache/kernel")"; then
  kroot="$cache/kernel"
else
  pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  [[ -n "$pkg" ]] || skip "cannot find the Debian kernel package (apt-cache depends linux-image-amd64 gave nothing); run apt-get update"
  echo "run_in_vm.sh: fetching $pkg into $cache (once)"
  rm -rf "$cache/dl" && mkdir -p "$cache/dl"
  (cd "$cache/dl" && apt-get download "$pkg" >/dev/null 2>&1) ||
    skip "apt-get download $pkg failed (no network or apt sources?); or install linux-image-amd64"
  rm -rf "$cache/kernel.new" && dpkg -x "$cache"/dl/*.deb "$cache/kernel.new"
  rm -rf "$cache/kernel" && mv "$cache/kernel.new" "$cache/kernel" && rm -rf "$cache/dl"
  kver="$(find_kernel "$cache/kernel")" || die "unpacked $pkg but found no kernel with rdma_rxe in it"
  kroot="$cache/kernel"
fi
kernel="$kroot/boot/vmlinuz-$kver"
moddir="$kroot/lib/modules/$kver"

# --- 2. Initramfs (cached per kernel and per version of this script) ------
modules=(crc32_generic virtio_pci 9pnet_virtio 9p veth rdma_rxe ib_uverbs rdma_ucm)
stamp="$(cat "$0" "$here/guest_init.sh" | sha1sum | cut -c1-12)"
initrd="$cache/initrd-$kver-$stamp.cpio"
if [[ ! -f "$initrd" ]]; then
  stage="$(mktemp -d "$cache/stage.XXXXXX")"
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage"/{bin,dev,proc,sys,host,mods,etc}
  cp "$busybox_bin" "$stage/bin/busybox"
  : >"$stage/mods/order"
  [[ -z "$kroot" ]] && dflag=() || dflag=(-d "$kroot")
  # The package's postinst would run depmod; dpkg -x does not.
  [[ -f "$moddir/modules.dep" ]] || depmod ${kroot:+-b "$kroot"} "$kver" ||
    die "depmod for $moddir failed"
  for m in "${modules[@]}"; do
    deps="$(modprobe "${dflag[@]}" -S "$kver" --show-depends "$m")" ||
      die "modprobe --show-depends $m failed for kernel $kver in $moddir"
    while read -r kind path _; do
      [[ "$kind" == insmod ]] || continue
      base="$(basename "$path")"
      if [[ ! -f "$stage/mods/$base" ]]; then
        cp "$path" "$stage/mods/$base"
        echo "$base" >>"$stage/mods/order"
      fi
    done <<<"$deps"
  done
  # Modules may be compressed (.ko.xz); busybox insmod handles plain .ko, so
  # decompress them here.
  for f in "$stage"/mods/*.ko.xz; do [[ -e "$f" ]] && xz -d "$f"; done
  for f in "$stage"/mods/*.ko.zst; do [[ -e "$f" ]] && zstd -q -d --rm "$f"; done
  sed -i -e 's/\.ko\.xz$/.ko/' -e 's/\.ko\.zst$/.ko/' "$stage/mods/order"
  cp "$here/guest_init.sh" "$stage/init"
  chmod +x "$stage/init"
  (cd "$stage" && find . | cpio -o -H newc --quiet) >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$stage"; trap - EXIT
fi
flock -u "$cache_lock"
exec {cache_lock}>&-

# --- Per-run commands, appended as a second cpio archive ------------------
run_dir="$(mktemp -d)"
trap 'rm -rf "$run_dir"' EXIT
mkdir -p "$run_dir/cpio"
{
  echo "RDMAPS_SOURCE='$source_dir'"
  echo "RDMAPS_BUILD='$build_dir'"
} >"$run_dir/cpio/run.env"
: >"$run_dir/cpio/commands"
if [[ -n "$commands_file" ]]; then
  [[ -f "$commands_file" ]] || die "commands file '$commands_file' not found"
  sed -e 's/[[:space:]]*#.*$//' -e '/^[[:space:]]*$/d' \
      -e "s|@BUILD@|$build_dir|g" -e "s|@SOURCE@|$source_dir|g" \
      "$commands_file" >>"$run_dir/cpio/commands"
fi
for c in "${extra_cmds[@]}"; do echo "$c" >>"$run_dir/cpio/commands"; done
[[ -s "$run_dir/cpio/commands" ]] || die "nothing to run: give --commands FILE or -- CMD"
(cd "$run_dir/cpio" && find . | cpio -o -H newc --quiet) >"$run_dir/extra.cpio"
cat "$initrd" "$run_dir/extra.cpio" >"$run_dir/initrd.cpio"

# --- 3. Boot --------------------------------------------------------------
echo "run_in_vm.sh: kernel $kver, build tree $build_dir, $(wc -l <"$run_dir/cpio/commands") command(s)"
log="$run_dir/console.log"
boot() {
  timeout --foreground -k 10 "$timeout_secs" qemu-system-x86_64 \
    -accel tcg,thread=multi -cpu max -m 2048 -smp 2 \
    -nographic -no-reboot -nic none \
    -kernel "$kernel" -initrd "$run_dir/initrd.cpio" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
    -virtfs local,path="$source_dir",mount_tag=srctree,security_model=passthrough,readonly=on,multidevs=remap \
    -virtfs local,path="$build_dir",mount_tag=buildtree,security_model=passthrough,multidevs=remap \
    </dev/null 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}
set +e
boot
qemu_rc=$?
# Emulated boots on a loaded host occasionally panic before userspace (e.g.
# "IO-APIC + timer doesn't work"). Boot again once, only when no command
# had started, so a failing test is never retried.
if ! grep -a -q 'RDMAPS_VM_RESULT' "$log" && ! grep -a -q 'rdmaps-vm: \[1\]' "$log"; then
  echo "run_in_vm.sh: the VM did not reach its commands; booting once more"
  boot
  qemu_rc=$?
fi
set -e

# --- 4. Verdict ------------------------------------------------------------
result="$(grep -a -o 'RDMAPS_VM_RESULT [a-z]*=[0-9]*' "$log" | tail -1 || true)"
if [[ -z "$result" ]]; then
  if ((qemu_rc == 124)); then
    die "the VM did not finish within ${timeout_secs}s (see the console output above)"
  fi
  die "the VM ended (qemu exit $qemu_rc) without reporting a result (see the console output above)"
fi
case "$result" in
  "RDMAPS_VM_RESULT failed=0") echo "run_in_vm.sh: all commands passed"; exit 0 ;;
  "RDMAPS_VM_RESULT setup="*) die "guest setup failed (see above)" ;;
  *) die "${result#RDMAPS_VM_RESULT failed=} command(s) failed inside the VM (see above)" ;;
esac

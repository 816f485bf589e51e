#!/usr/bin/env bash
# rdmaps developer entry point. Works as root on a fresh Debian 12 machine.
#
#   scripts/dev.sh demo    install what is missing, build what the demo runs, run it
#   scripts/dev.sh test    install what is missing, build, run every test
#                          (plain g++ build with -Werror, then ASan+UBSan, then TSan
#                          built with clang, whose -Wthread-safety checks lock rules;
#                          that clang tree also builds the libFuzzer binaries of
#                          tests/fuzz, with ASan+UBSan, and fuzzes each for a few
#                          seconds: ctest label fuzz)
#   scripts/dev.sh deps    only install the Debian packages
#   scripts/dev.sh build   only configure and build (build/)
#
# Environment: RDMAPS_JOBS (parallel jobs, default nproc), RDMAPS_SANITIZERS=0
# skips the sanitizer builds, RDMAPS_CXX selects the compiler (g++ or clang++),
# RDMAPS_OVERLAP=0 builds each sanitizer tree only after the previous tests.
#
# Where `dev.sh test` spends the wall time of a 2-core CI machine, and why it
# is arranged so (CI's limit is 30 min; see README, "Building by hand"):
#  - installing the Debian packages: those the build needs first, those only
#    the tests run (run_packages) in the background during the plain build;
#  - compiling three trees cold, no ccache: the code under test at the build
#    type's optimisation, the test sources at -O1 (RDMAPS_TEST_OPTIMIZE,
#    tests/CMakeLists.txt), line tables only (-g1, below);
#  - linking ~95 test binaries per tree: with mold when it is installed
#    (RDMAPS_LINKER, CMakeLists.txt), half the CPU of GNU ld;
#  - the tests, whose processes often wait (on each other, on deadlines, on
#    the Soft-RoCE VM's emulated network) and leave a core idle. The next
#    sanitizer tree is built meanwhile, under SCHED_IDLE (chrt --idle): it
#    runs only on a core that nothing else wants (a waking test preempts it
#    at once), so it takes no CPU time from a test; what is left of it is built after the
#    tests, at full speed. Its output goes to DIR/dev-build.log, printed if it
#    fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The tests share a precompiled header (tests/CMakeLists.txt); a ccache given
# as CMAKE_CXX_COMPILER_LAUNCHER caches such compiles only with these.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros}"
jobs="${RDMAPS_JOBS:-$(nproc)}"

# Debian 12 packages. What configuring and building needs (CMake looks for
# etcd when it configures the coordination tests, and builds the Python
# module with Debian's python3, NumPy and pybind11):
build_packages=(
  build-essential cmake ninja-build pkg-config g++ clang libclang-rt-14-dev libfuzzer-14-dev
  mold util-linux
  libgflags-dev libgoogle-glog-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtbb-dev libeigen3-dev nlohmann-json3-dev libxxhash-dev libsodium-dev
  libcurl4-openssl-dev etcd-server etcd-client
  libibverbs-dev librdmacm-dev rdma-core ibverbs-providers zlib1g-dev
  python3 python3-dev python3-numpy pybind11-dev python3-pybind11
)
# What only the tests, the demo and the VM harness run. `dev.sh test`
# installs these in the background while the plain tree compiles: fetching
# and unpacking them is mostly waiting, on the archive and on dpkg's fsyncs.
run_packages=(
  ibverbs-utils rdmacm-utils perftest
  qemu-system-x86 busybox-static cpio kmod iproute2
  openmpi-bin mpich slurm-wlm munge dataset-fashion-mnist gnuplot-nox iperf3
  # The Python package's tests (python/), for Debian's /usr/bin/python3.
  python3-pytest python3-torch python3-setuptools python3-pip python3-venv python3-wheel
)

# missing PKG...: prints those of the packages that are not installed.
missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

# apt_install PKG...: installs the packages (none: nothing to do).
apt_updated=0
apt_install() {
  (($# > 0)) || return 0
  echo "dev.sh: installing $*"
  local sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  if ((apt_updated == 0)); then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@"
}

# install_deps PKG...: installs those of the packages that are missing.
install_deps() {
  local todo
  mapfile -t todo < <(missing "$@")
  apt_install "${todo[@]}"
}

# bg_install_run_packages: the run packages in the background (output in
# build/dev-install.log); wait_run_packages waits for them, and exits with
# their log when the install failed.
install_pid=""
bg_install_run_packages() {
  local todo
  mapfile -t todo < <(missing "${run_packages[@]}")
  ((${#todo[@]} > 0)) || return 0
  echo "dev.sh: installing in the background (build/dev-install.log): ${todo[*]}"
  mkdir -p "$here/build"
  (apt_install "${todo[@]}") >"$here/build/dev-install.log" 2>&1 &
  install_pid=$!
}
wait_run_packages() {
  [[ -n "$install_pid" ]] || return 0
  local pid="$install_pid"
  install_pid=""
  wait_for "$pid" "$here/build/dev-install.log" "installing the packages the tests run"
  echo "dev.sh: the packages the tests run were installed in the background"
}

# wait_for PID LOG WHAT: waits for the background job PID; if it failed,
# prints "dev.sh: WHAT failed", the end of its output LOG, and exits 1.
wait_for() {
  local pid="$1" log="$2" what="$3" rc=0
  wait "$pid" || rc=$?
  if ((rc != 0)); then
    echo "dev.sh: $what failed (exit $rc); its output ($log):"
    tail -n 300 "$log"
    exit 1
  fi
}

# configure DIR [cmake args...]; CXX_FOR_BUILD=... before the call picks another compiler.
# Debug information is line tables only (-g1: file and line in every stack
# trace and sanitizer report, no variables): it compiles a third faster than
# -g on these 2-core machines. RDMAPS_DEBUG_INFO=-g gives full information.
configure() {
  local dir="$1"; shift
  local cxx="${CXX_FOR_BUILD:-${RDMAPS_CXX:-g++}}"
  local g="${RDMAPS_DEBUG_INFO:--g1}"
  cmake -S "$here" -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DRDMAPS_WERROR=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $g -DNDEBUG" -DCMAKE_CXX_FLAGS_DEBUG="$g" "$@" >/dev/null
}

# build DIR [cmake args...]: configure, then build every target.
build() {
  configure "$@"
  cmake --build "$1" -j "$jobs"
}

# bg_build DIR [cmake args...]: configure and build DIR in the background,
# under SCHED_IDLE, output in DIR/dev-build.log; bg_wait DIR waits for it. The build
# runs ninja itself: on an early exit (a failed test) the trap's SIGTERM
# makes ninja stop its compilers.
bg_pid=""
bg_build() {
  local dir="$1"
  mkdir -p "$dir"
  (configure "$@" && exec chrt --idle 0 ninja -C "$dir" -j "$jobs") >"$dir/dev-build.log" 2>&1 &
  bg_pid=$!
  bg_start=$SECONDS
}
bg_wait() {
  local dir="$1" pid="$bg_pid"
  # The tests are done: what is left builds at normal priority (ninja's next
  # compilers inherit it), also on a machine that other work keeps busy.
  chrt --other -a -p 0 "$pid" >/dev/null 2>&1 || true
  bg_pid=""
  wait_for "$pid" "$dir/dev-build.log" "building $dir"
  echo "dev.sh: $dir built in the background ($((SECONDS - bg_start)) s, idle CPU first)"
  # Anything the background build left (nothing, normally) at full priority.
  cmake --build "$dir" -j "$jobs"
}
trap '[[ -z "$bg_pid" ]] || kill "$bg_pid" 2>/dev/null || true' EXIT

run_tests() {
  local dir="$1"; shift
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "$@")
}

# stage NAME: prints how long the previous stage took (CI's budget is 30 min).
stage_start=$SECONDS
stage() {
  echo "dev.sh: $1 (the previous stage took $((SECONDS - stage_start)) s, $SECONDS s in all)"
  stage_start=$SECONDS
}

cmd="${1:-help}"
case "$cmd" in
  deps)
    install_deps "${build_packages[@]}" "${run_packages[@]}"
    ;;
  build)
    install_deps "${build_packages[@]}" "${run_packages[@]}"
    build "$here/build"
    ;;
  demo)
    install_deps "${build_packages[@]}" "${run_packages[@]}"
    # Only the three programs the demo runs (rdmaps-local starts rdmaps-server
    # and rdmaps-train); `dev.sh test` builds the rest in the same tree.
    configure "$here/build"
    cmake --build "$here/build" -j "$jobs" --target rdmaps-local rdmaps-server rdmaps-train
    exec "$here/build/tools/local/rdmaps-local" --servers 2 --workers 4 -- \
      "$here/build/tools/train/rdmaps-train" --model=mlp
    ;;
  test)
    install_deps "${build_packages[@]}"
    bg_install_run_packages
    stage "plain build"
    build "$here/build"
    wait_run_packages
    sanitizers="${RDMAPS_SANITIZERS:-1}"
    overlap="${RDMAPS_OVERLAP:-1}"
    # The sanitizer stages run neither slow nor verbs tests: they build none.
    asan_args=(-DRDMAPS_SANITIZE='address;undefined' -DRDMAPS_BUILD_PERF=OFF
               -DRDMAPS_BUILD_PLAIN_STAGE_TESTS=OFF -DCMAKE_BUILD_TYPE=Debug)
    tsan_args=(-DRDMAPS_SANITIZE=thread -DRDMAPS_BUILD_PERF=OFF
               -DRDMAPS_BUILD_PLAIN_STAGE_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo)
    stage "plain tests"
    if [[ "$sanitizers" != 0 && "$overlap" != 0 ]]; then
      bg_build "$here/build-asan" "${asan_args[@]}"
    fi
    run_tests "$here/build"
    if [[ "$sanitizers" != 0 ]]; then
      stage "AddressSanitizer + UndefinedBehaviorSanitizer"
      if [[ "$overlap" != 0 ]]; then
        bg_wait "$here/build-asan"
        CXX_FOR_BUILD=clang++ bg_build "$here/build-tsan" "${tsan_args[@]}"
      else
        build "$here/build-asan" "${asan_args[@]}"
      fi
      ASAN_OPTIONS=detect_leaks=1 run_tests "$here/build-asan" -LE 'vm|slow|install'
      stage "ThreadSanitizer, built with clang (-Wthread-safety -Werror), and short fuzz runs"
      if [[ "$overlap" != 0 ]]; then
        bg_wait "$here/build-tsan"
      else
        CXX_FOR_BUILD=clang++ build "$here/build-tsan" "${tsan_args[@]}"
      fi
      run_tests "$here/build-tsan" -LE 'vm|slow|install'
    fi
    stage "done"
    ;;
  *)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac

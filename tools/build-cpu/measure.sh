#!/usr/bin/env bash
# Measures the CPU cost of a cold build, contention-free: configures <build-dir> afresh with the
# given cmake options, compiles and links through cpu-launcher.sh without ccache, and prints the
# CPU seconds per category (src, tests, bench, sim, proto, link) and per target.
#   tools/build-cpu/measure.sh <build-dir> [ninja targets…] [-- <cmake options…>]
# e.g. tools/build-cpu/measure.sh build/cpu-asan -- -DCMAKE_BUILD_TYPE=Debug -DGNS_SANITIZE=ON \
#        -DGNS_WERROR=ON -DGNS_BUILD_BENCH=ON -DGNS_SHARED_LIBS=ON
# JOBS (default 2) sets ninja's -j; the build runs under `nice -n 19`.
# PREBUILD="<ninja targets…>" builds those first through ccache, unmeasured (their CPU is logged
# to cpu-prebuild.log): e.g. PREBUILD="src/all tools/sim/all tests/support/all" with the target
# tests/all measures the test executables alone.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${1:?usage: measure.sh <build-dir> [targets…] [-- cmake options…]}"
shift
targets=()
while [[ $# -gt 0 && "$1" != "--" ]]; do targets+=("$1"); shift; done
[[ "${1:-}" == "--" ]] && shift
log="$dir/cpu.log"
mkdir -p "$dir"
launcher="$here/cpu-launcher.sh"
if [[ -n "${PREBUILD:-}" ]]; then
  launcher="$launcher;$(command -v ccache)"
fi
cmake -S "$root" -B "$dir" -G Ninja "$@" \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" \
  -DCMAKE_C_COMPILER_LAUNCHER="$launcher" \
  -DCMAKE_CXX_LINKER_LAUNCHER="$here/cpu-launcher.sh" >/dev/null
: >"$log"
if [[ -n "${PREBUILD:-}" ]]; then
  # shellcheck disable=SC2086
  GNS_CPU_LOG="$(cd "$dir" && pwd)/cpu-prebuild.log" CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 \
    nice -n 19 ninja -C "$dir" -j "${JOBS:-2}" $PREBUILD
fi
GNS_CPU_LOG="$(cd "$dir" && pwd)/cpu.log" CCACHE_DISABLE=1 \
  nice -n 19 ninja -C "$dir" -j "${JOBS:-2}" "${targets[@]}"
"$here/summarise.py" "$log"

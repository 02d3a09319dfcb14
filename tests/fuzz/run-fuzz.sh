#!/usr/bin/env bash
# Builds one libFuzzer target with clang (no CMake needed: each target depends on one or two
# of our sources and at most a system library) and runs it for a while over its seed corpus.
# Exits non-zero on any crash, sanitizer report or build failure.
#
#   tests/fuzz/run-fuzz.sh <target> <work-dir> [seconds=20]
#
# GNS_FUZZ_SECONDS in the environment, when set, replaces the seconds argument: ctest passes the
# short figure of `make test`, and `make fuzz` (Makefile) runs the same tests for longer.
#
# Targets: kernel_line_parser (gpu-health's kernel-line parser), json_reader (the kube module's
# JSON decoding, checked against nlohmann's parser on every input), config_yaml (the site
# config's YAML reader over libfyaml: a tree or a ConfigError, within its bounds).
# Include directories come from GNS_FUZZ_INCLUDE_DIRS (':'-separated), which ctest sets from
# tests/fuzz/CMakeLists.txt: the build's public include tree, plus the private tree of the module
# whose insides a target fuzzes (cmake/GnsHelpers.cmake, gns_module). By hand, from a configured
# build dir B: GNS_FUZZ_INCLUDE_DIRS=B/include/private/gpu_health:B/include/public (private first).
# The work dir receives the binary, a copy of the corpus that libFuzzer may grow (the seeds
# in the repository stay untouched) and any crash-* / timeout-* artifacts.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <target> <work-dir> [seconds]" >&2
  exit 2
fi
target=$1
work_dir=$2
seconds=${GNS_FUZZ_SECONDS:-${3:-20}}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "run-fuzz.sh: seconds must be a positive whole number, not \"$seconds\"" >&2
  exit 2
fi
cxx=${GNS_FUZZ_CXX:-clang++-14}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

: "${GNS_FUZZ_INCLUDE_DIRS:?set GNS_FUZZ_INCLUDE_DIRS (see the comment at the top of $0)}"
include_flags=()
IFS=: read -r -a include_dirs <<<"$GNS_FUZZ_INCLUDE_DIRS"
for dir in "${include_dirs[@]}"; do
  include_flags+=(-I"$dir")
done

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "run-fuzz.sh: $cxx not found (apt-get install -y clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi

extra=()
case "$target" in
  kernel_line_parser)
    sources=("$repo/src/modules/gpu_health/kernel_line_parser.cpp" "$repo/src/loop/pci_address.cpp")
    libs=()
    corpus=kernel_line
    ;;
  json_reader)
    sources=("$repo/src/modules/kube/json_reader.cpp")
    libs=(-DSIMDJSON_THREADS_ENABLED=1 -lsimdjson)
    corpus=json_reader
    ;;
  config_yaml)
    sources=("$repo/src/loop/config.cpp")
    libs=($(pkg-config --cflags --libs libfyaml))
    corpus=config_yaml
    # libfyaml 0.7.12 leaks a 4 KiB buffer on some error paths (its realloc, not our code):
    # once per refused config file, in a process that then exits 2. Crashes and hangs count.
    extra=(-detect_leaks=0)
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
    ;;
  *)
    echo "run-fuzz.sh: unknown target \"$target\"" >&2
    exit 2
    ;;
esac

mkdir -p "$work_dir/corpus" "$work_dir/artifacts"
binary=$work_dir/${target}_fuzz

# -fno-sanitize-recover makes any undefined behaviour a crash instead of a log line.
"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Wall -Wextra -Werror \
  "${include_flags[@]}" -I"$repo/tests" \
  "${sources[@]}" \
  "$here/${target}_fuzz.cpp" \
  "${libs[@]}" \
  -o "$binary"

cp "$here/corpus/$corpus"/* "$work_dir/corpus/"

# max_len: allow inputs well beyond the longest seed, so the caps on detail and names are hit.
"$binary" \
  -max_total_time="$seconds" \
  -max_len=8192 \
  -timeout=10 \
  -print_final_stats=1 \
  -artifact_prefix="$work_dir/artifacts/" \
  "${extra[@]}" \
  "$work_dir/corpus"

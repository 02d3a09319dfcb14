#!/usr/bin/env bash
# Builds the kernel-line parser fuzz target with clang's libFuzzer (no CMake needed: the
# parser depends on nothing but the standard library) and runs it for a while over the seed
# corpus. Exits non-zero on any crash, sanitizer report or build failure.
#
#   tests/fuzz/run-fuzz.sh <work-dir> [seconds=20]
#
# The work dir receives the binary, a copy of the corpus that libFuzzer may grow (the seeds
# in the repository stay untouched) and any crash-* / timeout-* artifacts.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 <work-dir> [seconds]" >&2
  exit 2
fi
work_dir=$1
seconds=${2:-20}
cxx=${GNS_FUZZ_CXX:-clang++-14}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "run-fuzz.sh: $cxx not found (apt-get install -y clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi

mkdir -p "$work_dir/corpus" "$work_dir/artifacts"
binary=$work_dir/kernel_line_parser_fuzz

# -fno-sanitize-recover makes any undefined behaviour a crash instead of a log line.
"$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Wall -Wextra -Werror \
  -I"$repo/src" \
  "$repo/src/modules/gpu_health/kernel_line_parser.cpp" \
  "$here/kernel_line_parser_fuzz.cpp" \
  -o "$binary"

cp "$here"/corpus/kernel_line/* "$work_dir/corpus/"

# max_len: allow inputs well beyond the longest seed, so the caps on detail and names are hit.
"$binary" \
  -max_total_time="$seconds" \
  -max_len=8192 \
  -timeout=10 \
  -print_final_stats=1 \
  -artifact_prefix="$work_dir/artifacts/" \
  "$work_dir/corpus"

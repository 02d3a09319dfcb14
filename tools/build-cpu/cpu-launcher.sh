#!/usr/bin/env bash
# Compiler launcher that records the CPU time (user+sys of the compiler and its children) of each
# compile, so build cost can be compared on a machine shared with other jobs, where wall time is
# noise. Used through tools/build-cpu/measure.sh; appends "<cpu seconds> <output file>" lines to
# $GNS_CPU_LOG (one per compile). The command's exit status is passed through unchanged.
set -u
log="${GNS_CPU_LOG:?GNS_CPU_LOG must name the log file}"
out="?"
prev=""
for arg in "$@"; do
  if [[ "$prev" == "-o" ]]; then out="$arg"; fi
  prev="$arg"
done
tmp="$(mktemp)"
/usr/bin/time -f '%U %S' -o "$tmp" "$@"
rc=$?
read -r user sys < <(tail -n 1 "$tmp") || true
rm -f "$tmp"
if [[ -n "${user:-}" && -n "${sys:-}" ]]; then
  printf '%s %s\n' "$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')" "$out" >>"$log"
fi
exit "$rc"

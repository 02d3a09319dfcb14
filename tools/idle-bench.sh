#!/usr/bin/env bash
# The whole binary at rest with every module on (the `make run` set, started by
# tools/sim/run-local.sh without the demo) and the production config's timers (config/local.yaml
# without its shortened ones, so every timer is at its documented default): VmRSS and RssAnon
# once settled, and how often its threads wake while nothing happens.
# Targets (issue #15): VmRSS <= 24 MiB, RssAnon <= 8 MiB, loop thread <= 1 wake-up/s.
# GNS_IDLE_MODULES=shipped: only the modules the shipped ConfigMap (deploy/configmap.yaml)
# enables; targets (issue #23): loop thread <= 0.5 wake-ups/s, all threads <= 3/s. Threads of
# the supervisor's child processes (the NVML event waiter) count too. GNS_IDLE_OFF="a b" switches
# those modules off as well.
# The window is 2 minutes so that every periodic source at rest is in it: the polled checks run
# every 30-60 s and the API server sends each watch a BOOKMARK about once a minute (a 30 s window
# that began 10 s after ready never saw a bookmark: the figures before this change left them out).
#   tools/idle-bench.sh [BUILD_DIR] [SETTLE_S] [WINDOW_S]
set -euo pipefail
build_dir=${1:-build/release}
settle_s=${2:-10}
window_s=${3:-120}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
# run-local.sh starts the binary by its absolute path: look for it by the same name.
[[ $build_dir == /* ]] || build_dir=$repo/$build_dir

sandbox=$(mktemp -d /tmp/gns-idle-bench-XXXXXX)
port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
# The production timers: drop every shortened one of local.yaml (their defaults are the
# documented production values of config/example.yaml); and quiet logs.
sed -e '/eventWaitTimeout:/d' -e '/retryBackoff:/d' -e '/^    resync:/d' -e '/retryMax:/d' \
    -e '/leaderElection: {namespace/d' -e '/retryInterval:/d' -e 's/^  level: info/  level: warn/' \
    -e 's/^      interval: [0-9]*s .*/      enabled: true   # interval: its default/' -e '/^      [a-z]*: {interval: [0-9]*s}$/d' -e 's/{interval: [0-9]*s, /{/' \
    config/local.yaml > "$sandbox/site.yaml"
modules_label="every module on (make run set)"
loop_target=1
all_target=""
if [[ ${GNS_IDLE_MODULES:-all} == shipped ]]; then
  # The shipped ConfigMap's set: local.yaml's modules less those it leaves off.
  shipped=$(/usr/bin/python3 - deploy/configmap.yaml <<'PY'
import re, sys
text = open(sys.argv[1]).read()
mods = re.findall(r"^      ([a-z-]+):\n        enabled: true", text, re.M)
print(" ".join(mods))
PY
)
  /usr/bin/python3 - "$sandbox/site.yaml" "$shipped" <<'PY'
import re, sys
path, keep = sys.argv[1], set(sys.argv[2].split())
text = open(path).read()
def off(m):
    return m.group(0) if m.group(1) in keep else m.group(0).replace("enabled: true", "enabled: false")
text = re.sub(r"^  ([a-z-]+):\n    enabled: true", off, text, flags=re.M)
open(path, "w").write(text)
PY
  modules_label="the shipped ConfigMap's modules ($shipped)"
  loop_target=0.5
  all_target=3
fi

# GNS_IDLE_OFF="a b": these modules off as well (to tell which module a wake-up rate comes from).
if [[ -n ${GNS_IDLE_OFF:-} ]]; then
  /usr/bin/python3 - "$sandbox/site.yaml" "$GNS_IDLE_OFF" <<'PY'
import re, sys
path, drop = sys.argv[1], set(sys.argv[2].split())
text = open(path).read()
def off(m):
    return m.group(0).replace("enabled: true", "enabled: false") if m.group(1) in drop else m.group(0)
text = re.sub(r"^  ([a-z-]+):\n    enabled: true", off, text, flags=re.M)
open(path, "w").write(text)
PY
  modules_label+=", less $GNS_IDLE_OFF"
fi

# kube-apiserver sends idle watches a BOOKMARK about once a minute (the simulator's default, 1 s,
# is for tests): with the default every informer's watch would wake the loop each second.
GNS_SIM_BOOKMARK_MS=60000 GNS_SANDBOX=$sandbox/sim GNS_METRICS_LISTEN=127.0.0.1:$port GNS_DEMO=0 GNS_CONFIG=$sandbox/site.yaml \
  NODE_NAME=sim-node-0 setsid tools/sim/run-local.sh "$build_dir" > "$sandbox/run.log" 2>&1 &
runner=$!
cleanup() {
  kill -TERM -- -"$runner" 2>/dev/null || true
  wait "$runner" 2>/dev/null || true
  rm -rf "$sandbox"
}
trap cleanup EXIT

ready=0
for _ in $(seq 600); do
  if /usr/bin/python3 -c 'import sys,urllib.request as u;u.urlopen(sys.argv[1],timeout=1)' \
      "http://127.0.0.1:$port/readyz" 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
if [[ $ready != 1 ]]; then
  echo "idle bench: the supervisor did not get ready; its log:" >&2
  tail -30 "$sandbox/run.log" >&2
  exit 1
fi
pid=$(pgrep -n -f "^$build_dir/src/gpu-node-supervisor run --config $sandbox/site.yaml" || true)
[[ -n $pid ]] || { echo "idle bench: no supervisor process" >&2; exit 1; }
sleep "$settle_s"  # settle: this is a benchmark, not a test

# A wake-up is a voluntary context switch: the thread blocked (epoll, futex, timer) and was woken
# again. Involuntary switches (preemption on a busy machine) are not wake-ups: not counted.
# The supervisor's threads and those of its child processes (the NVML event waiter).
tasks() {
  local p
  for p in $pid $(cat /proc/$pid/task/*/children 2>/dev/null); do
    ls -d /proc/$p/task/* 2>/dev/null
  done
}
wakeups() { awk '$1 == "voluntary_ctxt_switches:" {print $2}' "$1/status" 2>/dev/null || echo 0; }
declare -A before
for task in $(tasks); do before[$task]=$(wakeups "$task"); done
sleep "$window_s"
loop_rate=0
total=0
per_thread=""
for task in $(tasks); do
  t=${task##*/}
  n=$(( $(wakeups "$task") - ${before[$task]:-0} ))
  total=$((total + n))
  name=$(cat "$task/comm" 2>/dev/null || echo "?")
  [[ $task == /proc/$pid/task/$pid ]] && { loop_rate=$n; name="loop"; }
  [[ $task != /proc/$pid/task/* ]] && name="child:$name"
  [[ $n -gt 0 ]] && per_thread+="$(awk -v n="$n" -v w="$window_s" 'BEGIN {printf "%.2f", n / w}')/s $name[$t]; "
done
status() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$pid/status"; }
rss_kb=$(status VmRSS)
anon_kb=$(status RssAnon)
file_kb=$(status RssFile)
threads=$(status Threads)
awk -v rss="$rss_kb" -v anon="$anon_kb" -v file="$file_kb" -v th="$threads" -v loop="$loop_rate" -v total="$total" \
  -v w="$window_s" -v busy="$per_thread" -v label="$modules_label" -v lt="$loop_target" -v at="$all_target" 'BEGIN {
  printf "whole binary, %s, production timers, idle %d s after ready:\n", label, w
  printf "  VmRSS %.1f MiB (target <= 24 MiB), RssAnon %.1f MiB (target <= 8 MiB), RssFile %.1f MiB, %d threads\n",
         rss / 1024, anon / 1024, file / 1024, th
  printf "  loop thread %.2f wake-ups/s (target <= %s/s: %s); all threads and children %.2f/s%s\n", loop / w, lt,
         loop / w <= lt ? "met" : "MISSED", total / w,
         at == "" ? "" : sprintf(" (target <= %s/s: %s)", at, total / w <= at ? "met" : "MISSED")
  printf "  per thread: %s\n", busy
}'
# GNS_IDLE_DETAIL=1: where the resident memory is, by mapping (file, [heap], anonymous).
if [[ ${GNS_IDLE_DETAIL:-0} == 1 ]]; then
  /usr/bin/python3 - "/proc/$pid/smaps" <<'PY'
import collections, sys
rss, anon = collections.Counter(), collections.Counter()
name = None
for line in open(sys.argv[1]):
    parts = line.split()
    if parts and "-" in parts[0] and ":" not in parts[0]:
        name = parts[5] if len(parts) > 5 else "[anonymous]"
        # The supervisor's own file by segment (code, read-only data, relocated data).
        if name.endswith("/gpu-node-supervisor"):
            name += f" ({parts[1]})"
    elif parts[0] == "Rss:":
        rss[name] += int(parts[1])
    elif parts[0] == "Anonymous:":
        anon[name] += int(parts[1])
print("  resident by mapping (KiB, of which anonymous):")
for name, kb in rss.most_common(int(__import__("os").environ.get("GNS_IDLE_TOP", "14"))):
    print(f"    {kb:7d} {anon[name]:7d}  {name}")
PY
fi

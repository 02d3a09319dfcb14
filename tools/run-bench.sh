#!/usr/bin/env bash
# `make bench`: runs every benchmark of an optimised build and prints the figures the issues
# ask for (ratios are computed from one run, side by side).
set -euo pipefail
build_dir=${1:-build/release}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== bus vs bare asio::post (bench/micro/bus_bench)"
"$build_dir/bench/micro/bus_bench" --benchmark_format=console --benchmark_out="$out/bus.json" --benchmark_out_format=json
/usr/bin/python3 - "$out/bus.json" <<'PY'
import json, sys
runs = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def ns(name): return runs[name]["cpu_time"]
tp = ns("BM_BusThroughput") / ns("BM_BarePostThroughput")
lat = ns("BM_BusLatency") / ns("BM_BarePostLatency")
print(f"bus/bare-post cost ratio: throughput {tp:.2f}x, latency {lat:.2f}x (target <= 2x)")
PY

echo
echo "== process start and idle memory (bench/macro/startup_bench)"
"$build_dir/bench/macro/startup_bench" --binary "$build_dir/src/gpu-node-supervisor"

echo
echo "== one NVML health pass, every group, 8 fake GPUs (bench/macro/nvml_health_bench)"
"$build_dir/bench/macro/nvml_health_bench" --fake-nvml "$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1" \
  --gpus tools/sim/fake_nvml/gpus-8.json --passes 500

echo
echo "== gpuMetrics, 8 fake GPUs x 7 MIG devices with pods (bench/macro/gpu_metrics_bench)"
"$build_dir/bench/macro/gpu_metrics_bench" --fake-nvml "$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1" \
  --gpus tools/sim/fake_nvml/gpus-8.json --passes 500 --scrapes 5000

echo
echo "== device plugin on 8 fake GPUs (bench/macro/device_plugin_bench)"
"$build_dir/bench/macro/device_plugin_bench" --fake-nvml "$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1" \
  --gpus tools/sim/fake_nvml/gpus-8.json

echo
echo "== device plugin: 8x7 MIG registration, replica Allocate, CDI rewrite (bench/macro/device_plugin_sharing_bench)"
"$build_dir/bench/macro/device_plugin_sharing_bench" --fake-nvml "$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1"

echo
echo "== dra-compute-domain prepare/unprepare through the kubelet and API simulators (bench/macro/dra_prepare_bench)"
"$build_dir/bench/macro/dra_prepare_bench"

echo
echo "== dra-gpu prepare/unprepare of a whole-GPU claim and a MIG claim through the kubelet and API simulators (bench/macro/dra_gpu_prepare_bench)"
"$build_dir/bench/macro/dra_gpu_prepare_bench"

echo
echo "== dra-gpu device health: verdict -> slice taint and kubelet health stream (bench/macro/dra_health_bench)"
"$build_dir/bench/macro/dra_health_bench"

echo
echo "== journal -> gpu-health -> device plugin: classify rate, append -> Unhealthy, 1M-line flood (bench/macro/journal_health_bench)"
"$build_dir/bench/macro/journal_health_bench" --catalog config/xid-catalog.yaml --gpus tools/sim/fake_nvml/gpus-8.json

echo
echo "== whole binary with gpu-inventory + device-plugin serving 8 fake GPUs to the kubelet simulator"
sandbox=$(mktemp -d /tmp/gns-bench-XXXXXX)
mkdir -p "$sandbox/var/lib/kubelet" "$sandbox/host"
"$build_dir/tools/sim/kubelet/gns-sim-kubelet" --kubelet-dir "$sandbox/var/lib/kubelet" > /dev/null 2>&1 &
kubelet_pid=$!
cat > "$sandbox/site.yaml" <<YAML
version: v1
nodeName: bench
paths: {kubeletDir: $sandbox/var/lib/kubelet, cdiDir: $sandbox, stateDir: $sandbox, hostRoot: $sandbox/host}
logging: {level: warn}
modules:
  metrics: {enabled: true, listen: 127.0.0.1:0}
  gpu-inventory: {enabled: true, nvmlLibrary: $PWD/$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1, eventWaitTimeout: 1s}
  device-plugin: {enabled: true}
YAML
FAKE_NVML_CONFIG=$PWD/tools/sim/fake_nvml/gpus-8.json "$build_dir/bench/macro/startup_bench" \
  --binary "$build_dir/src/gpu-node-supervisor" --config "$sandbox/site.yaml" --label "8 GPUs, device plugin serving" \
  --runs 5 --idle-ms 2000
echo
echo "== SIGTERM -> exit with the NVML event waiter blocked (default eventWaitTimeout 5s), 50 start/stop cycles"
sed -i 's/, eventWaitTimeout: 1s//' "$sandbox/site.yaml"
FAKE_NVML_CONFIG=$PWD/tools/sim/fake_nvml/gpus-8.json "$build_dir/bench/macro/startup_bench" \
  --binary "$build_dir/src/gpu-node-supervisor" --config "$sandbox/site.yaml" --label "8 GPUs, NVML waiter blocked" \
  --runs 50 --idle-ms 0 --settle-ms 300
kill "$kubelet_pid" 2>/dev/null || true
wait "$kubelet_pid" 2>/dev/null || true
rm -rf "$sandbox"

echo
echo "== gpu-health's polled checks, 8 fake GPUs: resident memory with the checks on vs off (issue 26: +<= 1 MiB)"
# The same binary and site twice, gpu-inventory + gpu-health: once with every polled check at a
# 1 s interval (about 15 passes of every group before the figure is read), once with checks off.
# Three of each, alternating; the medians' difference is what the checks keep resident.
checks_site() {  # $1: the gpu-health checks section
  cat <<YAML
version: v1
nodeName: bench
paths: {kubeletDir: $sandbox/var/lib/kubelet, cdiDir: $sandbox, stateDir: $sandbox, hostRoot: $sandbox/host}
logging: {level: warn}
modules:
  metrics: {enabled: true, listen: 127.0.0.1:0}
  gpu-inventory: {enabled: true, nvmlLibrary: $PWD/$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1}
  gpu-health:
    enabled: true
    checks: $1
YAML
}
sandbox=$(mktemp -d /tmp/gns-bench-XXXXXX)
mkdir -p "$sandbox/var/lib/kubelet" "$sandbox/host"
checks_site "{memory: {interval: 1s}, nvlink: {interval: 1s}, fabric: {interval: 1s}, pcie: {interval: 1s}, thermal: {interval: 1s}, host: {enabled: false}}" > "$sandbox/on.yaml"
checks_site "{enabled: false}" > "$sandbox/off.yaml"
for round in 1 2 3; do
  for mode in on off; do
    FAKE_NVML_CONFIG=$PWD/tools/sim/fake_nvml/gpus-8.json "$build_dir/bench/macro/startup_bench" \
      --binary "$build_dir/src/gpu-node-supervisor" --config "$sandbox/$mode.yaml" --label "checks $mode" \
      --runs 1 --idle-ms 15000 | grep '^idle memory' | tee -a "$sandbox/memory.txt"
  done
done
/usr/bin/python3 - "$sandbox/memory.txt" <<'PY'
import re, statistics, sys
kb = {"on": {"VmRSS": [], "RssAnon": []}, "off": {"VmRSS": [], "RssAnon": []}}
for line in open(sys.argv[1]):
    mode = re.search(r"\(checks (on|off)\)", line).group(1)
    for key in ("VmRSS", "RssAnon"):
        kb[mode][key].append(int(re.search(key + r" (\d+) kB", line).group(1)))
for key in ("VmRSS", "RssAnon"):
    on, off = statistics.median(kb["on"][key]), statistics.median(kb["off"][key])
    delta = (on - off) / 1024
    print(f"checks' resident cost, {key} medians: on {on / 1024:.2f} MiB, off {off / 1024:.2f} MiB: "
          f"{delta:+.2f} MiB (budget +<= 1 MiB: {'met' if delta <= 1.0 else 'NOT met'})")
PY
rm -rf "$sandbox"

echo
echo "== kube informer: watch decode+apply, relist and memory per cached Node (bench/micro/kube)"
"$build_dir/bench/micro/kube/kube_watch_decode_bench" --benchmark_out="$out/kube.json" --benchmark_out_format=json
/usr/bin/python3 - "$out/kube.json" <<'PY'
import json, sys
runs = {b["name"].split("/iterations")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
for arg, what in (("0", "whole objects"), ("1", "projected: labels + addresses")):
    rate = runs[f"BM_WatchDecodeApply/{arg}"]["items_per_second"]
    relist = runs[f"BM_Relist10kNodes/{arg}"]["cpu_time"]  # CPU: the 2 cores are shared
    mem = runs[f"BM_MemoryPerCachedNode/{arg}"]
    ratio = mem["bytes_per_node"] / mem["json_bytes_per_node"]
    print(f"informer ({what}): decode+apply {rate/1000:.1f}k events/s (target >= 50k); relist of 10k "
          f"{relist:.0f} ms (target <= 200 ms); {mem['bytes_per_node']/1000:.1f} KB per cached Node = "
          f"{ratio:.2f}x its {mem['json_bytes_per_node']/1000:.1f} KB of JSON (target <= 1.5x)")
PY

echo
echo "== whole binary at rest, every module on (the make run set), production timers (tools/idle-bench.sh)"
tools/idle-bench.sh "$build_dir" || echo "idle bench: no figures (see the lines above)"
echo
echo "== whole binary at rest, the shipped ConfigMap's modules, production timers (GNS_IDLE_MODULES=shipped tools/idle-bench.sh)"
GNS_IDLE_MODULES=shipped tools/idle-bench.sh "$build_dir" || echo "idle bench: no figures (see the lines above)"

echo
echo "== gkm-agent: pull + extract of a 1 GiB cache beside skopeo copy (bench/macro/gkm_pull_bench)"
if [[ -x "$build_dir/bench/macro/gkm_pull_bench" ]]; then
  "$build_dir/bench/macro/gkm_pull_bench" --bytes $((1024 << 20)) --source-dir "$PWD"
fi

echo
echo "== pod-resources: pod change -> annotation written; API requests at steady state (bench/macro/pod_resources_bench)"
if [[ -x "$build_dir/bench/macro/pod_resources_bench" ]]; then
  "$build_dir/bench/macro/pod_resources_bench" --rounds 50 --steady-ms 3000
fi

echo
echo "== gpu-reset: XID 48 -> autoReset -> Healthy again, our overhead beside the reset command (bench/macro/gpu_reset_bench.py)"
/usr/bin/python3 bench/macro/gpu_reset_bench.py --build "$build_dir" --rounds 30 --settle 0s
echo "   the same with the kernel line only (no NVML event before the reset: its release may sit out one long wait)"
/usr/bin/python3 bench/macro/gpu_reset_bench.py --build "$build_dir" --rounds 10 --settle 0s --no-nvml-xid
echo "   an operator's reset-gpu with no XID before it, production defaults (settle 10s watched in service, eventWaitTimeout 5s)"
/usr/bin/python3 bench/macro/gpu_reset_bench.py --build "$build_dir" --rounds 20 --request cli

echo
echo "== imex-health: nvidia-imex.service stopped -> ImexHealthy False at the API simulator, idle wake-ups (bench/macro/imex_health_bench)"
if [[ -x "$build_dir/bench/macro/imex_health_bench" ]]; then
  GNS_BINARY_DIR="$PWD/$build_dir" "$build_dir/bench/macro/imex_health_bench" --rounds 50 --idle-ms 3000
fi

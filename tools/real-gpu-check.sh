#!/usr/bin/env bash
# The check on a real GPU node (no cluster needed): what NVML tells `inventory` beside what
# nvidia-smi says, `scan` (every polled health check once), then the supervisor itself on the
# real NVML for a few seconds with the device plugin registered at the kubelet simulator,
# gpu-health's polled checks every 2 s, our CDI spec written from the real driver files, and
# /debug/state and /metrics read back. Read-only towards the GPU: it never resets,
# never changes persistence or MIG mode.
#
#   tools/real-gpu-check.sh BUILD_DIR [OUT_DIR]
#
# BUILD_DIR holds src/gpu-node-supervisor and tools/sim/kubelet/gns-sim-kubelet (the release or
# the test build). Everything written goes under OUT_DIR (default: a temp directory).
set -uo pipefail

build_dir=${1:?usage: tools/real-gpu-check.sh BUILD_DIR [OUT_DIR]}
out=${2:-$(mktemp -d)}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$build_dir/src/gpu-node-supervisor
kubelet=$build_dir/tools/sim/kubelet/gns-sim-kubelet
mkdir -p "$out"

section() { printf '\n==== %s\n' "$*"; }

section "driver and GPUs as nvidia-smi sees them"
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,driver_version,persistence_mode,mig.mode.current \
  --format=csv 2>&1 | tee "$out/nvidia-smi.csv"
nvidia-smi -q > "$out/nvidia-smi-q.txt" 2>&1
grep -E 'Minor Number|NUMA|Fabric|Cluster UUID|Clique|State  |Status ' "$out/nvidia-smi-q.txt" | sed 's/^ */  /' | head -30
ldconfig -p | grep -E 'libnvidia-ml\.so' || echo "libnvidia-ml not in the linker cache"

section "gpu-node-supervisor inventory"
nvml=${GNS_NVML_LIBRARY:-libnvidia-ml.so.1}
"$bin" inventory --nvml-library "$nvml" --host-root / > "$out/inventory.json" 2> "$out/inventory.err"
echo "exit $?"
cat "$out/inventory.json" "$out/inventory.err"

section "inventory against nvidia-smi"
/usr/bin/env python3 - "$out/inventory.json" "$out/nvidia-smi.csv" <<'PY'
import csv, json, sys
inv = json.load(open(sys.argv[1]))
rows = list(csv.reader(open(sys.argv[2]), skipinitialspace=True))[1:]
gpus = inv["inventory"]["gpus"] if isinstance(inv.get("inventory"), dict) else inv["inventory"]
by_uuid = {g.get("uuid"): g for g in gpus}
bad = 0
for r in rows:
    uuid, pci, mem = r[1], r[3], r[4]
    g = by_uuid.get(uuid)
    if g is None:
        print(f"MISSING {uuid}: nvidia-smi lists it, inventory does not"); bad += 1; continue
    ours_pci = str(g.get("pciBusId", g.get("pci", ""))).lower()
    same_pci = ours_pci.endswith(pci.lower()[-12:]) or pci.lower().endswith(ours_pci[-12:])
    print(f"{uuid}: pci nvidia-smi={pci} ours={ours_pci} {'same' if same_pci else 'DIFFERENT'}; "
          f"memory nvidia-smi={mem} ours={g.get('memoryTotalBytes')} bytes")
    bad += 0 if same_pci else 1
print(f"{len(rows)} GPU(s) by nvidia-smi, {len(gpus)} by inventory, {bad} difference(s)")
PY

section "gpu-node-supervisor scan (every polled health check once, then twice 5 s apart)"
"$bin" scan --nvml-library "$nvml" --host-root / > "$out/scan.txt" 2>&1
echo "exit $?"
cat "$out/scan.txt"
"$bin" scan --nvml-library "$nvml" --host-root / --output json --window 5s > "$out/scan.json" 2> "$out/scan.err"
echo "exit $? (with --window 5s)"
/usr/bin/env python3 - "$out/scan.json" <<'PY2'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except Exception as e:
    print("no JSON report:", e); sys.exit(0)
print(f"ok {report.get('ok')}, healthy {report.get('healthy')}, pass {report.get('passMicros')} us, "
      f"pciGpuCount {report.get('pciGpuCount')}")
for g in report.get("gpus", []):
    held = [f for f in g.get("findings", []) if f.get("holds")]
    print(f"  GPU {g['index']} {g['uuid']}: {len(g.get('findings', []))} checks judged, {len(held)} hold; "
          f"failed NVML calls {g.get('failedFunctions', [])}")
    for f in held:
        print(f"    {f['check']}: {f['severity']} {f['recommendedAction']}: {f['message'][:160]}")
PY2

section "preflight on this host (an IMEX node passes; elsewhere each failure says why and how to fix it)"
"$bin" preflight --host-root / --output json > "$out/preflight.json" 2> "$out/preflight.err"
echo "exit $?"
/usr/bin/env python3 - "$out/preflight.json" <<'PY'
import json, sys
try:
    checks = json.load(open(sys.argv[1]))["checks"]
except Exception as e:  # the report is the point: show what came back
    print("no JSON report:", e); sys.exit(0)
for c in checks:
    print(f"  {c['status']:5} {c['name']}: {c['message'][:150]}")
PY
cat "$out/preflight.err"

section "the supervisor on the real NVML (gpu-inventory, device-plugin at the kubelet simulator, metrics)"
sandbox=$(mktemp -d)
port=$(/usr/bin/env python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
trap 'kill $spid $kpid 2>/dev/null' EXIT
mkdir -p "$sandbox"/{kubelet/device-plugins,kubelet/plugins_registry,kubelet/plugins,cdi,state}
chmod 0700 "$sandbox/state"
cat > "$sandbox/config.yaml" <<YAML
version: v1
nodeName: real-gpu-check
paths: {kubeletDir: $sandbox/kubelet, cdiDir: $sandbox/cdi, stateDir: $sandbox/state, hostRoot: /}
logging: {format: text, level: info}
modules:
  metrics: {enabled: true, listen: 127.0.0.1:$port, gpuMetrics: {enabled: true, interval: 2s}}
  gpu-inventory: {enabled: true, nvmlLibrary: $nvml, eventWaitTimeout: 1s}
  gpu-health:
    enabled: true
    adminSocket: false
    watchAnnotation: false
    checks:
      clearAfterPasses: 2
      memory: {interval: 2s}
      nvlink: {interval: 2s}
      fabric: {interval: 2s}
      pcie: {interval: 2s}
      thermal: {interval: 2s}
      host: {interval: 2s}
  device-plugin:
    enabled: true
    deviceListStrategy: [cdi-cri, envvar]
    passDeviceSpecs: true
    cdi: {enabled: true, driverRoot: /}
YAML
"$kubelet" --kubelet-dir "$sandbox/kubelet" --control-socket "$sandbox/kubelet.ctl" > "$out/kubelet-sim.log" 2>&1 &
kpid=$!
sleep 0.5
"$bin" run --config "$sandbox/config.yaml" > "$out/supervisor.log" 2>&1 &
spid=$!
for _ in $(seq 100); do
  /usr/bin/env python3 "$repo/tools/sim/kubelet/kubeletctl.py" --socket "$sandbox/kubelet.ctl" state 2>/dev/null \
    | grep -q '"Healthy"' && break
  sleep 0.1
done
sleep 6  # gpu-health's checks (2 s intervals) make a few passes
section "kubelet simulator: what the device plugin advertises"
/usr/bin/env python3 "$repo/tools/sim/kubelet/kubeletctl.py" --socket "$sandbox/kubelet.ctl" state > "$out/kubelet-state.json"
/usr/bin/env python3 - "$out/kubelet-state.json" <<'PY'
import json, sys
for name, r in json.load(open(sys.argv[1])).get("resources", {}).items():
    print(f"{name}: registrations {r['registrations']}, healthy {r['healthy']}, unhealthy {r['unhealthy']}, "
          f"devices {[(d['id'], d['health'], d['numa']) for d in r['devices']]}")
PY
first=$(/usr/bin/env python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["inventory"]["gpus"][0]["uuid"])' "$out/inventory.json")
section "Allocate of $first through the kubelet simulator"
/usr/bin/env python3 "$repo/tools/sim/kubelet/kubeletctl.py" --pretty --socket "$sandbox/kubelet.ctl" allocate nvidia.com/gpu "$first" | tee "$out/allocate.json"
section "our CDI spec from the real driver files"
ls -l "$sandbox/cdi"
cp "$sandbox"/cdi/*.json "$out/" 2>/dev/null
/usr/bin/env python3 - "$sandbox"/cdi/*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    spec = json.load(open(path))
    edits = spec.get("containerEdits", {})
    print(f"{path}: cdiVersion {spec.get('cdiVersion')}, kind {spec.get('kind')}, devices {[d['name'] for d in spec.get('devices', [])]}")
    print(f"  common device nodes: {[d['path'] for d in edits.get('deviceNodes', [])]}")
    mounts = edits.get("mounts", [])
    print(f"  driver files mounted: {len(mounts)}; first: {[m.get('hostPath') for m in mounts[:8]]}")
    print(f"  hooks: {[h.get('path') for h in edits.get('hooks', [])]}; env: {edits.get('env')}")
PY
section "/debug/state and /metrics"
/usr/bin/env python3 - "$port" <<'PY' > "$out/debug-state.json"
import sys, urllib.request; print(urllib.request.urlopen("http://127.0.0.1:%s/debug/state" % sys.argv[1], timeout=5).read().decode())
PY
/usr/bin/env python3 - "$out/debug-state.json" <<'PY'
import json, sys
state = json.load(open(sys.argv[1]))
print("retained topics:", sorted(state))
for key in ("gpu-inventory.devices", "gpu-inventory.clique", "device-plugin.state", "gpu-health.checks",
            "gpu-health.state"):
    print(key, json.dumps(state.get(key))[:1500])
PY
/usr/bin/env python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:"+__import__("sys").argv[1]+"/metrics", timeout=5).read().decode())' "$port" \
  > "$out/metrics.txt"
grep -E '^gpu_node_supervisor_(gpu|nvml|device|health|check)' "$out/metrics.txt" | head -60
section "the GPU series under dcgm-exporter's names (metrics.gpuMetrics)"
grep -E '^DCGM_FI_' "$out/metrics.txt" | sed -E 's/\{.*\}/{...}/' | sort | uniq -c | head -40
grep -E '^DCGM_FI_DEV_(GPU_TEMP|POWER_USAGE|FB_USED|SM_CLOCK)\{' "$out/metrics.txt" | head -4
section "NVML events gpu-inventory registered (XID always; ECC and clock where the GPU supports them)"
grep -E 'NVML events of|registered' "$out/supervisor.log" | head -10
grep -E '^gpu_node_supervisor_(nvml_health_events|gpu_health_check_event_passes)' "$out/metrics.txt" | head
section "stop"
kill -TERM $spid; wait $spid; echo "supervisor exit $?"
kill $kpid 2>/dev/null; wait $kpid 2>/dev/null
tail -40 "$out/supervisor.log"
echo "results in $out"

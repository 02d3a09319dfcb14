#!/usr/bin/env bash
# `make run`: the whole supervisor on a simulated node. Every host path lives in a sandbox
# directory; the fakes of tools/sim/ (API server, kubelet, NVML, journal) are started here as
# they exist, and everything is torn down on Ctrl-C.
set -euo pipefail

build_dir=${1:-build/release}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
[[ $build_dir == /* ]] || build_dir=$repo/$build_dir   # relative to the checkout, or absolute

export GNS_SANDBOX=${GNS_SANDBOX:-$repo/.run/sim}
export NODE_NAME=${NODE_NAME:-sim-node-0}
export GNS_METRICS_LISTEN=${GNS_METRICS_LISTEN:-127.0.0.1:9464}
rm -rf "$GNS_SANDBOX"
mkdir -p "$GNS_SANDBOX"/{var/lib/kubelet/device-plugins,var/lib/kubelet/plugins_registry,var/lib/kubelet/plugins,var/run/cdi,var/lib/gpu-node-supervisor,host/proc,journal}
chmod 0700 "$GNS_SANDBOX/var/lib/gpu-node-supervisor"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# The fake NVML (8 H200-like GPUs, two NUMA nodes, NVLink pairs, one clique), loaded by the
# real dlopen path; XIDs can be injected with tools/sim/fake_nvml/fakenvmlctl.py.
# gpus-8.json with GPU 7 split into MIG devices (3g.71gb, 2g.35gb, 2x 1g.18gb): the device plugin
# shows a mixed-MIG GPU and a time-sliced MIG resource.
export FAKE_NVML_CONFIG=${FAKE_NVML_CONFIG:-$repo/tools/sim/fake_nvml/gpus-local.json}
# A sandbox copy the fake reads: demo.py's dra-gpu MIG step rewrites it (a MIG reconfiguration).
cp "$FAKE_NVML_CONFIG" "$GNS_SANDBOX/gpus.json" && export FAKE_NVML_CONFIG=$GNS_SANDBOX/gpus.json
export FAKE_NVML_CONTROL=$GNS_SANDBOX/fake-nvml.sock
export GNS_NVML_LIBRARY=$build_dir/tools/sim/fake_nvml/libnvidia-ml.so.1

# The host as the supervisor sees it through hostRoot: the IMEX channel major is registered.
cat > "$GNS_SANDBOX/host/proc/devices" <<DEVICES
Character devices:
  1 mem
195 nvidia-frontend
234 nvidia-caps
509 nvidia-caps-imex-channels
510 nvidia-uvm

Block devices:
  8 sd
DEVICES

# The MIG capability minors of GPU 7's GPU/compute instances (gpus-local.json), which the device
# plugin's CDI spec turns into /dev/nvidia-caps/nvidia-cap<N> nodes of each MIG device.
mkdir -p "$GNS_SANDBOX/host/proc/driver/nvidia-caps"
cat > "$GNS_SANDBOX/host/proc/driver/nvidia-caps/mig-minors" <<MINORS
config 1
monitor 2
gpu7/gi1/access 66
gpu7/gi1/ci0/access 67
gpu7/gi5/access 102
gpu7/gi5/ci0/access 103
gpu7/gi13/access 174
gpu7/gi13/ci0/access 175
gpu7/gi14/access 183
gpu7/gi14/ci0/access 184
MINORS
# GPU 6 (dra-gpu's) once demo.py's MIG step splits it into two 1g.18gb (GPU instances 9 and 10).
cat >> "$GNS_SANDBOX/host/proc/driver/nvidia-caps/mig-minors" <<MINORS
gpu6/gi9/access 120
gpu6/gi9/ci0/access 121
gpu6/gi10/access 129
gpu6/gi10/ci0/access 130
MINORS

# Host IMEX as imex-health sees it under hostRoot: config, a node map that lists this node
# (its InternalIP in the seed), channel 0 (a real character device when we may mknod).
mkdir -p "$GNS_SANDBOX/host/etc/nvidia-imex" "$GNS_SANDBOX/host/dev/nvidia-caps-imex-channels" "$GNS_SANDBOX/dbus"
cat > "$GNS_SANDBOX/host/etc/nvidia-imex/config.cfg" <<IMEXCFG
DAEMONIZE=0
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg
IMEX_CMD_ENABLED=1
IMEX_CMD_PORT=50005
IMEXCFG
printf '10.0.0.10\n10.0.0.11\n' > "$GNS_SANDBOX/host/etc/nvidia-imex/nodes_config.cfg"
mknod "$GNS_SANDBOX/host/dev/nvidia-caps-imex-channels/channel0" c 509 0 2>/dev/null || true
# nvidia-imex-ctl of host-managed IMEX (imex-health's domain check): a fake whose answers come
# from host/usr/bin/nvidia-imex-ctl.state (READY, down, hang, fail N; see the script).
mkdir -p "$GNS_SANDBOX/host/usr/bin"
install -m 0755 tools/sim/systemd/host-nvidia-imex-ctl "$GNS_SANDBOX/host/usr/bin/nvidia-imex-ctl"
rm -f "$GNS_SANDBOX/host/usr/bin/nvidia-imex-ctl.state"

# A private system bus (Debian's dbus-daemon) with the fake systemd of tools/sim/systemd on it:
# nvidia-imex.service runs; stop/start it with
#   busctl --address=unix:path=$GNS_SANDBOX/dbus/bus.sock call org.freedesktop.systemd1 \
#     /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager StopUnit ss nvidia-imex.service replace
cat > "$GNS_SANDBOX/dbus/bus.conf" <<BUSCONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$GNS_SANDBOX/dbus/bus.sock</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/><allow own="*"/><allow send_destination="*"/><allow receive_sender="*"/>
  </policy>
</busconfig>
BUSCONF
dbus-daemon --config-file="$GNS_SANDBOX/dbus/bus.conf" --nofork --nopidfile > >(sed -u 's/^/[dbus-daemon] /') 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S "$GNS_SANDBOX/dbus/bus.sock" ]] && break; sleep 0.05; done
"$build_dir/tools/sim/systemd/gns-fake-systemd" --address "unix:path=$GNS_SANDBOX/dbus/bus.sock" \
  --unit nvidia-imex.service --unit nvidia-persistenced.service --unit nvidia-fabricmanager.service > >(sed -u 's/^/[fake-systemd] /') 2>&1 &
pids+=($!)

# The API-server simulator (HTTPS, its own CA; writes kubeconfig, ca.crt and token).
mkdir -p "$GNS_SANDBOX/apiserver"
# GNS_SIM_BOOKMARK_MS: how often idle watches get a BOOKMARK (the simulator's default is 1 s so
# that tests see them soon; kube-apiserver sends one about every minute: tools/idle-bench.sh).
"$build_dir/tools/sim/apiserver/gns-sim-apiserver" --listen 127.0.0.1:0 --state-dir "$GNS_SANDBOX/apiserver" \
  --seed tools/sim/seed/sim-node.yaml --seed deploy/crd-computedomains.yaml --seed deploy/crd-computedomaincliques.yaml ${GNS_SIM_BOOKMARK_MS:+--bookmark-interval-ms "$GNS_SIM_BOOKMARK_MS"} > >(sed -u 's/^/[apiserver-sim] /') 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s "$GNS_SANDBOX/apiserver/kubeconfig" ]] && break; sleep 0.1; done
[[ -s "$GNS_SANDBOX/apiserver/kubeconfig" ]] || { echo "the API-server simulator did not start" >&2; exit 1; }

# A real OCI registry (Debian's docker-registry) on loopback with TLS, for the gkm-agent, with
# one kernel-cache image in it (a fake Triton cache for sm_80 and sm_90).
reg=$GNS_SANDBOX/registry
mkdir -p "$reg/data" "$GNS_SANDBOX/var/lib/gkm/caches" "$GNS_SANDBOX/run/gkm/usage"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$reg/key.pem" \
  -out "$reg/ca.pem" -days 7 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null
reg_port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
cat > "$reg/config.yml" <<REGISTRY
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $reg/data}}
http: {addr: 127.0.0.1:$reg_port, tls: {certificate: $reg/ca.pem, key: $reg/key.pem}}
REGISTRY
docker-registry serve "$reg/config.yml" > >(sed -u 's/^/[registry] /') 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  /usr/bin/python3 -c 'import ssl,sys,urllib.request as u;u.urlopen(sys.argv[1],context=ssl.create_default_context(cafile=sys.argv[2]),timeout=1)' \
    "https://127.0.0.1:$reg_port/v2/" "$reg/ca.pem" 2>/dev/null && break; sleep 0.1
done
/usr/bin/python3 tools/sim/oci_push.py --registry "127.0.0.1:$reg_port" --cacert "$reg/ca.pem" \
  --repo caches/triton-demo --tag v1 --triton 80,90 > "$reg/pushed.json"
echo "127.0.0.1:$reg_port/caches/triton-demo:v1" > "$reg/image"

# The kubelet simulator: device-plugin registration + ListAndWatch, plugin watcher, DRA calls,
# PodResourcesLister (var/lib/kubelet/pod-resources/kubelet.sock).
"$build_dir/tools/sim/kubelet/gns-sim-kubelet" --kubelet-dir "$GNS_SANDBOX/var/lib/kubelet" \
  --control-socket "$GNS_SANDBOX/kubelet-control.sock" > >(sed -u 's/^/[kubelet-sim] /') 2>&1 &
pids+=($!)

# NVSentinel's platform connector (tools/sim/nvsentinel): records every HealthEvent the
# nvsentinel-export module sends, one JSON line each, in nvsentinel/received.jsonl.
mkdir -p "$GNS_SANDBOX/nvsentinel" "$GNS_SANDBOX/var/run"
"$build_dir/tools/sim/nvsentinel/gns-sim-nvsentinel" --socket "$GNS_SANDBOX/var/run/nvsentinel.sock" \
  --record "$GNS_SANDBOX/nvsentinel/received.jsonl" > >(sed -u 's/^/[nvsentinel-sim] /') 2>&1 &
pids+=($!)

# journald's native socket under hostRoot: the gpu-reset module writes "GPU reset started /
# occurred" lines there; they land in a real journal file beside the others, for gpu-health.
export GNS_REPO=$repo
/usr/bin/python3 tools/sim/journal/journald-sim.py --socket "$GNS_SANDBOX/host/run/systemd/journal/socket" \
  --output "$GNS_SANDBOX/journal/native.journal" > >(sed -u 's/^/[journald-sim] /') 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S "$GNS_SANDBOX/host/run/systemd/journal/socket" ]] && break; sleep 0.05; done

# A GPU that failed before the supervisor came up: its Xid is already in the journal, and
# gpu-health must act on it at start (the health stream is read at gpu-health's position).
tools/sim/journal/journal-sim.sh "$GNS_SANDBOX/journal" xid 0000:2a:00 79 "GPU has fallen off the bus."

echo "simulated node '$NODE_NAME' in $GNS_SANDBOX"
echo "  metrics:      http://$GNS_METRICS_LISTEN/metrics"
echo "  health:       http://$GNS_METRICS_LISTEN/healthz  http://$GNS_METRICS_LISTEN/readyz"
echo "  debug state:  http://$GNS_METRICS_LISTEN/debug/state"
echo "  inject an XID:  tools/sim/fake_nvml/fakenvmlctl.py --socket $FAKE_NVML_CONTROL inject-xid GPU-… 79"
echo "  kubelet:        tools/sim/kubelet/kubeletctl.py --socket $GNS_SANDBOX/kubelet-control.sock state"
echo "  reset a GPU:     $build_dir/src/gpu-node-supervisor reset-gpu --state-dir $GNS_SANDBOX/var/lib/gpu-node-supervisor --gpu GPU-…"
echo "  host IMEX:       busctl --address=unix:path=$GNS_SANDBOX/dbus/bus.sock call org.freedesktop.systemd1 /org/freedesktop/systemd1 org.freedesktop.systemd1.Manager StopUnit ss nvidia-imex.service replace"
echo "  NVSentinel:      $GNS_SANDBOX/nvsentinel/received.jsonl (HealthEvents the platform-connector sim took)"
echo "Ctrl-C stops everything."

# gkm-csi bind-mounts kernel caches at pod paths in the sandbox: the supervisor runs in a mount
# namespace of its own (private), so nothing it mounts reaches this machine's mounts, and all of it
# goes with the process. Not root: no namespace, and the demo's CSI step says why it cannot mount.
launch=()
if [[ $(id -u) == 0 ]] && unshare --mount --propagation private true 2>/dev/null; then
  launch=(unshare --mount --propagation private)
fi
mkdir -p "$GNS_SANDBOX/var/lib/kubelet/pods"
"${launch[@]}" "$build_dir/src/gpu-node-supervisor" run --config "${GNS_CONFIG:-config/local.yaml}" &
supervisor=$!
pids+=("$supervisor")
# The walk-through of every module (prints [demo] lines); the supervisor keeps running after it.
# Then driver-managed IMEX (HostManagedIMEX off) on a second simulated cluster of three nodes,
# each its own supervisor running the domain's nvidia-imex (tools/sim/driver_managed_demo.py).
[[ ${GNS_DEMO:-1} == 1 ]] && {
  { GNS_BUILD_DIR=$build_dir GNS_SUPERVISOR_PID=$supervisor /usr/bin/python3 tools/sim/demo.py && GNS_BUILD_DIR=$build_dir /usr/bin/python3 tools/sim/driver_managed_demo.py; } &
  pids+=($!)
}
# Ctrl-C reaches every process of the foreground group, the supervisor included: the script
# only waits (forwarding it too would be a second signal, which stops the supervisor hard).
# A SIGTERM sent to this script alone is passed on.
trap ':' INT
trap 'kill -TERM $supervisor 2>/dev/null || true' TERM
wait "$supervisor" || true
wait "$supervisor" 2>/dev/null || true

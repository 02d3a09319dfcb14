#!/usr/bin/python3
"""The `make run` walk-through: drives the simulated node through every module once and prints
what the supervisor did, as an operator would see it from the outside (kubelet simulator,
API-server simulator, /debug/state). Started by tools/sim/run-local.sh after the supervisor.

  1. device plugin: 7 GPUs and GPU 7's MIG devices advertised to the kubelet (migStrategy mixed:
     one resource per MIG profile), a time-sliced MIG resource (replicas, .shared) allocated;
     pod resources: a pod allocated a GPU gets the dgxc.nvidia.com/devices annotation (and the
     GPU -> pod map in /debug/state), and loses it when its containers end;
  2. an NVRM Xid line in the journal turns a GPU Unhealthy at the kubelet, a reset ack heals it;
     an Xid written before the supervisor started is acted on too; XID 154 names the recovery
     action the driver wants; an Xid that NVML and the kernel log both report counts once;
     an Xid 162 turns a GPU Unhealthy and the Xid 163 that resolves it Healthy again;
  3. a ComputeDomain becomes Ready with its workload ResourceClaimTemplate (controller), and
     that template, deleted by hand, comes back;
  4. a channel claim is prepared (CDI spec for channel 0) and unprepared by the kubelet (DRA);
  5. the ComputeDomain is deleted cleanly (template and finalizers gone);
  6. host IMEX (imex-health): the fake nvidia-imex.service stopped over D-Bus turns the Node
     condition ImexHealthy False (ServiceInactive), started again True;
  7. the node map (imex-peers): while the channel claim of step 4 is prepared, a Node joins the
     clique -> nodes_config.cfg rewritten, the IMEX restart waits (ImexRestartPending) until the
     claim is unprepared.
  8. gkm-agent: a GKMCache image on the loopback registry becomes Ready and Compatible;
     gkm-csi: registered with the kubelet simulator (plugin watcher, CSIPlugin), which publishes
     a pod's inline volume of that cache as the kubelet does (kubeletctl csi-publish: bind-mounted
     read-only, usage.json and the GKMCacheNode name the pod), then unpublishes it;
     gkm-controller: the GKMCache's status counts this node (totalNodes, readyNodes, Error False).
  (after 2) gpu-reset: an Xid 48 on a GPU a pod holds -> a GPUReset object -> the pod evicted ->
     the GPU reset by the fake nvidia-smi, validated -> Healthy, Complete=True; the others stay
     Healthy throughout.
  (after dra-gpu) device health: an Xid on DRA's GPU -> a gpu.nvidia.com/xid taint on its slice
     device and UNHEALTHY on the kubelet's health stream; the reset ack -> taint gone, HEALTHY.
  (last) dra-gpu MIG: DRA's GPU 6 split into MIG devices (fake NVML reload) -> gpu-6-mig-19-1-1 in
     the slice, a MigDeviceConfig claim prepared (CDI: /dev/nvidia6 + its nvidia-caps nodes) and
     unprepared; GPU 6 whole again.

Standard library only. Waits are bounded; every step says what it waited for if it gives up.
"""

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

SANDBOX = os.environ["GNS_SANDBOX"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRICS = os.environ.get("GNS_METRICS_LISTEN", "127.0.0.1:9464")
NODE = os.environ.get("NODE_NAME", "sim-node-0")
KUBELET_CTL = [sys.executable, os.path.join(REPO, "tools/sim/kubelet/kubeletctl.py"),
               "--socket", os.path.join(SANDBOX, "kubelet-control.sock")]
NVML_CTL = [sys.executable, os.path.join(REPO, "tools/sim/fake_nvml/fakenvmlctl.py"),
            "--socket", os.path.join(SANDBOX, "fake-nvml.sock")]
JOURNAL_SIM = [os.path.join(REPO, "tools/sim/journal/journal-sim.sh"), os.path.join(SANDBOX, "journal")]
API_DIR = os.path.join(SANDBOX, "apiserver")
NS = "team-a"
DRIVER = "compute-domain.nvidia.com"
GPU_UUID = "GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10"
GPU_PCI = "0000:18:00"
EARLY_UUID = "GPU-3f8a1c52-7e01-4b9d-9c1e-5a7d2e8f6b11"  # its Xid 79 is in the journal before start


def say(step, text):
    print(f"[demo] {step}: {text}", flush=True)


def wait_for(what, check, timeout=30.0, interval=0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"[demo] gave up waiting for {what}")
        time.sleep(interval)


def http_get(path):
    try:
        with urllib.request.urlopen(f"http://{METRICS}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def server_url():
    with open(os.path.join(API_DIR, "kubeconfig")) as f:
        for line in f:
            if line.strip().startswith("server:"):
                return line.split("server:", 1)[1].strip().strip("\"'")
    raise SystemExit("[demo] no server in the simulator's kubeconfig")


class Api:
    def __init__(self):
        self.base = server_url()
        self.ctx = ssl.create_default_context(cafile=os.path.join(API_DIR, "ca.crt"))

    def call(self, method, path, body=None, content_type="application/json"):
        with open(os.path.join(API_DIR, "token")) as f:
            token = f.read().strip()
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + token)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


def kubelet(*args):
    out = subprocess.run(KUBELET_CTL + list(args), capture_output=True, text=True)
    return json.loads(out.stdout) if out.stdout.strip() else {}


def device_health(uuid):
    resource = kubelet("state").get("resources", {}).get("nvidia.com/gpu", {})
    for device in resource.get("devices", []):
        if device.get("id") == uuid:
            return device.get("health")
    return None


def metric(series):
    for line in http_get("/metrics")[1].splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def sharing_step(plugin):
    """migStrategy mixed + time-slicing (config/local.yaml): GPU 7 is split into MIG devices, one
    resource per profile; the 1g.18gb one is time-sliced 2 ways and renamed .shared."""
    resources = kubelet("state").get("resources", {})
    counts = {name: len(r.get("devices", [])) for name, r in sorted(resources.items())
              if name.startswith("nvidia.com/")}
    say("device plugin", f"registered resources (migStrategy mixed): {counts}")
    shared = "nvidia.com/mig-1g.18gb.shared"
    replica = sorted(d.get("id") for d in resources.get(shared, {}).get("devices", []))[0]
    allocated = kubelet("allocate", shared, replica)
    if not allocated.get("ok"):
        raise SystemExit(f"[demo] Allocate of {replica} failed: {allocated}")
    response = (allocated.get("response", {}).get("container_responses") or [{}])[0]
    cdi = [d.get("name") for d in response.get("cdi_devices", [])]
    say("device plugin", f"time-sliced replica {replica} -> NVIDIA_VISIBLE_DEVICES="
        f"{response.get('envs', {}).get('NVIDIA_VISIBLE_DEVICES')}, CDI {cdi}; "
        f"CDI spec {plugin.get('cdiSpec', {}).get('path', '(none)')}")
    refused = kubelet("allocate", shared, ",".join(sorted(d.get("id") for d in resources.get(shared, {})
                                                          .get("devices", []))[:2]))
    say("device plugin", f"two replicas in one container (failRequestsGreaterThanOne) -> "
        f"{refused.get('error', refused)}")

    def gpu_labels():
        code, node = Api().call("GET", f"/api/v1/nodes/{NODE}")
        labels = ((node or {}).get("metadata") or {}).get("labels", {}) if code == 200 else {}
        found = {k: v for k, v in labels.items() if k.startswith("nvidia.com/")}
        return found if "nvidia.com/gpu.product" in found and "nvidia.com/mig.strategy" in found else None
    labels = wait_for("the GPU node labels", gpu_labels)
    say("node labels", f"one server-side apply by node-labels: {labels}")


def pod_resources_step(gpu):
    """A pod on this node is admitted with one GPU (the kubelet simulator calls our device plugin's
    Allocate and records it for PodResourcesLister) -> annotated; its containers end -> not."""
    api = Api()
    pods = "/api/v1/namespaces/ml/pods"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer-0", "namespace": "ml"},
           "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda",
                                                      "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
           "status": {"phase": "Pending"}}
    code, created = api.call("POST", pods, pod)
    if code != 201:
        raise SystemExit(f"[demo] creating the pod failed: {code} {created}")
    allocated = kubelet("allocate", "--pod=ml/trainer-0", "--containers=main", "nvidia.com/gpu", gpu)
    if not allocated.get("ok"):
        raise SystemExit(f"[demo] Allocate for ml/trainer-0 failed: {allocated}")
    key = "dgxc.nvidia.com/devices"
    value = wait_for("the pod's devices annotation", lambda: (lambda r: (r[1]["metadata"].get("annotations") or {})
                                                                .get(key) if r[0] == 200 else None)(api.call("GET", pods + "/trainer-0")))
    holders = json.loads(http_get("/debug/state")[1]).get("pod-resources.gpu-pods", {}).get("gpus", {}).get(gpu, [])
    say("pod resources", f"pod ml/trainer-0 allocated {gpu[:12]}… by the kubelet -> annotated {key}: {value}; "
        f"GPU -> pods map: {[h['namespace'] + '/' + h['name'] + ':' + h['container'] for h in holders]}")
    kubelet("forget-pod", "ml/trainer-0")
    api.call("PATCH", pods + "/trainer-0/status", {"status": {"phase": "Succeeded"}}, "application/merge-patch+json")
    wait_for("the annotation removed", lambda: key not in (api.call("GET", pods + "/trainer-0")[1]["metadata"]
                                                          .get("annotations") or {}))
    say("pod resources", "its containers ended (the kubelet no longer lists it) -> annotation removed")


def pod_on(api, namespace, name, gpu):
    """A pod admitted by the kubelet with `gpu` (our device plugin's Allocate) -> annotated."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda",
                                                      "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
           "status": {"phase": "Running"}}
    code, created = api.call("POST", pods, pod)
    if code != 201:
        raise SystemExit(f"[demo] creating pod {namespace}/{name} failed: {code} {created}")
    allocated = kubelet("allocate", f"--pod={namespace}/{name}", "--containers=main", "nvidia.com/gpu", gpu)
    if not allocated.get("ok"):
        raise SystemExit(f"[demo] Allocate for {namespace}/{name} failed: {allocated}")
    wait_for(f"{namespace}/{name} annotated", lambda: (lambda r: (r[1]["metadata"].get("annotations") or {})
                                                      .get("dgxc.nvidia.com/devices") if r[0] == 200 else None)(
        api.call("GET", f"{pods}/{name}")))


def gpu_reset_demo(api):
    """NVSentinel's fault-remediation asks for a GPUReset; the gpu-reset module (holders: evict)
    evicts the pod on the GPU, resets it with the fake nvidia-smi, validates, and the GPU turns
    Healthy; the other GPUs stay Healthy throughout."""
    others = [d for d in kubelet("state").get("resources", {}).get("nvidia.com/gpu", {}).get("devices", [])
              if d.get("id") != GPU_UUID]
    resets = "/apis/janitor.dgxc.nvidia.com/v1alpha1/gpuresets"
    reset = {"apiVersion": "janitor.dgxc.nvidia.com/v1alpha1", "kind": "GPUReset",
             "metadata": {"name": "xid48-" + GPU_UUID[4:12]},
             "spec": {"nodeName": NODE, "selector": {"uuids": [GPU_UUID]}}}
    code, created = api.call("POST", resets, reset)
    if code != 201:
        raise SystemExit(f"[demo] creating the GPUReset failed: {code} {created}")
    name = reset["metadata"]["name"]
    say("gpu reset", f"GPUReset {name} for {GPU_UUID} on {NODE} created (as NVSentinel's fault-remediation does)")
    wait_for("ml/infer-0 evicted", lambda: api.call("GET", "/api/v1/namespaces/ml/pods/infer-0")[0] == 404)
    # The kubelet stops the evicted pod's containers: PodResourcesLister no longer lists it.
    kubelet("forget-pod", "ml/infer-0")
    say("gpu reset", "holders: evict -> pod ml/infer-0 (annotated with the GPU) evicted through the Eviction API")
    healthy_others = []

    def complete():
        healthy_others.append(sum(1 for d in others if device_health(d["id"]) == "Healthy"))
        status = (api.call("GET", f"{resets}/{name}")[1] or {}).get("status") or {}
        for c in status.get("conditions", []):
            if c.get("type") == "Complete" and c.get("status") != "Unknown":
                return status
        return None
    status = wait_for(f"GPUReset {name} Complete", complete, timeout=60)
    condition = next(c for c in status["conditions"] if c["type"] == "Complete")
    steps = ", ".join(f"{s['name']} {s['durationMs']}ms" for s in status["gpus"][0]["steps"])
    say("gpu reset", f"Complete={condition['status']} ({condition['reason']}): {steps}")
    wait_for(f"{GPU_UUID} Healthy again", lambda: device_health(GPU_UUID) == "Healthy")
    say("gpu reset", f"'GPU reset occurred: {GPU_UUID}' in the journal -> Healthy again at the kubelet; the other "
        f"{len(others)} GPUs Healthy at every look ({min(healthy_others)}..{max(healthy_others)} of {len(others)})")


BUS = "unix:path=" + os.path.join(SANDBOX, "dbus", "bus.sock")


def systemctl(verb, unit="nvidia-imex.service"):
    """StopUnit/StartUnit of the fake systemd, over the private system bus (busctl)."""
    subprocess.run(["busctl", f"--address={BUS}", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                    "org.freedesktop.systemd1.Manager", verb, "ss", unit, "replace"],
                   check=True, capture_output=True)


def host_service_demo():
    """Issue 26, host services: nvidia-fabricmanager (a unit of the fake systemd) fails -> a node
    condition of gpu-health, no GPU Unhealthy; started again -> cleared after the clean passes."""
    unit = "nvidia-fabricmanager.service"

    def held():
        checks = json.loads(http_get("/debug/state")[1]).get("gpu-health.checks", {})
        return [c for c in checks.get("conditions", []) if c.get("check") == "FabricManagerNotRunning"]

    subprocess.run(["busctl", f"--address={BUS}", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1",
                    "org.gnssim.FakeSystemd", "Crash", "sib", unit, "1", "false"], check=True, capture_output=True)
    wait_for("FabricManagerNotRunning held", lambda: held(), timeout=30)
    say("gpu health checks", f"{unit} crashed (fake systemd) -> node condition FabricManagerNotRunning "
        f"({held()[0].get('severity')}, {held()[0].get('recommendedAction')}): {held()[0].get('message')}")
    systemctl("StartUnit", unit)
    wait_for("FabricManagerNotRunning cleared", lambda: not held(), timeout=60)
    say("gpu health checks", f"{unit} started again -> FabricManagerNotRunning cleared after the clean passes")


def imex_condition(api):
    return node_condition(api, "ImexHealthy")


def node_condition(api, kind):
    code, node = api.call("GET", f"/api/v1/nodes/{NODE}")
    for c in ((node or {}).get("status") or {}).get("conditions", []) if code == 200 else []:
        if c.get("type") == kind:
            return c
    return None


def nodes_config():
    with open(os.path.join(SANDBOX, "host/etc/nvidia-imex/nodes_config.cfg")) as f:
        return f.read()


def peer_joins(api):
    """A second Node of our clique appears (while a channel claim is prepared here)."""
    code, node = api.call("GET", f"/api/v1/nodes/{NODE}")
    clique = ((node or {}).get("metadata") or {}).get("labels", {}).get("nvidia.com/gpu.clique")
    if not clique:
        say("imex peers", "our Node has no clique label yet; skipping the node-map step")
        return False
    say("imex peers", f"our Node labelled nvidia.com/gpu.clique={clique}; map now {nodes_config().split()}")
    peer = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "sim-node-1", "labels": {"nvidia.com/gpu.clique": clique}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.11"}]}}
    api.call("POST", "/api/v1/nodes", peer)
    # Addresses are status: a create drops them (as the API server does); the kubelet reports them.
    api.call("PATCH", "/api/v1/nodes/sim-node-1/status", {"status": peer["status"]}, "application/merge-patch+json")
    wait_for("nodes_config.cfg rewritten", lambda: "10.0.0.11" in nodes_config())
    pending = wait_for("ImexRestartPending True", lambda: (lambda c: c if c and c["status"] == "True" else None)(
        node_condition(api, "ImexRestartPending")))
    say("imex peers", f"Node sim-node-1 joined the clique -> nodes_config.cfg {nodes_config().split()}; "
        f"ImexRestartPending=True ({pending['reason']}): {pending['message']}")
    return True


def restart_after_unprepare(api):
    done = wait_for("ImexRestartPending False", lambda: (lambda c: c if c and c["status"] == "False" else None)(
        node_condition(api, "ImexRestartPending")))
    say("imex peers", f"claim unprepared -> IMEX restarted: ImexRestartPending=False ({done['reason']})")


def imex_demo(api):
    first = wait_for("the ImexHealthy condition", lambda: imex_condition(api))
    say("imex health", f"Node condition ImexHealthy={first['status']} ({first['reason']}): {first['message']}")
    start = time.monotonic()
    systemctl("StopUnit")
    down = wait_for("ImexHealthy False", lambda: (lambda c: c if c and c["status"] == "False" else None)(imex_condition(api)))
    say("imex health", f"systemctl stop nvidia-imex (fake systemd, real D-Bus) -> ImexHealthy=False "
        f"({down['reason']}) in {1000 * (time.monotonic() - start):.0f} ms: {down['message']}")
    systemctl("StartUnit")
    up = wait_for("ImexHealthy True", lambda: (lambda c: c if c and c["status"] == "True" else None)(imex_condition(api)))
    say("imex health", f"systemctl start nvidia-imex -> ImexHealthy=True ({up['reason']}): {up['message']}")
    # The domain (nvidia-imex-ctl -q / -N, a fake on the sandbox host): a peer down after a restart.
    state = os.path.join(SANDBOX, "host/usr/bin/nvidia-imex-ctl.state")
    if os.path.exists(os.path.join(SANDBOX, "host/usr/bin/nvidia-imex-ctl")):
        with open(state, "w") as f:
            f.write("down\n")
        systemctl("RestartUnit")
        down = wait_for("ImexHealthy DomainNotReady",
                        lambda: (lambda c: c if c and c["reason"] == "DomainNotReady" else None)(imex_condition(api)))
        say("imex health", f"nvidia-imex-ctl -N reports a peer down -> ImexHealthy=False (DomainNotReady): {down['message']}")
        os.remove(state)
        systemctl("RestartUnit")
        up = wait_for("ImexHealthy True", lambda: (lambda c: c if c and c["status"] == "True" else None)(imex_condition(api)))
        say("imex health", f"peers READY again, IMEX restarted -> ImexHealthy=True: {up['message']}")


def dra_gpu_demo(api):
    """dra-gpu (gpu.nvidia.com): GPU 6 is DRA's (config/local.yaml), published in the driver's
    ResourceSlice; a claim the "scheduler" allocated gpu-6 is prepared through the kubelet
    simulator (its CDI spec written), then unprepared."""
    driver = "gpu.nvidia.com"
    slice_path = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{driver}"
    published = wait_for("the gpu.nvidia.com ResourceSlice", lambda: (
        lambda r: r[1] if r[0] == 200 and r[1]["spec"].get("devices") else None)(api.call("GET", slice_path)))
    device = published["spec"]["devices"][0]
    say("dra-gpu", f"ResourceSlice {published['metadata']['name']}: {[d['name'] for d in published['spec']['devices']]}, "
        f"{device['name']} uuid={device['attributes']['uuid']['string']} "
        f"cc={device['attributes'].get('cudaComputeCapability', {}).get('version')} "
        f"memory={device.get('capacity', {}).get('memory', {}).get('value')}")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "trainer-gpu", "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}}}
    code, created = api.call("POST", claims, claim)
    if code != 201:
        raise SystemExit(f"[demo] creating the GPU ResourceClaim failed: {code} {created}")
    created["status"] = {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": driver, "pool": NODE, "device": device["name"]}],
        "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": driver, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}}]}}}
    code, allocated = api.call("PUT", claims + "/trainer-gpu/status", created)
    if code != 200:
        raise SystemExit(f"[demo] allocating the GPU ResourceClaim failed: {code} {allocated}")
    ref = json.dumps({"namespace": NS, "uid": created["metadata"]["uid"], "name": "trainer-gpu"})
    wait_for("gpu.nvidia.com registered with the kubelet",
             lambda: kubelet("state").get("dra_drivers", {}).get(driver, {}).get("registered"))
    prepared = kubelet("prepare", driver, ref)
    say("dra-gpu", f"NodePrepareResources -> {json.dumps(prepared.get('claims'))[:300]}")
    spec = os.path.join(SANDBOX, "var/run/cdi", f"k8s.gpu.nvidia.com-claim_{created['metadata']['uid']}.json")
    with open(spec) as f:
        nodes = [n["path"] for d in json.load(f)["devices"] for n in d["containerEdits"]["deviceNodes"]]
    say("dra-gpu", f"CDI spec {os.path.basename(spec)}: device nodes {nodes}")
    uuid = device["attributes"]["uuid"]["string"]
    # The claim's interval Long set the GPU's scheduler (the fake nvidia-smi compute-policy).
    if gpu_time_slice(uuid) != 3:
        raise SystemExit(f"[demo] the claim's interval Long did not set {uuid}'s time-slice: {gpu_time_slice(uuid)}")
    say("dra-gpu", f"timeSlicingConfig.interval Long -> nvidia-smi compute-policy set {uuid}'s time-slice to 3")
    unprepared = kubelet("unprepare", driver, ref)
    say("dra-gpu", f"NodeUnprepareResources -> {json.dumps(unprepared.get('claims'))[:200]}; spec removed: "
        f"{not os.path.exists(spec)}")
    if gpu_time_slice(uuid) != 0:
        raise SystemExit(f"[demo] {uuid}'s time-slice stayed {gpu_time_slice(uuid)} after the unprepare")
    say("dra-gpu", f"after the unprepare {uuid}'s time-slice is back at 0 (Default)")


def gpu_time_slice(uuid):
    """The fake GPU's scheduler time-slice (0 Default ... 3 Long)."""
    out = subprocess.run(NVML_CTL + ["raw", json.dumps({"getGpuState": {"uuid": uuid}})],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["state"]["timeSlice"]


def dra_gpu_mig_demo(api):
    """Issue 28: a MIG-enabled GPU through DRA. GPU 6 (dra-gpu's) is split into two 1g.18gb MIG
    devices (the fake NVML re-reads its config: a MIG reconfiguration); the slice then offers
    gpu-6-mig-19-<start>-1, not gpu-6. A claim for one with a MigDeviceConfig is prepared (its CDI
    device: /dev/nvidia6 and the GPU and compute instance's /dev/nvidia-caps nodes) and
    unprepared; GPU 6 is then whole again."""
    driver = "gpu.nvidia.com"
    config_path = os.environ.get("FAKE_NVML_CONFIG", "")
    if not config_path.startswith(SANDBOX):
        say("dra-gpu MIG", f"skipped: FAKE_NVML_CONFIG ({config_path}) is not the sandbox copy run-local.sh makes")
        return
    with open(config_path) as f:
        original = f.read()
    config = json.loads(original)
    gpu = next(g for g in config["gpus"] if g.get("minor") == 6)
    gpu["migEnabled"] = True
    gpu["migDevices"] = [
        {"uuid": f"MIG-6a000000-000{i}-5000-8000-00000000000{i}", "gpuInstanceId": 9 + i, "gpuInstanceSliceCount": 1,
         "memorySizeMB": 18176, "multiprocessorCount": 16, "sharedCopyEngineCount": 1, "sharedDecoderCount": 1,
         "sharedJpegCount": 1, "gpuInstanceProfileId": 19, "placementStart": i, "placementSize": 1}
        for i in range(2)]

    def reconfigure(text):
        with open(config_path, "w") as f:
            f.write(text)
        subprocess.run(NVML_CTL + ["reload-config"], check=True, capture_output=True)

    slice_path = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{driver}"

    def devices():
        code, body = api.call("GET", slice_path)
        return {d["name"]: d for d in body["spec"].get("devices", [])} if code == 200 else {}

    reconfigure(json.dumps(config, indent=2))
    try:
        name = "gpu-6-mig-19-1-1"
        mig = wait_for(f"{name} in the gpu.nvidia.com slice", lambda: devices().get(name))
        say("dra-gpu MIG", f"GPU 6 in MIG mode -> slice devices {sorted(devices())}; {name}: "
            f"profile={mig['attributes']['profile']['string']} parentUUID={mig['attributes']['parentUUID']['string']} "
            f"capacity={ {k: v['value'] for k, v in mig['capacity'].items()} }")
        claims = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "mig-inference", "namespace": NS},
                 "spec": {"devices": {"requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}
        code, created = api.call("POST", claims, claim)
        if code != 201:
            raise SystemExit(f"[demo] creating the MIG ResourceClaim failed: {code} {created}")
        created["status"] = {"allocation": {"devices": {
            "results": [{"request": "mig", "driver": driver, "pool": NODE, "device": name}],
            "config": [{"source": "FromClaim", "requests": ["mig"], "opaque": {"driver": driver, "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing"}}}}]}}}
        code, allocated = api.call("PUT", claims + "/mig-inference/status", created)
        if code != 200:
            raise SystemExit(f"[demo] allocating the MIG ResourceClaim failed: {code} {allocated}")
        ref = json.dumps({"namespace": NS, "uid": created["metadata"]["uid"], "name": "mig-inference"})
        prepared = kubelet("prepare", driver, ref)
        say("dra-gpu MIG", f"NodePrepareResources (MigDeviceConfig, TimeSlicing) -> {json.dumps(prepared.get('claims'))[:300]}")
        spec = os.path.join(SANDBOX, "var/run/cdi", f"k8s.gpu.nvidia.com-claim_{created['metadata']['uid']}.json")
        with open(spec) as f:
            nodes = [n["path"] for d in json.load(f)["devices"] for n in d["containerEdits"]["deviceNodes"]]
        say("dra-gpu MIG", f"CDI spec {os.path.basename(spec)}: device nodes {nodes}")
        unprepared = kubelet("unprepare", driver, ref)
        say("dra-gpu MIG", f"NodeUnprepareResources -> {json.dumps(unprepared.get('claims'))[:200]}; spec removed: "
            f"{not os.path.exists(spec)}")
    finally:
        reconfigure(original)
    # NVML's MIG-change event brings the way back at once: gpu-inventory's event waiter, started
    # again when GPU 6's MIG mode changed, listens for it (or the read after its restart sees it).
    wait_for("gpu-6 whole again in the slice", lambda: "gpu-6" in devices())
    say("dra-gpu MIG", f"GPU 6 whole again -> slice devices {sorted(devices())}")


def dra_health_demo(api):
    """Issue 28 part 3: gpu-health's verdict on DRA's GPU becomes a DeviceTaint on its slice device
    and UNHEALTHY on the kubelet's KEP-4680 health stream; the reset ack clears both."""
    driver = "gpu.nvidia.com"
    slice_path = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{driver}"
    device = api.call("GET", slice_path)[1]["spec"]["devices"][0]
    name, uuid = device["name"], device["attributes"]["uuid"]["string"]
    pci = device["attributes"]["resource.kubernetes.io/pciBusID"]["string"].rsplit(".", 1)[0]

    def taints():
        code, body = api.call("GET", slice_path)
        found = [d for d in (body or {}).get("spec", {}).get("devices", []) if d["name"] == name] if code == 200 else []
        return found[0].get("taints", []) if found else []

    def stream_health():
        health = kubelet("state").get("dra_drivers", {}).get(driver, {}).get("health", {})
        return health.get("devices", {}).get(name, {}).get("seen")  # what the kubelet shows now

    wait_for(f"{name} HEALTHY on the kubelet's health stream", lambda: stream_health() == "HEALTHY")
    subprocess.run(JOURNAL_SIM + ["uuid", pci, uuid], check=True)
    subprocess.run(JOURNAL_SIM + ["xid", pci, "48", "DBE (double bit error) ECC error"], check=True)
    tainted = wait_for(f"a taint on {name} of the gpu.nvidia.com slice", taints)
    wait_for(f"{name} UNHEALTHY on the kubelet's health stream", lambda: stream_health() == "UNHEALTHY")
    say("dra health", f"Xid 48 on {uuid} -> slice device {name} taints {json.dumps(tainted)}; kubelet health "
        f"stream: {name} {stream_health()}")
    subprocess.run(JOURNAL_SIM + ["reset", uuid], check=True)
    wait_for(f"the taint on {name} removed", lambda: not taints())
    wait_for(f"{name} HEALTHY again on the kubelet's health stream", lambda: stream_health() == "HEALTHY")
    say("dra health", f"'GPU reset occurred' -> taint removed from {name} (upstream keeps it until a restart); "
        f"kubelet health stream: {name} {stream_health()}")


def gkm_demo(api):
    """gkm-agent: a GKMCache whose image (on the loopback registry) holds Triton kernels for
    sm_80 and sm_90 becomes Ready and Compatible on the 8 simulated H200s (sm_90)."""
    with open(os.path.join(SANDBOX, "registry", "image")) as f:
        image = f.read().strip()
    caches = "/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcaches"
    api.call("POST", caches, {"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                              "metadata": {"name": "triton-demo", "namespace": "ml-apps"},
                              "spec": {"image": image}})
    status_name = f"{len('triton-demo')}.triton-demo.{NODE}"  # <len(cache)>.<cache>.<node>
    node_path = f"/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcachenodes/{status_name}"

    def ready():
        code, obj = api.call("GET", node_path)
        entry = obj.get("status", {}).get("caches", {}).get("triton-demo", {}) if code == 200 else {}
        return entry if entry.get("state") in ("Ready", "Incompatible", "Failed") else None
    entry = wait_for(f"GKMCacheNode {status_name}", ready, timeout=60)
    ids = [i for s in entry.get("compatibleGPUs", []) for i in s.get("ids", [])]
    say("gkm", f"GKMCache ml-apps/triton-demo ({image}) -> {entry['state']}, "
        f"{'Compatible' if ids else 'Incompatible'} with GPUs {ids}, digest {entry.get('digest', '')[:19]}…, "
        f"{entry.get('volumeSize', 0)} bytes under var/lib/gkm/caches/namespaced/ml-apps/triton-demo")


def gkm_controller_demo(api):
    """gkm-controller (leader-elected): the GKMCache of gkm_demo gets the roll-up of its nodes'
    status objects in its own status: this node counted, Ready."""
    path = "/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcaches/triton-demo"

    def counted():
        code, obj = api.call("GET", path)
        status = obj.get("status", {}) if code == 200 else {}
        return status if status.get("totalNodes", 0) >= 1 else None
    status = wait_for("GKMCache ml-apps/triton-demo status counting the node", counted, timeout=30)
    condition = next((c for c in status.get("conditions", []) if c.get("type") == "Error"), {})
    say("gkm-controller", f"GKMCache ml-apps/triton-demo status: totalNodes {status.get('totalNodes')}, "
        f"readyNodes {status.get('readyNodes')}, failedNodes {status.get('failedNodes')}, "
        f"failedNodeConditions {json.dumps(status.get('failedNodeConditions', {}))}, "
        f"Error={condition.get('status')} ({condition.get('reason')})")


def slice_repair_demo(api):
    """Someone edits this node's compute-domain ResourceSlice (its devices emptied): the plugin,
    watching its slice, writes it back (an update at the next pool generation)."""
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={NODE},spec.driver={DRIVER}"})
    code, listed = api.call("GET", f"{slices}?{query}")
    items = listed.get("items", []) if code == 200 else []
    if not items:
        raise SystemExit(f"[demo] no ResourceSlice of {DRIVER} on {NODE}: {code} {listed}")
    name = items[0]["metadata"]["name"]
    devices = len(items[0]["spec"].get("devices", []))
    generation = items[0]["spec"]["pool"]["generation"]
    api.call("PATCH", f"{slices}/{name}", {"spec": {"devices": []}}, "application/merge-patch+json")

    def repaired():
        code, obj = api.call("GET", f"{slices}/{name}")
        spec = obj.get("spec", {}) if code == 200 else {}
        return spec if len(spec.get("devices", [])) == devices and spec["pool"]["generation"] > generation else None
    spec = wait_for(f"ResourceSlice {name} written back", repaired)
    say("dra", f"ResourceSlice {name} edited by hand (devices emptied) -> written back: {devices} device(s), "
        f"pool generation {generation} -> {spec['pool']['generation']}")


def gkm_cluster_demo(api):
    """gkm-agent and gkm-controller on a cluster-scoped cache: a ClusterGKMCache of the same image
    gets its ClusterGKMCacheNode (server-side apply of the object and of its status) and the
    roll-up in its own status."""
    with open(os.path.join(SANDBOX, "registry", "image")) as f:
        image = f.read().strip()
    api.call("POST", "/apis/gkm.io/v1alpha1/clustergkmcaches",
             {"apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache", "metadata": {"name": "triton-shared"},
              "spec": {"image": image}})
    status_name = f"{len('triton-shared')}.triton-shared.{NODE}"

    def ready():
        code, obj = api.call("GET", f"/apis/gkm.io/v1alpha1/clustergkmcachenodes/{status_name}")
        entry = obj.get("status", {}).get("caches", {}).get("triton-shared", {}) if code == 200 else {}
        return entry if entry.get("state") in ("Ready", "Incompatible", "Failed") else None
    entry = wait_for(f"ClusterGKMCacheNode {status_name}", ready, timeout=60)

    def counted():
        code, obj = api.call("GET", "/apis/gkm.io/v1alpha1/clustergkmcaches/triton-shared")
        status = obj.get("status", {}) if code == 200 else {}
        return status if status.get("totalNodes", 0) >= 1 else None
    status = wait_for("ClusterGKMCache triton-shared status counting the node", counted, timeout=30)
    say("gkm", f"ClusterGKMCache triton-shared -> {entry['state']} on this node; its status: totalNodes "
        f"{status.get('totalNodes')}, readyNodes {status.get('readyNodes')}")


def gkm_delete_demo(api):
    """kubectl delete of the caches: gkm-agent deletes this node's status objects with them (the
    extracted files stay while a pod uses them)."""
    gone = []
    for cache, node_object in (
            ("/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcaches/triton-demo",
             f"/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcachenodes/{len('triton-demo')}.triton-demo.{NODE}"),
            ("/apis/gkm.io/v1alpha1/clustergkmcaches/triton-shared",
             f"/apis/gkm.io/v1alpha1/clustergkmcachenodes/{len('triton-shared')}.triton-shared.{NODE}")):
        api.call("DELETE", cache)
        wait_for(f"{node_object} deleted", lambda: api.call("GET", node_object)[0] == 404)
        gone.append(node_object.rsplit("/", 1)[1])
    say("gkm", f"caches deleted -> this node's status objects {gone} deleted with them")


def gkm_csi_demo(api):
    """gkm-csi through the kubelet simulator, the way a kubelet mounts a pod's inline CSI volume:
    the plugin registered itself through plugins_registry (type CSIPlugin; the simulator called
    NodeGetInfo, as the kubelet's CSI handler does), and `kubeletctl csi-publish` makes the
    kubelet's NodePublishVolume for a pod whose volume names the Ready cache of gkm_demo (driver
    csi.gkm.io, volumeAttributes cacheName/cacheNamespace, the pod's keys of podInfoOnMount). The
    supervisor runs in a mount namespace of its own (run-local.sh), so the mount is looked at
    through /proc/<pid>/root."""
    def registered():
        return kubelet("state").get("csi_drivers", {}).get("csi.gkm.io")
    driver = wait_for("csi.gkm.io registered with the kubelet (plugin watcher)", registered)
    uid = "5f1d7c1e-0c6e-4d4e-9d7a-6b0c1a2b3c4d"
    attributes = json.dumps({"cacheName": "triton-demo", "cacheNamespace": "ml-apps"}, separators=(",", ":"))
    published = kubelet("csi-publish", "csi.gkm.io", "ml-apps/example-pod", uid, "kernel-cache", attributes)
    target = published.get("target_path", "")
    if not published.get("ok"):
        why = published.get("error", published)
        if "Operation not permitted" in str(why):
            why = f"{why} (mount(2) needs root: run `make run` as root to see the mount)"
        say("gkm-csi", f"kubelet -> csi.gkm.io (node id {driver.get('node_id')}): NodePublishVolume "
            f"ml-apps/triton-demo -> {published.get('code')}: {why}")
        return
    pid = os.environ.get("GNS_SUPERVISOR_PID", "")
    view = f"/proc/{pid}/root{target}" if pid else target
    files = sum(len(f) for _, _, f in os.walk(view))
    try:
        with open(os.path.join(view, "written-by-pod"), "w") as f:
            f.write("x")
        write = "a write went through (NOT read-only)"
    except OSError as e:
        write = f"a write fails: {os.strerror(e.errno)}"
    options = ""
    with open(f"/proc/{pid}/mountinfo" if pid else "/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[4] == target:
                options = fields[5]
    usage_file = os.path.join(SANDBOX, "run/gkm/usage/namespaced/ml-apps/triton-demo/usage.json")
    with open(usage_file) as f:
        usage = json.load(f)
    status_name = f"{len('triton-demo')}.triton-demo.{NODE}"
    node_path = f"/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcachenodes/{status_name}"

    def pods():
        code, obj = api.call("GET", node_path)
        listed = obj.get("status", {}).get("caches", {}).get("triton-demo", {}).get("pods", []) if code == 200 else []
        return listed or None
    listed = wait_for("the GKMCacheNode listing the pod", pods, timeout=30)
    say("gkm-csi", f"kubelet -> csi.gkm.io (registered, node id {driver.get('node_id')}): NodePublishVolume "
        f"ml-apps/triton-demo for pod ml-apps/example-pod -> OK: bind-mounted at pods/{uid[:8]}…/volumes/"
        f"kubernetes.io~csi/kernel-cache/mount ({options}), {files} cache files visible, {write}; "
        f"usage.json: {sorted(usage)}; GKMCacheNode pods: {[p.get('podName') for p in listed]}")
    # The cache's status counts this node while the pod has its volume (gkm-controller's roll-up).
    code, cache = api.call("GET", "/apis/gkm.io/v1alpha1/namespaces/ml-apps/gkmcaches/triton-demo")
    status = cache.get("status", {}) if code == 200 else {}
    if status.get("totalNodes") is not None:
        say("gkm-csi", f"GKMCache ml-apps/triton-demo status while mounted: totalNodes {status.get('totalNodes')}, "
            f"readyNodes {status.get('readyNodes')}")
    unpublished = kubelet("csi-unpublish", uid, "kernel-cache")
    with open(usage_file) as f:
        left = json.load(f)
    say("gkm-csi", f"kubelet NodeUnpublishVolume -> {'OK' if unpublished.get('ok') else unpublished}: "
        f"target gone: {not os.path.exists(view)}, usage.json now {left}")


def health_checks_demo():
    """Issue 26: the polled checks (config/local.yaml: a pass every 5 s, clear after 2 clean
    passes). Two faults injected into the fake NVML turn a GPU Unhealthy at the kubelet, and the
    GPU comes back once they clear; an NVSwitch's fatal SXid in the kernel log is reported node-level
    on a port wired to no GPU of ours, and makes GPU 5 Unhealthy on the port its link 3 ends in
    (until `set-healthy`)."""
    gpu = "GPU-3f8a1c52-7e04-4b9d-9c1e-5a7d2e8f6b14"
    for fault, check in (({"nvlinkDown": [0]}, "NvLinkDown"), ({"pcieWidth": 8}, "PcieLinkDegraded")):
        subprocess.run(NVML_CTL + ["set-health", gpu, json.dumps(fault)], check=True, capture_output=True)
        wait_for(f"{gpu} Unhealthy for {check}", lambda: device_health(gpu) == "Unhealthy", timeout=60)
        verdict = json.loads(http_get("/debug/state")[1]).get("gpu-health.state", {}).get("devices", {}).get(gpu, {})
        say("gpu health checks", f"fake NVML {json.dumps(fault)} -> {gpu} Unhealthy at the kubelet "
            f"({verdict.get('reason', check)}; {verdict.get('recommendedAction')})")
        subprocess.run(NVML_CTL + ["clear-health"], check=True, capture_output=True)
        wait_for(f"{gpu} Healthy again", lambda: device_health(gpu) == "Healthy", timeout=60)
        say("gpu health checks", f"fault cleared -> {gpu} Healthy again after the clean passes")
    before = metric('gpu_node_supervisor_sxid_errors_total{sxid="20034",severity="fatal",mapped="false"}')
    subprocess.run(JOURNAL_SIM + ["kernel", "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 30 "
                                  "LTSSM Fault Up"], check=True)
    wait_for("the fatal SXid counted", lambda: metric(
        'gpu_node_supervisor_sxid_errors_total{sxid="20034",severity="fatal",mapped="false"}') > before)
    say("gpu health", "kernel log 'nvidia-nvswitch0: SXid …: 20034, Fatal, Link 30' on a port wired to no GPU "
        "of ours -> counted and reported node-level (HealthEvent SysLogsSXIDError, CONTACT_SUPPORT, Node Event "
        "NvSwitchSxidFatal)")
    # GPU 5's links 2 and 3 end in ports 20 and 21 of that switch (gpus-local.json nvswitchLinks,
    # read by gpu-inventory at its NVML open): an SXid on port 21 is that GPU's.
    wired = "GPU-3f8a1c52-7e05-4b9d-9c1e-5a7d2e8f6b15"
    subprocess.run(JOURNAL_SIM + ["kernel", "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20034, Fatal, Link 21 "
                                  "LTSSM Fault Up"], check=True)
    wait_for(f"{wired} Unhealthy for the SXid on its port", lambda: device_health(wired) == "Unhealthy", timeout=60)
    verdict = json.loads(http_get("/debug/state")[1]).get("gpu-health.state", {}).get("devices", {}).get(wired, {})
    say("gpu health", f"'SXid …: 20034, Fatal, Link 21' on the port GPU 5's link 3 ends in -> {wired[:12]}… "
        f"Unhealthy at the kubelet ({verdict.get('reason')}; sxid {verdict.get('sxid')}, "
        f"{verdict.get('recommendedAction')})")
    binary = os.path.join(os.environ.get("GNS_BUILD_DIR", "build/release"), "src/gpu-node-supervisor")
    answer = subprocess.run([binary, "set-healthy", "--gpu", wired, "--state-dir",
                             os.path.join(SANDBOX, "var/lib/gpu-node-supervisor")], capture_output=True, text=True)
    wait_for(f"{wired} Healthy after set-healthy", lambda: device_health(wired) == "Healthy", timeout=30)
    say("gpu health", f"`gpu-node-supervisor set-healthy --gpu {wired[:12]}…` ({answer.stdout.strip()}) -> Healthy "
        f"again: no clearing XID releases an SXid's verdict; a validated reset, a new boot or the operator does")

    def event_passes():
        return metric("gpu_node_supervisor_gpu_health_check_event_passes_total")

    before = event_passes()
    subprocess.run(NVML_CTL + ["inject-event", gpu, "clock", "--data", "8"], check=True, capture_output=True)
    wait_for("a pass for the NVML clock event", lambda: event_passes() > before, timeout=30)
    say("gpu health checks", f"NVML clock event on {gpu} -> its thermal checks read and judged at once "
        f"(event passes {before:.0f} -> {event_passes():.0f}), not at the next poll")


def nvsentinel_export_demo():
    """Issue 27 §1: the demo's XID 48 reached NVSentinel's platform connector (the simulator
    run-local.sh starts records every HealthEvent it takes)."""
    record = os.path.join(SANDBOX, "nvsentinel", "received.jsonl")

    def events():
        try:
            with open(record) as f:
                return [json.loads(line)["event"] for line in f if line.strip()]
        except (OSError, ValueError, KeyError):
            return []

    def xid48():
        return [e for e in events() if e.get("checkName") == "SysLogsXIDError" and "48" in e.get("errorCode", [])
                and any(x.get("entityValue") == GPU_PCI for x in e.get("entitiesImpacted", []))]

    found = wait_for("the Xid 48 HealthEvent at the platform-connector simulator", xid48, timeout=60)[0]
    all_events = events()
    say("nvsentinel export", f"Xid 48 -> HealthEventOccurredV1: {found.get('recommendedAction')}, "
        f"isFatal={found.get('isFatal', False)}, id {found.get('id')}; the simulator took {len(all_events)} events "
        f"({len({e.get('id') for e in all_events})} distinct ids), queued now "
        f"{metric('gpu_node_supervisor_nvsentinel_export_queued'):.0f}")


def gpu_metrics_demo(device):
    """Issue 27: per-pod GPU series under dcgm-exporter's names on /metrics (metrics.gpuMetrics;
    config/local.yaml reads every 2 s). A pod admitted with the GPU gets DCGM_FI_DEV_GPU_UTIL with
    its pod labels; when its containers end, its series go at the pod-map change."""
    gpu = device.split("::")[0]
    subprocess.run(NVML_CTL + ["set-health", gpu, json.dumps({"gpuUtil": 87, "powerMilliwatts": 312456})],
                   check=True, capture_output=True)

    def series():
        return [line for line in http_get("/metrics")[1].splitlines()
                if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'UUID="{gpu}"' in line]

    api = Api()
    pod_on(api, "ml", "dash-0", device)
    line = wait_for("DCGM_FI_DEV_GPU_UTIL with the pod's labels", lambda: next(
        (s for s in series() if 'pod="dash-0"' in s and s.endswith(" 87")), None), timeout=60)
    say("gpu metrics", f"pod ml/dash-0 on {gpu[:12]}… -> /metrics {line}")
    kubelet("forget-pod", "ml/dash-0")
    api.call("PATCH", "/api/v1/namespaces/ml/pods/dash-0/status", {"status": {"phase": "Succeeded"}},
             "application/merge-patch+json")
    line = wait_for("the pod's GPU series gone", lambda: (lambda s: s[0] if s and not any(
        'pod="dash-0"' in x for x in s) else None)(series()), timeout=60)
    say("gpu metrics", f"its containers ended -> its series gone; the GPU's own: {line}")
    subprocess.run(NVML_CTL + ["clear-health"], check=True, capture_output=True)


def gpu_metrics_dra_demo(api):
    """Issue 27: a GPU held through a DRA claim (gpu.nvidia.com, device gpu-<minor>) gets the pod's
    labels and the claim's on its DCGM_FI_* series; unprepared, the series go."""
    driver, pod = "gpu.nvidia.com", "dash-dra"
    slice_path = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-{driver}"
    device = api.call("GET", slice_path)[1]["spec"]["devices"][0]
    gpu = device["attributes"]["uuid"]["string"]
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    code, claim = api.call("POST", claims, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"{pod}-gpu", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": driver}}]}}})
    if code != 201:
        raise SystemExit(f"[demo] creating the GPU ResourceClaim failed: {code} {claim}")
    claim["status"] = {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": driver, "pool": NODE, "device": device["name"]}]}}}
    if api.call("PUT", f"{claims}/{pod}-gpu/status", claim)[0] != 200:
        raise SystemExit("[demo] allocating the GPU ResourceClaim failed")
    ref = json.dumps({"namespace": NS, "uid": claim["metadata"]["uid"], "name": f"{pod}-gpu"})
    kubelet("prepare", f"--pod={NS}/{pod}", "--container=main", driver, ref)

    def series():
        return [line for line in http_get("/metrics")[1].splitlines()
                if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'UUID="{gpu}"' in line]

    line = wait_for("the DRA-claimed GPU's series with the pod's labels", lambda: next(
        (s for s in series() if f'pod="{pod}"' in s and f'dra_device_name="{device["name"]}"' in s), None), timeout=60)
    say("gpu metrics", f"claim {NS}/{pod}-gpu ({device['name']}) prepared for pod {pod} -> /metrics {line}")
    kubelet("unprepare", driver, ref)
    wait_for("the claim's series gone", lambda: series() and not any(f'pod="{pod}"' in s for s in series()), timeout=60)
    say("gpu metrics", f"claim unprepared -> its series gone; the GPU's own: {series()[0]}")


def main():
    wait_for("the supervisor's /readyz", lambda: http_get("/readyz")[0] == 200, timeout=60)
    status, body = http_get("/debug/state")
    plugin = json.loads(body).get("device-plugin.state", {})
    healthy = sum(1 for d in plugin.get("devices", {}).values() if d.get("health") == "Healthy")
    say("device plugin", f"{len(plugin.get('devices', {}))} devices (GPUs and MIG devices) advertised to the "
        f"kubelet, {healthy} Healthy, registered={plugin.get('registered')}")
    sharing_step(plugin)

    # run-local.sh wrote an Xid 79 for this GPU before the supervisor started.
    wait_for(f"{EARLY_UUID} Unhealthy (its Xid was in the journal before start)",
             lambda: device_health(EARLY_UUID) == "Unhealthy")
    say("gpu health", f"Xid 79 written before the supervisor started -> {EARLY_UUID} Unhealthy at the kubelet")
    subprocess.run(JOURNAL_SIM + ["reset", EARLY_UUID], check=True)
    wait_for(f"{EARLY_UUID} Healthy again", lambda: device_health(EARLY_UUID) == "Healthy")

    pod_resources_step(sorted(d for d in plugin.get("devices", {})
                              if d.startswith("GPU-") and d not in (GPU_UUID, EARLY_UUID))[0])

    api = Api()
    pod_on(api, "ml", "infer-0", GPU_UUID)  # a workload on the GPU that is about to fail
    subprocess.run(JOURNAL_SIM + ["uuid", GPU_PCI, GPU_UUID], check=True)
    subprocess.run(JOURNAL_SIM + ["xid", GPU_PCI, "48", "DBE (double bit error) ECC error"], check=True)
    wait_for(f"{GPU_UUID} Unhealthy at the kubelet", lambda: device_health(GPU_UUID) == "Unhealthy")
    say("gpu health", f"kernel log 'NVRM: Xid (PCI:{GPU_PCI}): 48' -> {GPU_UUID} Unhealthy at the kubelet")
    gpu_reset_demo(api)

    # XID 154: the driver says what the GPU needs now.
    subprocess.run(JOURNAL_SIM + ["kernel", f"NVRM: Xid (PCI:{GPU_PCI}): 154, GPU recovery action changed from "
                                  "0x0 (None) to 0x4 (Drain and Reset)"], check=True)
    wait_for(f"{GPU_UUID} Unhealthy after Xid 154", lambda: device_health(GPU_UUID) == "Unhealthy")
    verdict = json.loads(http_get("/debug/state")[1]).get("gpu-health.state", {}).get("devices", {}).get(GPU_UUID, {})
    say("gpu health", f"Xid 154 'to 0x4 (Drain and Reset)' -> Unhealthy, {verdict.get('recommendedAction')}")
    subprocess.run(JOURNAL_SIM + ["reset", GPU_UUID], check=True)
    wait_for(f"{GPU_UUID} Healthy again", lambda: device_health(GPU_UUID) == "Healthy")

    # One Xid 13 occurrence, seen by the kernel log and by NVML's event: counted once.
    xid13 = f'gpu_node_supervisor_xid_errors_total{{gpu="{GPU_UUID}",xid="13"}}'
    folded = "gpu_node_supervisor_gpu_health_xid_duplicates_total"
    before = metric(xid13), metric(folded)
    subprocess.run(JOURNAL_SIM + ["xid", GPU_PCI, "13", "Graphics Exception"], check=True)
    subprocess.run(NVML_CTL + ["inject-xid", GPU_UUID, "13"], check=True, capture_output=True)
    wait_for("both Xid 13 reports handled", lambda: metric(folded) > before[1] and metric(xid13) > before[0])
    say("gpu health", f"Xid 13 from the kernel log and from NVML -> occurrences +{metric(xid13) - before[0]:.0f}, "
        f"folded duplicates +{metric(folded) - before[1]:.0f}; {GPU_UUID} still {device_health(GPU_UUID)}")
    # XID policy (issue 26): 163 is the resolution of 162 (the catalog's `clears`).
    subprocess.run(JOURNAL_SIM + ["xid", GPU_PCI, "162", "demo"], check=True)
    wait_for(f"{GPU_UUID} Unhealthy after Xid 162", lambda: device_health(GPU_UUID) == "Unhealthy")
    subprocess.run(JOURNAL_SIM + ["xid", GPU_PCI, "163", "demo"], check=True)
    wait_for(f"{GPU_UUID} Healthy after Xid 163", lambda: device_health(GPU_UUID) == "Healthy")
    say("gpu health", f"Xid 162 -> {GPU_UUID} Unhealthy at the kubelet; Xid 163 clears it -> Healthy")
    health_checks_demo()
    host_service_demo()
    gpu_metrics_demo(sorted(d for d in plugin.get("devices", {})
                            if d.startswith("GPU-") and d not in (GPU_UUID, EARLY_UUID))[1])

    api = Api()
    domains = f"/apis/resource.nvidia.com/v1beta1/namespaces/{NS}/computedomains"
    domain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
              "metadata": {"name": "train-a", "namespace": NS},
              "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "train-a-channel"},
                                                   "allocationMode": "Single"}}}
    code, created = api.call("POST", domains, domain)
    if code != 201:
        raise SystemExit(f"[demo] creating the ComputeDomain failed: {code} {created}")
    domain_uid = created["metadata"]["uid"]
    ready = wait_for("ComputeDomain Ready", lambda: (lambda r: r[1] if r[0] == 200 and (r[1].get("status") or {})
                                                     .get("status") == "Ready" else None)(api.call("GET", domains + "/train-a")))
    template_path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates/train-a-channel"
    code, template = api.call("GET", template_path)
    say("controller", f"ComputeDomain {NS}/train-a is {ready['status']['status']} with finalizers "
        f"{ready['metadata'].get('finalizers')}; workload template {NS}/train-a-channel exists: {code == 200}")
    # kubectl delete resourceclaimtemplate: the controller's template watch sees it, lets it go
    # (its finalizer) and makes it again.
    first_uid = template["metadata"]["uid"]
    api.call("DELETE", template_path)
    recreated = wait_for("the deleted workload template recreated", lambda: (
        lambda r: r[1] if r[0] == 200 and r[1]["metadata"]["uid"] != first_uid
        and "deletionTimestamp" not in r[1]["metadata"] else None)(api.call("GET", template_path)))
    say("controller", f"workload template deleted by hand -> recreated (uid {first_uid[:8]}… -> "
        f"{recreated['metadata']['uid'][:8]}…)")

    claims = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
              "domainID": domain_uid, "allocationMode": "Single"}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "train-a-pod-0-channel", "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
                 "deviceClassName": "compute-domain-default-channel.nvidia.com"}}]}}}
    code, created_claim = api.call("POST", claims, claim)
    if code != 201:
        raise SystemExit(f"[demo] creating the ResourceClaim failed: {code} {created_claim}")
    created_claim["status"] = {"allocation": {"devices": {
        "results": [{"request": "channel", "driver": DRIVER, "pool": NODE, "device": "channel-0"}],
        "config": [{"source": "FromClaim", "requests": ["channel"],
                    "opaque": {"driver": DRIVER, "parameters": params}}]}}}
    code, allocated = api.call("PUT", claims + "/train-a-pod-0-channel/status", created_claim)
    if code != 200:
        raise SystemExit(f"[demo] allocating the ResourceClaim failed: {code} {allocated}")
    claim_ref = json.dumps({"namespace": NS, "uid": created_claim["metadata"]["uid"], "name": "train-a-pod-0-channel"})
    wait_for("the DRA plugin registered with the kubelet",
             lambda: kubelet("state").get("dra_drivers", {}).get(DRIVER, {}).get("registered"))
    prepared = kubelet("prepare", DRIVER, claim_ref)
    say("dra", f"NodePrepareResources via {prepared.get('service')} -> {json.dumps(prepared.get('claims'))[:400]}")
    specs = sorted(os.listdir(os.path.join(SANDBOX, "var/run/cdi")))
    say("dra", f"CDI specs on the node: {specs}")
    joined = peer_joins(api)
    unprepared = kubelet("unprepare", DRIVER, claim_ref)
    say("dra", f"NodeUnprepareResources -> {json.dumps(unprepared.get('claims'))[:300]}; "
        f"CDI specs now: {sorted(os.listdir(os.path.join(SANDBOX, 'var/run/cdi')))}")
    if joined:
        restart_after_unprepare(api)

    api.call("DELETE", domains + "/train-a")
    wait_for("ComputeDomain gone", lambda: api.call("GET", domains + "/train-a")[0] == 404)
    say("controller", f"ComputeDomain deleted; workload template still there: {api.call('GET', template_path)[0] == 200}")
    slice_repair_demo(api)
    imex_demo(api)
    dra_gpu_demo(api)
    gpu_metrics_dra_demo(api)
    dra_health_demo(api)
    gkm_demo(api)
    gkm_csi_demo(api)
    gkm_controller_demo(api)
    gkm_cluster_demo(api)
    nvsentinel_export_demo()
    dra_gpu_mig_demo(api)
    gkm_delete_demo(api)
    say("done", f"supervisor still serving; try: curl -s http://{METRICS}/debug/state")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The driver-managed IMEX part of `make run` (HostManagedIMEX off, issue #16), after demo.py.

A second simulated cluster of its own (the host-managed node of demo.py stays as it is): one
API-server simulator and three nodes on their own loopback addresses, each with its own kubelet
simulator, sandbox, fake NVML (one fabric-attached GPU) and supervisor. dm-node-a and dm-node-b
are in clique 1, dm-node-c in clique 2. The supervisors run tools/sim/imex's fake nvidia-imex
and nvidia-imex-ctl as each domain's daemon. What it shows, as an operator would see it:

  1. a ComputeDomain of two nodes: no DaemonSet; the first prepare waits for the second node;
     both prepares succeed, the domain is Ready with both nodes (name, IP, clique, index) in
     status.nodes, each node labelled, each running the domain's nvidia-imex as a child;
  2. the node of the other clique is registered but refused, the error naming both cliques;
  3. a daemon that crashes is restarted by its supervisor;
  4. unprepare stops the daemons, the nodes deregister and lose the label; the domain is deleted.

Needs GNS_BUILD_DIR (the build tree) and GNS_SANDBOX. Standard library only.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo  # noqa: E402  (say, wait_for, Api: the same walk-through helpers)

REPO = demo.REPO
BUILD = os.path.abspath(os.environ.get("GNS_BUILD_DIR", "build/release"))
ROOT = os.path.join(os.environ["GNS_SANDBOX"], "driver-managed")
NS = "team-b"
DRIVER = "compute-domain.nvidia.com"
CLUSTER = "7d1e0c4b-2a3f-4b5c-8d6e-0f1a2b3c4d5e"
DOMAINS = f"/apis/resource.nvidia.com/v1beta1/namespaces/{NS}/computedomains"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"
STEP = "driver-managed"

procs = []


def say(text):
    demo.say(STEP, text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, log, env=None):
    out = open(log, "w")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    procs.append(proc)
    return proc


def stop_all():
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


class Node:
    def __init__(self, name, ip, clique, api_dir, server_port, cmd_port):
        self.name, self.ip, self.clique = name, ip, clique
        self.dir = os.path.join(ROOT, name)
        os.makedirs(os.path.join(self.dir, "host/proc"))
        os.makedirs(os.path.join(self.dir, "kubelet/plugins_registry"))
        with open(os.path.join(self.dir, "host/proc/devices"), "w") as f:
            f.write("Character devices:\n509 nvidia-caps-imex-channels\n\nBlock devices:\n")
        with open(os.path.join(REPO, "tools/sim/fake_nvml/gpus-8.json")) as f:
            gpus = json.load(f)
        gpu = gpus["gpus"][0]
        gpu["nvlinkPeers"] = []
        gpu["fabric"]["clusterUuid"] = CLUSTER
        gpu["fabric"]["cliqueId"] = clique
        gpus["gpus"] = [gpu]
        self.nvml = os.path.join(self.dir, "gpus.json")
        with open(self.nvml, "w") as f:
            json.dump(gpus, f)
        self.config = os.path.join(self.dir, "site.yaml")
        with open(self.config, "w") as f:
            f.write(f"""version: v1
nodeName: {name}
paths: {{kubeletDir: {self.dir}/kubelet, cdiDir: {self.dir}/cdi, stateDir: {self.dir}/state, hostRoot: {self.dir}/host}}
featureGates: {{HostManagedIMEX: false}}
logging: {{format: text, level: info}}
modules:
  kube: {{enabled: true, kubeconfig: {api_dir}/kubeconfig}}
  gpu-inventory: {{enabled: true, nvmlLibrary: {BUILD}/tools/sim/fake_nvml/libnvidia-ml.so.1}}
  dra-compute-domain:
    enabled: true
    driverManaged:
      imexDaemonPath: {REPO}/tools/sim/imex/nvidia-imex
      imexCtlPath: {REPO}/tools/sim/imex/nvidia-imex-ctl
      serverPort: {server_port}
      cmdPort: {cmd_port}
      readyWait: 2s
      readyProbeInterval: 100ms
      restartInitial: 200ms
      restartMax: 2s
  compute-domain-controller:
    enabled: true
    # One identity per supervisor (the DaemonSet's POD_NAME): all three run on this one host.
    leaderElection: {{namespace: kube-system, identity: {name}, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms}}
""")
        self.ctl = os.path.join(self.dir, "kubelet.ctl")
        self.log = os.path.join(self.dir, "supervisor.log")

    def launch(self):
        start([os.path.join(BUILD, "tools/sim/kubelet/gns-sim-kubelet"), "--kubelet-dir",
               os.path.join(self.dir, "kubelet"), "--control-socket", self.ctl], os.path.join(self.dir, "kubelet.log"))
        self.proc = start([os.path.join(BUILD, "src/gpu-node-supervisor"), "run", "--config", self.config], self.log,
                          dict(os.environ, FAKE_NVML_CONFIG=self.nvml))

    def kubelet(self, *args):
        out = subprocess.run([sys.executable, os.path.join(REPO, "tools/sim/kubelet/kubeletctl.py"),
                              "--socket", self.ctl] + list(args), capture_output=True, text=True)
        return json.loads(out.stdout) if out.stdout.strip() else {}

    def prepare(self, claim):
        reply = self.kubelet("prepare", DRIVER, json.dumps(claim))
        if not reply.get("ok"):
            return reply.get("error") or "no answer"
        return (reply.get("claims") or {}).get(claim["uid"], {}).get("error", "<no entry>")

    def unprepare(self, claim):
        return self.kubelet("unprepare", DRIVER, json.dumps(claim))

    def daemons(self):
        """The nvidia-imex children of this node's supervisor (pid, config path)."""
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a for a in f.read().decode(errors="replace").split("\0") if a]
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == self.proc.pid and any(a.endswith("tools/sim/imex/nvidia-imex") for a in argv):
                found.append((int(pid), argv[argv.index("-c") + 1] if "-c" in argv[:-1] else ""))
        return found

    def logged(self, text):
        with open(self.log, errors="replace") as f:
            return text in f.read()


def main():
    os.makedirs(ROOT, exist_ok=True)
    api_dir = os.path.join(ROOT, "api")
    os.makedirs(api_dir)
    start([os.path.join(BUILD, "tools/sim/apiserver/gns-sim-apiserver"), "--listen", "127.0.0.1:0", "--state-dir",
           api_dir, "--seed", os.path.join(REPO, "deploy/crd-computedomains.yaml"),
           "--seed", os.path.join(REPO, "deploy/crd-computedomaincliques.yaml")], os.path.join(ROOT, "api.log"))
    demo.wait_for("the second API-server simulator", lambda: os.path.exists(os.path.join(api_dir, "kubeconfig"))
                  and os.path.getsize(os.path.join(api_dir, "kubeconfig")) > 0)
    demo.API_DIR = api_dir  # demo.Api reads the simulator's kubeconfig, CA and token from there
    api = demo.Api()

    server_port, cmd_port = free_port(), free_port()
    net = 150 + os.getpid() % 50
    nodes = [Node("dm-node-a", f"127.0.{net}.1", 1, api_dir, server_port, cmd_port),
             Node("dm-node-b", f"127.0.{net}.2", 1, api_dir, server_port, cmd_port),
             Node("dm-node-c", f"127.0.{net}.3", 2, api_dir, server_port, cmd_port)]
    for n in nodes:
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name},
                "status": {"addresses": [{"type": "InternalIP", "address": n.ip}]}}
        api.call("POST", "/api/v1/nodes", node)
        # Addresses are status: a create drops them (as the API server does); the kubelet reports them.
        api.call("PATCH", f"/api/v1/nodes/{n.name}/status", {"status": node["status"]}, "application/merge-patch+json")
        n.launch()
    for n in nodes:
        demo.wait_for(f"{n.name}'s DRA plugin registered with its kubelet",
                      lambda n=n: n.kubelet("state").get("dra_drivers", {}).get(DRIVER, {}).get("registered"), 60)
    say(f"three supervisors with HostManagedIMEX=false: {', '.join(f'{n.name} ({n.ip}, clique {n.clique})' for n in nodes)}")

    domain = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
              "metadata": {"name": "train-b", "namespace": NS},
              "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "train-b-channel"},
                                                   "allocationMode": "Single"}}}
    code, created = api.call("POST", DOMAINS, domain)
    if code != 201:
        raise SystemExit(f"[demo] creating the ComputeDomain failed: {code} {created}")
    uid = created["metadata"]["uid"]
    demo.wait_for("the workload template", lambda: api.call(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates/train-b-channel")[0] == 200)
    daemonsets = (api.call("GET", "/apis/apps/v1/daemonsets")[1] or {}).get("items", [])
    say(f"ComputeDomain {NS}/train-b (numNodes 2): workload template made, DaemonSets in the cluster: {len(daemonsets)}")

    claims = {}
    for n in nodes:
        name = f"pod-{n.name[-1]}-channel"
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": name, "namespace": NS},
                 "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
                     "deviceClassName": "compute-domain-default-channel.nvidia.com"}}]}}}
        code, made = api.call("POST", CLAIMS, claim)
        if code != 201:
            raise SystemExit(f"[demo] creating the ResourceClaim failed: {code} {made}")
        made["status"] = {"allocation": {"devices": {
            "results": [{"request": "channel", "driver": DRIVER, "pool": n.name, "device": "channel-0"}],
            "config": [{"source": "FromClaim", "requests": ["channel"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
                "domainID": uid, "allocationMode": "Single"}}}]}}}
        code, _ = api.call("PUT", f"{CLAIMS}/{name}/status", made)
        if code != 200:
            raise SystemExit(f"[demo] allocating the ResourceClaim failed: {code}")
        claims[n.name] = {"namespace": NS, "uid": made["metadata"]["uid"], "name": name}
    a, b, c = nodes

    first = a.prepare(claims[a.name])
    say(f"{a.name} prepares first -> retryable error: {first[:160]}")

    def prepared(n):
        error = n.prepare(claims[n.name])
        return error == "" or None
    started = time.monotonic()
    demo.wait_for(f"{b.name}'s prepare", lambda: prepared(b), 90, 0.3)
    demo.wait_for(f"{a.name}'s prepare", lambda: prepared(a), 90, 0.3)
    code, d = api.call("GET", f"{DOMAINS}/train-b")
    entries = [(e.get("name"), e.get("ipAddress"), e.get("cliqueID"), e.get("index"), e.get("status"))
               for e in (d.get("status") or {}).get("nodes", [])]
    say(f"{b.name} prepares -> both prepares succeed within {time.monotonic() - started:.1f}s; "
        f"status.status={d['status'].get('status')}; status.nodes={entries}")
    for n in (a, b):
        label = ((api.call("GET", f"/api/v1/nodes/{n.name}")[1] or {}).get("metadata", {}).get("labels", {})
                 .get("resource.nvidia.com/computeDomain"))
        say(f"{n.name}: label resource.nvidia.com/computeDomain={label}; nvidia-imex children {n.daemons()}")

    def refused():
        error = c.prepare(claims[c.name])
        return error if "clique" in error else None
    say(f"{c.name} (clique 2) prepares -> permanent error: {demo.wait_for(f'{c.name} refused', refused, 60, 0.3)[:220]}")
    c.unprepare(claims[c.name])

    before = a.daemons()
    subprocess.run([os.path.join(REPO, "tools/sim/imex/nvidia-imex-ctl"), "--crash", "-c", before[0][1]],
                   capture_output=True)
    demo.wait_for(f"{a.name}'s daemon restarted", lambda: a.logged("exited with status 134; restarting in")
                  and a.daemons() and a.daemons()[0][0] != before[0][0], 30)
    demo.wait_for("the domain Ready again", lambda: (api.call("GET", f"{DOMAINS}/train-b")[1].get("status") or {})
                  .get("status") == "Ready", 30)
    say(f"{a.name}'s nvidia-imex crashed (pid {before[0][0]}, status 134) -> restarted by its supervisor "
        f"(pid {a.daemons()[0][0]}); domain Ready again")

    for n in (a, b):
        n.unprepare(claims[n.name])
    demo.wait_for("both nodes deregistered", lambda: not (api.call("GET", f"{DOMAINS}/train-b")[1].get("status") or {})
                  .get("nodes"), 30)
    labels = [((api.call("GET", f"/api/v1/nodes/{n.name}")[1] or {}).get("metadata", {}).get("labels", {})
               .get("resource.nvidia.com/computeDomain")) for n in (a, b)]
    say(f"both claims unprepared -> daemons stopped ({a.daemons() + b.daemons()} left), status.nodes empty, "
        f"labels {labels}")
    api.call("DELETE", f"{DOMAINS}/train-b")
    demo.wait_for("ComputeDomain gone", lambda: api.call("GET", f"{DOMAINS}/train-b")[0] == 404, 30)
    say("ComputeDomain deleted (finalizer released once no node was registered)")


if __name__ == "__main__":
    try:
        main()
    except SystemExit as e:
        print(e, flush=True)
        for n in os.listdir(ROOT) if os.path.isdir(ROOT) else []:
            log = os.path.join(ROOT, n, "supervisor.log")
            if os.path.exists(log):
                print(f"[demo] last lines of {log}:", flush=True)
                with open(log, errors="replace") as f:
                    print("".join(f.readlines()[-15:]), flush=True)
        raise
    finally:
        stop_all()

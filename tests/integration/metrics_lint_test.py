#!/usr/bin/env python3
"""ctest integration_metrics_lint (issue 29 item 2): `promtool check metrics` on a scrape of the
real binary with every module on.

The simulated node of `make run` (tools/sim/run-local.sh, config/local.yaml: every module
enabled, gkm-agent, nvsentinel-export and metrics.gpuMetrics included) is started in a temporary
sandbox, tools/sim/demo.py walks it through every module (so the families that exist only after
an event, an Xid, a reset, a prepared claim, a GPU pod, are there too), then /metrics is scraped
and linted. The test fails on any promtool complaint except those about dcgm-exporter's foreign
families (DCGM_FI_*: their names are dcgm-exporter's on purpose, src/modules/metrics/README.md),
and when a module of config/local.yaml is not up in the scrape.

The same walk is the `demo` scenario of deploy/recorded-api-calls (tests/support/module_calls.hpp):
the API simulator's record of the calls each module made (GET /_sim/stats "callsByAgent") must be
in deploy/recorded-api-calls/demo.json, against which deploy/'s RBAC is checked; a call the file
lacks fails this test. With GNS_RECORD_API_CALLS=1 the run's calls are added to the file instead.

Usage: metrics_lint_test.py <repo> <build dir> <promtool or empty>. Without promtool it fails,
unless GNS_ALLOW_NO_PROMTOOL=1: then it exits 77 (ctest: skipped). The scrape and promtool's
report are kept in <build dir>/metrics-lint/.
"""
import json
import os
import re
import ssl
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

FOREIGN_PREFIXES = ("DCGM_FI_",)
AGENT = "gpu-node-supervisor"  # src/modules/kube/api/client.hpp ModuleAgent: "<AGENT>/<module>"
SCENARIO = "demo"


def sim_stats(sandbox):
    """GET /_sim/stats of run-local.sh's API simulator (its kubeconfig, CA and token)."""
    api_dir = os.path.join(sandbox, "apiserver")
    with open(os.path.join(api_dir, "kubeconfig")) as f:
        server = next(line.split("server:", 1)[1].strip().strip("\"'") for line in f
                      if line.strip().startswith("server:"))
    with open(os.path.join(api_dir, "token")) as f:
        token = f.read().strip()
    req = urllib.request.Request(server + "/_sim/stats", headers={"Authorization": "Bearer " + token})
    ctx = ssl.create_default_context(cafile=os.path.join(api_dir, "ca.crt"))
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return json.loads(r.read())


def calls_by_module(stats):
    """As tests/support/module_calls.cpp CallsByModule: {module: sorted calls}, the supervisor's
    agents only, calls outside any module under "(process)"."""
    out = {}
    for agent, calls in stats["callsByAgent"].items():
        if agent == AGENT:
            module = "(process)"
        elif agent.startswith(AGENT + "/") and len(agent) > len(AGENT) + 1:
            module = agent[len(AGENT) + 1:]
        else:
            continue
        for c in calls:
            text = (f"{c['group'] or 'core'}/{c['resource']}" + (f"/{c['subresource']}" if c["subresource"] else "")
                    + f" {c['verb']}")
            out.setdefault(module, set()).add(text)
    return {m: sorted(v) for m, v in out.items()}


def check_recorded_calls(repo, stats, gates):
    """As CheckRecordedCalls: the problems (calls the recording lacks), or record them."""
    path = os.path.join(repo, "deploy/recorded-api-calls", SCENARIO + ".json")
    run = calls_by_module(stats)
    if os.environ.get("GNS_RECORD_API_CALLS") == "1":
        recording = {"scenario": SCENARIO, "featureGates": gates, "calls": {}}
        if os.path.exists(path):
            with open(path) as f:
                recording = json.load(f)
        if recording["featureGates"] != gates:
            return [f"{path} was recorded with featureGates {recording['featureGates']}, this run has {gates}"]
        for module, calls in run.items():
            recording["calls"][module] = sorted(set(recording["calls"].get(module, [])) | set(calls))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(recording, indent=2, sort_keys=True) + "\n")
        os.replace(path + ".tmp", path)
        print(f"recorded the run's API calls into {path}")
        return []
    how = (f"if the code means to make it, record it: GNS_RECORD_API_CALLS=1 ctest -R integration_metrics_lint "
           f"(it adds the run's calls to {path}), and grant it in deploy/")
    if not os.path.exists(path):
        return [f"no recording {path}: {how}"]
    with open(path) as f:
        recording = json.load(f)
    problems = []
    if recording.get("featureGates") != gates:
        problems.append(f"{path} was recorded with featureGates {recording.get('featureGates')}, this run has {gates}: "
                        "delete it and record it again")
    recorded = recording["calls"]
    return problems + [f"module {module} called {call}, which {SCENARIO}.json lacks: {how}"
                       for module, calls in run.items() for call in calls if call not in recorded.get(module, [])]


def supervisor_pid(build, session):
    """The pid of `<build>/src/gpu-node-supervisor run` in run-local.sh's session, or None."""
    binary = os.path.join(build, "src/gpu-node-supervisor")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if os.getsid(int(entry)) != session:
                continue
        except (OSError, ProcessLookupError):
            continue
        if len(argv) > 1 and argv[0].decode(errors="replace") == binary and argv[1] == b"run":
            return int(entry)
    return None


def main():
    repo, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    promtool = sys.argv[3] if len(sys.argv) > 3 else ""
    if not promtool or not os.access(promtool, os.X_OK):
        if os.environ.get("GNS_ALLOW_NO_PROMTOOL") == "1":
            print("promtool not found; skipped because GNS_ALLOW_NO_PROMTOOL=1")
            return 77
        print(f"promtool not found ({promtool!r}): run tools/install-deps.sh and re-run cmake, "
              "or set GNS_ALLOW_NO_PROMTOOL=1 to skip this test knowingly", file=sys.stderr)
        return 1
    out_dir = os.path.join(build, "metrics-lint")
    os.makedirs(out_dir, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="gns-metrics-lint-") as sandbox:
        env = dict(os.environ, GNS_SANDBOX=sandbox, GNS_METRICS_LISTEN="127.0.0.1:0", GNS_DEMO="0",
                   NODE_NAME="sim-node-0")
        node = subprocess.Popen([os.path.join(repo, "tools/sim/run-local.sh"), build], cwd=repo, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        log, address = [], []
        found = threading.Event()

        def read():
            pattern = re.compile(r"serving /metrics /healthz /readyz on http://([0-9.]+:[0-9]+)")
            for line in node.stdout:
                log.append(line)
                match = pattern.search(line)
                if match and not address:
                    address.append(match.group(1))
                    found.set()
            found.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            if not found.wait(180) or not address:
                print("".join(log[-80:]), file=sys.stderr)
                print("the supervisor did not say where it serves /metrics", file=sys.stderr)
                return 1
            # What run-local.sh hands its own demo: the build's tools (gns-csi-client) and the
            # supervisor's pid (gkm-csi's mount is seen through its mount namespace).
            # The fake NVML's config is run-local.sh's sandbox copy, which demo.py's MIG step rewrites.
            demo_env = dict(env, GNS_METRICS_LISTEN=address[0], GNS_REPO=repo, GNS_BUILD_DIR=build,
                            FAKE_NVML_CONFIG=os.path.join(sandbox, "gpus.json"))
            supervisor = supervisor_pid(build, node.pid)
            if supervisor:
                demo_env["GNS_SUPERVISOR_PID"] = str(supervisor)
            demo = subprocess.run([sys.executable, os.path.join(repo, "tools/sim/demo.py")], cwd=repo, env=demo_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
            print(demo.stdout)
            if demo.returncode != 0:
                print("".join(log[-80:]), file=sys.stderr)
                print(f"tools/sim/demo.py failed ({demo.returncode}): the scrape would miss families", file=sys.stderr)
                return 1
            with urllib.request.urlopen(f"http://{address[0]}/metrics", timeout=10) as response:
                scrape = response.read().decode()
            stats = sim_stats(sandbox)
        finally:
            os.killpg(node.pid, signal.SIGTERM)
            try:
                node.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
            reader.join(10)

    scrape_file = os.path.join(out_dir, "scrape.prom")
    with open(scrape_file, "w") as f:
        f.write(scrape)
    lint = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True)
    report = lint.stdout + lint.stderr
    with open(os.path.join(out_dir, "promtool.txt"), "w") as f:
        f.write(report)

    failed = False
    with open(os.path.join(repo, "config/local.yaml")) as f:
        site = yaml.safe_load(os.path.expandvars(f.read()))
    host_managed = bool((site.get("featureGates") or {}).get("HostManagedIMEX", False))
    gates = {"ComputeDomainCliques": not host_managed and bool((site.get("featureGates") or {}).get(
        "ComputeDomainCliques", True)), "HostManagedIMEX": host_managed}
    for problem in check_recorded_calls(repo, stats, gates):
        print(problem, file=sys.stderr)
        failed = True
    ours = [line for line in report.splitlines() if line.strip() and not line.startswith(FOREIGN_PREFIXES)]
    foreign = [line for line in report.splitlines() if line.startswith(FOREIGN_PREFIXES)]
    for line in ours:
        print(f"promtool: {line}", file=sys.stderr)
        failed = True
    if lint.returncode not in (0, 3):  # 3: lint problems only; anything else is a parse error
        print(f"promtool check metrics exited {lint.returncode}", file=sys.stderr)
        failed = True
    print(f"{len(ours)} problem(s) in our families, {len(foreign)} in the foreign ones (tolerated); "
          f"scrape in {scrape_file}")
    if not foreign:
        print("no DCGM_FI_ lint: did the demo's GPU pod step produce the per-pod series?", file=sys.stderr)
        failed = True

    with open(os.path.join(repo, "config/local.yaml")) as f:
        text = os.path.expandvars(f.read())
    modules = [name for name, body in (yaml.safe_load(text).get("modules") or {}).items()
               if isinstance(body, dict) and body.get("enabled")]
    for module in modules:
        if f'gpu_node_supervisor_module_up{{module="{module}"}} 1' not in scrape:
            print(f"module {module} is not up in the scrape", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

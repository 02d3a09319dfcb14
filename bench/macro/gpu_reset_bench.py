#!/usr/bin/python3
"""XID -> GPU Healthy again on the simulated node, through the real binary (issue #12), or an
operator's `reset-gpu` with no XID before it -> Healthy again (issue #23 item 7: --request cli).

A supervisor with gpu-inventory (fake NVML), journald (real journal files), gpu-health and
gpu-reset (autoReset on, the fake nvidia-smi as the reset command, the production settle window
and eventWaitTimeout unless given) and journald-sim.py for its acknowledgements. Each round
appends an NVRM Xid 48 line for one GPU to the journal (or runs `reset-gpu` for it) and waits
until that GPU is Healthy again and its job has ended (the settle window watches the GPU back in
service, so a round lasts at least `settle`). The end is the verdict's own timestamp (`since_unix_ms`,
taken by gpu-health when it turns the GPU Healthy), compared with the wall clock when the line
was appended, so the bench polls /debug/state only every 20 ms: a busier poll (every 2 ms, as
before) made the loop serialise the whole state 500 times a second and slowed what it measured.
The reset command's own run time comes from the module's record. Our overhead = (XID appended
-> Healthy) - command.

  gpu_reset_bench.py --build build/release [--rounds 30] [--request xid|cli] [--settle 10s] [--event-wait 5s]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100.0 * (len(ordered) - 1))))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build/release")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--event-wait", default="", help="gpu-inventory eventWaitTimeout (default: the production one)")
    parser.add_argument("--settle", default="", help="gpu-reset settle (default: the production one)")
    parser.add_argument("--request", choices=("xid", "cli"), default="xid",
                        help="xid: an XID line and autoReset; cli: `reset-gpu` with no XID before it")
    parser.add_argument("--no-nvml-xid", action="store_true",
                        help="append the kernel line only; by default NVML reports the XID too, as the driver does")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    sandbox = tempfile.mkdtemp(prefix="gns-rb-")
    procs = []
    try:
        for d in ("journal", "state", "host/proc/sys/kernel/random"):
            os.makedirs(os.path.join(sandbox, d))
        os.chmod(os.path.join(sandbox, "state"), 0o700)
        with open("/proc/sys/kernel/random/boot_id") as f, \
                open(os.path.join(sandbox, "host/proc/sys/kernel/random/boot_id"), "w") as out:
            out.write(f.read())
        socket_path = os.path.join(sandbox, "host/run/systemd/journal/socket")
        procs.append(subprocess.Popen([sys.executable, os.path.join(REPO, "tools/sim/journal/journald-sim.py"),
                                       "--socket", socket_path, "--output",
                                       os.path.join(sandbox, "journal/native.journal")],
                                      stdout=subprocess.DEVNULL))
        while not os.path.exists(socket_path):
            time.sleep(0.01)
        config = os.path.join(sandbox, "site.yaml")
        event_wait = f", eventWaitTimeout: {args.event_wait}" if args.event_wait else ""
        settle = f"    settle: {args.settle}\n" if args.settle else ""
        with open(config, "w") as f:
            f.write(f"""version: v1
nodeName: bench
paths: {{kubeletDir: {sandbox}/kubelet, cdiDir: {sandbox}/cdi, stateDir: {sandbox}/state, hostRoot: {sandbox}/host}}
logging: {{level: warn}}
modules:
  metrics: {{enabled: true, listen: "127.0.0.1:0"}}
  gpu-inventory: {{enabled: true, nvmlLibrary: {build}/tools/sim/fake_nvml/libnvidia-ml.so.1{event_wait}}}
  journald: {{enabled: true, directory: {sandbox}/journal, units: []}}
  gpu-health: {{enabled: true}}
  gpu-reset:
    enabled: true
    autoReset: true
    command: [{REPO}/tools/sim/fake_nvml/nvidia-smi, --gpu-reset, -i, "{{uuid}}"]
{settle}""")
        env = dict(os.environ, FAKE_NVML_CONFIG=os.path.join(REPO, "tools/sim/fake_nvml/gpus-8.json"),
                   FAKE_NVML_CONTROL=os.path.join(sandbox, "nvml.sock"))
        sup = subprocess.Popen([os.path.join(build, "src/gpu-node-supervisor"), "run", "--config", config,
                                "--log-level", "info"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        procs.append(sup)
        port = None
        for line in sup.stdout:
            if "serving /metrics" in line:
                port = int(line.rsplit(":", 1)[1].split()[0].strip("/"))
                break
        if port is None:
            raise SystemExit("the supervisor did not start")
        # Keep reading its output so it never blocks on a full pipe.
        import threading
        threading.Thread(target=lambda: [None for _ in sup.stdout], daemon=True).start()

        def state():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/state", timeout=5) as r:
                return json.loads(r.read())

        deadline = time.monotonic() + 60
        while True:
            s = state()
            if s.get("gpu-inventory.devices", {}).get("available") and "gpu-health.state" in s:
                break
            if time.monotonic() > deadline:
                raise SystemExit("the supervisor never became ready")
            time.sleep(0.05)
        gpus = [(g["uuid"], g["pci_bus_id"] if "pci_bus_id" in g else None)
                for g in json.load(open(os.path.join(REPO, "tools/sim/fake_nvml/gpus-8.json")))["gpus"]]
        totals, commands, overheads, steps = [], [], [], {}
        for i in range(args.rounds):
            uuid = gpus[i % len(gpus)][0]
            pci = json.load(open(os.path.join(REPO, "tools/sim/fake_nvml/gpus-8.json")))["gpus"][i % len(gpus)]["pciBusId"]
            pci = pci.lower().replace("00000000:", "0000:")[:10]
            jobs_before = len(state().get("gpu-reset.state", {}).get("jobs", []))
            cli = None
            if args.request == "cli":
                t0 = time.monotonic()
                t0_wall_ms = time.time() * 1000
                cli = subprocess.Popen([os.path.join(build, "src/gpu-node-supervisor"), "reset-gpu", "--state-dir",
                                        os.path.join(sandbox, "state"), "--gpu", uuid],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            else:
                subprocess.run([os.path.join(REPO, "tools/sim/journal/journal-sim.sh"), os.path.join(sandbox, "journal"),
                                "uuid", pci, uuid], check=True)
                subprocess.run([os.path.join(REPO, "tools/sim/journal/journal-sim.sh"), os.path.join(sandbox, "journal"),
                                "xid", pci, "48", "DBE (double bit error) ECC error"], check=True)
                t0 = time.monotonic()
                t0_wall_ms = time.time() * 1000
                if not args.no_nvml_xid:
                    # The driver raises both at once: NVML's XID event follows the kernel line.
                    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    ctl.bind(os.path.join(sandbox, "ctl-reply.sock"))
                    ctl.settimeout(5)
                    if not os.path.exists(os.path.join(sandbox, "nvml.sock")):
                        raise SystemExit(f"round {i}: NVML is not initialised in the supervisor (no fake control socket)")
                    ctl.sendto(json.dumps({"injectXid": {"uuid": uuid, "xid": 48}}).encode(), os.path.join(sandbox, "nvml.sock"))
                    reply = json.loads(ctl.recv(4096))
                    ctl.close()
                    os.unlink(os.path.join(sandbox, "ctl-reply.sock"))
                    if not reply.get("ok") or reply.get("delivered", 0) < 1:
                        raise SystemExit(f"round {i}: NVML XID not delivered: {reply}")
            while True:
                s = state()
                verdict = s.get("gpu-health.device", {}).get(uuid, {})
                jobs = s.get("gpu-reset.state", {}).get("jobs", [])
                done = [j for j in jobs if j["gpus"][0]["uuid"] == uuid and j.get("phase") in ("Succeeded", "Failed")]
                # Healthy again after this round's XID (a verdict from before it has an older timestamp).
                if verdict.get("healthy") and verdict.get("since_unix_ms", 0) >= t0_wall_ms - 1 and \
                        len(jobs) > jobs_before and done:
                    healthy_at_ms = verdict["since_unix_ms"]
                    break
                if time.monotonic() - t0 > 60:
                    raise SystemExit(f"round {i}: {uuid} not Healthy again within 60 s: verdict {json.dumps(verdict)}; "
                                     f"jobs {json.dumps(jobs)[-600:]}")
                time.sleep(0.02)
            job = done[-1]
            if cli is not None and cli.wait(timeout=30) != 0:
                raise SystemExit(f"round {i}: reset-gpu exited with {cli.returncode}")
            if job["phase"] != "Succeeded":
                raise SystemExit(f"round {i}: the reset failed: {job.get('message')}")
            total = healthy_at_ms - t0_wall_ms
            command = job["gpus"][0].get("commandMs", 0)
            for step in job["gpus"][0].get("steps", []):
                steps.setdefault(step["name"], []).append(step["durationMs"])
            totals.append(total)
            commands.append(command)
            overheads.append(total - command)
        time.sleep(1)
        all_jobs = state().get("gpu-reset.state", {}).get("jobs", [])
        if len(all_jobs) != min(args.rounds, 64):  # the record keeps the last 64 finished jobs
            raise SystemExit(f"{len(all_jobs)} reset jobs for {args.rounds} XIDs: " +
                             ", ".join(f"{j['id']} {j.get('phase')}" for j in all_jobs))
        defaults = (f"settle {args.settle or 'production (10s)'}, "
                    f"eventWaitTimeout {args.event_wait or 'production (5s)'}")
        if args.request == "cli":
            print(f"reset-gpu (no XID before it) -> Healthy again, {args.rounds} rounds over 8 GPUs ({defaults}):")
        else:
            source = "kernel line only" if args.no_nvml_xid else "kernel line + NVML event"
            print(f"XID 48 ({source}) -> autoReset -> Healthy again, {args.rounds} rounds over 8 GPUs ({defaults}):")
        print(f"  total     p50 {percentile(totals, 50):7.1f} ms  p99 {percentile(totals, 99):7.1f} ms")
        print(f"  command   p50 {percentile(commands, 50):7.1f} ms  p99 {percentile(commands, 99):7.1f} ms"
              "  (the fake nvidia-smi: a Python process)")
        # Issue #12: an XID's reset adds <= 50 ms; issue #23: an operator's reset reaches Healthy
        # within the command's time plus 1 s with production defaults.
        target = 1000 if args.request == "cli" else 50
        print(f"  ours      p50 {percentile(overheads, 50):7.1f} ms  p99 {percentile(overheads, 99):7.1f} ms"
              f"  (target p99 <= {target} ms: {'met' if percentile(overheads, 99) <= target else 'MISSED'})")
        print("  per step p50: " + ", ".join(f"{name} {percentile(v, 50)} ms" for name, v in steps.items()) +
              " (restore includes the settle window, watched with the GPU back in service)")
        print(f"  ours mean {statistics.mean(overheads):.1f} ms (the verdict's timestamp has 1 ms resolution)")
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(sandbox, ignore_errors=True)


if __name__ == "__main__":
    main()

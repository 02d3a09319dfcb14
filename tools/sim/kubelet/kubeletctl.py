#!/usr/bin/python3
"""Send commands to a running gns-sim-kubelet through its control socket.

The simulator answers each command line with one line of JSON. This tool sends the words given
on the command line as one command, prints the reply (indented with --pretty) and exits 0 when
the reply says "ok", 1 when it does not, 2 when the simulator cannot be reached.

Examples:
  kubeletctl.py --socket /tmp/kubelet.ctl state
  kubeletctl.py restart
  kubeletctl.py allocate nvidia.com/gpu GPU-a,GPU-b          # one container, two devices
  kubeletctl.py allocate nvidia.com/gpu GPU-a GPU-b          # two containers
  kubeletctl.py preferred nvidia.com/gpu GPU-a,GPU-b,GPU-c - 2
  kubeletctl.py prestart nvidia.com/gpu GPU-a
  kubeletctl.py prepare gpu.nvidia.com '{"namespace":"default","uid":"u1","name":"c1"}'
  kubeletctl.py unprepare --version=v1beta1 gpu.nvidia.com '[{"namespace":"default","uid":"u1","name":"c1"}]'
  kubeletctl.py probe
  kubeletctl.py allocate --pod=default/trainer --containers=main nvidia.com/gpu GPU-a   # recorded for List
  kubeletctl.py prepare --pod=default/trainer gpu.nvidia.com '{"namespace":"default","uid":"u1","name":"c1"}'
  kubeletctl.py pod-resources                                # what PodResourcesLister.List answers
  kubeletctl.py forget-pod default/trainer                   # the pod is gone
  kubeletctl.py inject-pod-devices default/x main nvidia.com/gpu GPU-unknown
  kubeletctl.py pod-resources-socket off                     # a kubelet without the socket
  kubeletctl.py csi-publish csi.gkm.io ml/trainer 5f1d7c1e-0c6e-4d4e-9d7a-6b0c1a2b3c4d kernel-cache \
      '{"cacheName":"llama","cacheNamespace":"ml"}'           # a pod's inline CSI volume (--readonly)
  kubeletctl.py csi-unpublish 5f1d7c1e-0c6e-4d4e-9d7a-6b0c1a2b3c4d kernel-cache
  kubeletctl.py csi-volumes                                  # the pods' CSI volumes (vol_data.json)

The socket defaults to $GNS_SIM_KUBELET_CONTROL. Standard library only (run with /usr/bin/python3).
"""

import argparse
import json
import os
import socket
import sys


def main():
    parser = argparse.ArgumentParser(
        description="Send one command to gns-sim-kubelet's control socket.",
        epilog="commands: state, restart, probe, allocate, preferred, prestart, prepare, unprepare, "
               "pod-resources, forget-pod, inject-pod-devices, pod-resources-socket, "
               "csi-publish, csi-unpublish, csi-volumes, help",
    )
    parser.add_argument("--socket", default=os.environ.get("GNS_SIM_KUBELET_CONTROL"),
                        help="control socket path (default: $GNS_SIM_KUBELET_CONTROL)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON reply")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    args = parser.parse_args()
    if not args.socket:
        parser.error("no --socket given and GNS_SIM_KUBELET_CONTROL is not set")
    if not args.command:
        parser.error("no command given")

    line = " ".join(args.command)
    if "\n" in line:
        parser.error("a command is one line")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(args.timeout)
            sock.connect(args.socket)
            sock.sendall(line.encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
    except OSError as error:
        print(f"kubeletctl: {args.socket}: {error}", file=sys.stderr)
        return 2
    if not reply:
        print("kubeletctl: no reply", file=sys.stderr)
        return 2
    try:
        parsed = json.loads(reply)
    except json.JSONDecodeError:
        print(reply.decode(errors="replace").rstrip("\n"))
        return 1
    print(json.dumps(parsed, indent=2) if args.pretty else reply.decode().rstrip("\n"))
    return 0 if parsed.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

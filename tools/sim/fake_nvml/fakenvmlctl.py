#!/usr/bin/python3
"""Send commands to a running fake NVML (tools/sim/fake_nvml) through its control socket.

The fake creates a unix datagram socket at $FAKE_NVML_CONTROL when the process using it calls
nvmlInit. Each command is one JSON datagram; this tool binds an abstract address so the fake can
reply, and exits 0 when the reply says ok, 1 when it reports an error, 2 on no reply.

Examples:
  fakenvmlctl.py inject-xid GPU-3f8a1c52-7e00-4b9d-9c1e-5a7d2e8f6b10 79
  fakenvmlctl.py inject-event GPU-3f8a… doubleBitEcc   # an ECC/clock event (types: README)
  fakenvmlctl.py inject-event GPU-3f8a… doubleBitEcc --health '{"eccUncorrectedVolatile": 1}'
  fakenvmlctl.py registered-events GPU-3f8a…            # what the event sets registered
  fakenvmlctl.py fail '*' UNKNOWN          # every NVML call returns 999
  fakenvmlctl.py fail nvmlEventSetWait_v2 GPU_IS_LOST
  fakenvmlctl.py clear-failures
  fakenvmlctl.py set-health GPU-3f8a… '{"remapPending": true}'   # health readings (README)
  fakenvmlctl.py set-health GPU-3f8a… '{"nvlinkDown": [1], "pcieWidth": 8}'
  fakenvmlctl.py set-health GPU-3f8a… '{"nvlinkErrors": {"0": {"replay": 3}}, "nvlinkThroughput": {"0": {"dataTxKiB": 4096, "dataRxKiB": 1024}}}'
  fakenvmlctl.py set-health GPU-3f8a… '{"lost": true}'            # GPU_IS_LOST from every call
  fakenvmlctl.py clear-health
  fakenvmlctl.py set-topology GPU-3f8a… '[{"switch": "0000:c3:00.0", "links": [0, 1], "ports": [10, 11]}]'
                                           # NVLinks into NVSwitch ports (read at the next NVML open)
  fakenvmlctl.py hang nvmlDeviceGetTemperature 0   # blocks until release-hangs (N>0: N seconds)
  fakenvmlctl.py release-hangs
  fakenvmlctl.py raw '{"ping": true}'

Standard library only (run with /usr/bin/python3).
"""

import argparse
import json
import os
import socket
import sys
import time

# NVML return codes by name (nvml.h nvmlReturn_t), for `fail`.
RETURN_CODES = {
    "SUCCESS": 0, "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4, "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7,
    "INSUFFICIENT_POWER": 8, "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "IRQ_ISSUE": 11,
    "LIBRARY_NOT_FOUND": 12, "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14,
    "GPU_IS_LOST": 15, "RESET_REQUIRED": 16, "OPERATING_SYSTEM": 17,
    "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "MEMORY": 20, "NO_DATA": 21,
    "ARGUMENT_VERSION_MISMATCH": 25, "NOT_READY": 27, "UNKNOWN": 999,
}


def return_code(text):
    name = text.upper().removeprefix("NVML_").removeprefix("ERROR_")
    if name in RETURN_CODES:
        return RETURN_CODES[name]
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an NVML return code: {text}")


def build_command(args):
    if args.command == "inject-xid":
        command = {"uuid": args.gpu, "xid": args.xid}
        if args.gpu_instance is not None:
            command["gpuInstance"] = args.gpu_instance
        if args.compute_instance is not None:
            command["computeInstance"] = args.compute_instance
        return {"injectXid": command}
    if args.command == "inject-event":
        event = {"injectEvent": {"uuid": args.gpu, "type": args.type, "data": args.data}}
        if args.health is None:
            return event
        keys = json.loads(args.health)
        if not isinstance(keys, dict):
            raise ValueError("--health must be a JSON object")
        # Two datagrams, in this order: the reading changes, then the event announces it (the
        # keys of one object run in the fake's key order, not the sender's).
        return [{"setHealth": dict(keys, uuid=args.gpu)}, event]
    if args.command == "registered-events":
        return {"registeredEvents": {"uuid": args.gpu}}
    if args.command == "fail":
        return {"fail": {"function": args.function, "return": args.code}}
    if args.command == "clear-failures":
        return {"clearFailures": True}
    if args.command == "reload-config":
        return {"reloadConfig": True}
    if args.command == "ping":
        return {"ping": True}
    if args.command == "set-health":
        keys = json.loads(args.keys)
        if not isinstance(keys, dict):
            raise ValueError("the health keys must be a JSON object")
        return {"setHealth": dict(keys, uuid=args.gpu)}
    if args.command == "set-topology":
        links = json.loads(args.links)
        if not isinstance(links, list):
            raise ValueError("the topology must be a JSON list of {switch, links, ports}")
        return {"setHealth": {"uuid": args.gpu, "nvswitchLinks": links}}
    if args.command == "clear-health":
        return {"clearHealth": True}
    if args.command == "hang":
        return {"hang": {"function": args.function, "seconds": args.seconds}}
    if args.command == "release-hangs":
        return {"releaseHangs": True}
    return json.loads(args.json)


def send(path, command, timeout, wait):
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        if wait:
            # An abstract address (leading NUL): nothing to clean up on the file system.
            sock.bind("\0fakenvmlctl-%d-%s" % (os.getpid(), os.urandom(4).hex()))
        sock.settimeout(timeout)
        # The socket lives from the process's first nvmlInit to its last nvmlShutdown. When
        # gpu-inventory reopens its session (a GPU released for its reset, or taken back), the
        # path is gone for a moment between the two: wait for it, within the timeout.
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock.sendto(json.dumps(command).encode(), path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)
        if not wait:
            return None
        return json.loads(sock.recv(65536).decode())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=os.environ.get("FAKE_NVML_CONTROL"),
                        help="control socket path (default: $FAKE_NVML_CONTROL)")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply")
    parser.add_argument("--no-wait", action="store_true", help="send without waiting for a reply")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inject-xid", help="queue an Xid event for a GPU (UUID or PCI bus id)")
    p.add_argument("gpu")
    p.add_argument("xid", type=int)
    p.add_argument("--gpu-instance", type=int, help="MIG GPU instance id the Xid names")
    p.add_argument("--compute-instance", type=int, help="MIG compute instance id the Xid names")
    p = sub.add_parser("inject-event", help="queue an NVML event (ECC, clock, …) for a GPU")
    p.add_argument("gpu")
    p.add_argument("type", help="singleBitEcc, doubleBitEcc, clock, pstate, xid, or the mask bit")
    p.add_argument("--data", type=int, default=0, help="eventData (default 0)")
    p.add_argument("--health", help="set-health keys applied first, in the same command")
    p = sub.add_parser("registered-events", help="the event types registered on a GPU (all processes)")
    p.add_argument("gpu")
    p = sub.add_parser("fail", help="make an NVML function ('*' = all) return an error")
    p.add_argument("function")
    p.add_argument("code", type=return_code, help="NVML return code: number or name (GPU_IS_LOST)")
    sub.add_parser("clear-failures", help="remove every injected failure")
    sub.add_parser("reload-config",
                   help="re-read FAKE_NVML_CONFIG (a MIG reconfiguration: same GPUs, new MIG layout)")
    p = sub.add_parser("set-health", help="change a GPU's health readings (JSON object of README keys)")
    p.add_argument("gpu")
    p.add_argument("keys")
    sub.add_parser("clear-health", help="forget every set-health change (and set-topology)")
    p = sub.add_parser("set-topology",
                       help="wire a GPU's NVLinks to NVSwitch ports: JSON list of {switch, links, ports}")
    p.add_argument("gpu")
    p.add_argument("links")
    p = sub.add_parser("hang", help="make an NVML function ('*' = all) block")
    p.add_argument("function")
    p.add_argument("seconds", type=int, nargs="?", default=0, help="0 (default): until release-hangs")
    sub.add_parser("release-hangs", help="end every hang")
    sub.add_parser("ping", help="check that the fake is listening")
    p = sub.add_parser("raw", help="send a JSON command as is")
    p.add_argument("json")
    args = parser.parse_args(argv)

    if not args.socket:
        parser.error("no control socket: pass --socket or set FAKE_NVML_CONTROL")
    try:
        command = build_command(args)
    except ValueError as e:
        parser.error(str(e))
    for one in command if isinstance(command, list) else [command]:
        try:
            reply = send(args.socket, one, args.timeout, not args.no_wait)
        except (OSError, ValueError) as e:
            print(f"fakenvmlctl: {args.socket}: {e}", file=sys.stderr)
            return 2
        if reply is None:
            continue
        print(json.dumps(reply))
        if not reply.get("ok"):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

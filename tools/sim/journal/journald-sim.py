#!/usr/bin/python3
"""A stand-in for journald's native socket on the simulated node.

Listens on a unix datagram socket (as /run/systemd/journal/socket), decodes journald's native
protocol ("FIELD=value\\n", or "FIELD\\n" + 64-bit little-endian length + bytes + "\\n" for values
with newlines), adds what journald adds (__REALTIME_TIMESTAMP, __MONOTONIC_TIMESTAMP, _BOOT_ID,
_TRANSPORT=journal, _PID/_UID/_GID from the sender's credentials) and appends each entry to a
real journal file through one long-running /lib/systemd/systemd-journal-remote fed through a
pipe (entries arrive live for readers). Runs until SIGTERM/SIGINT.

  journald-sim.py --socket SANDBOX/host/run/systemd/journal/socket --output SANDBOX/journal/native.journal

Standard library only (run with /usr/bin/python3).
"""

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import time

JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"


def decode(datagram):
    fields = []
    i = 0
    while i < len(datagram):
        nl = datagram.find(b"\n", i)
        if nl < 0:
            raise ValueError("an entry line without a newline")
        line = datagram[i:nl]
        eq = line.find(b"=")
        if eq >= 0:
            fields.append((line[:eq], line[eq + 1:]))
            i = nl + 1
            continue
        # Binary form: name, newline, 64-bit LE size, data, newline.
        if nl + 9 > len(datagram):
            raise ValueError("a binary field without its size")
        (size,) = struct.unpack("<Q", datagram[nl + 1:nl + 9])
        start = nl + 9
        if start + size + 1 > len(datagram) or datagram[start + size:start + size + 1] != b"\n":
            raise ValueError("a binary field with a wrong size")
        fields.append((line, datagram[start:start + size]))
        i = start + size + 1
    for name, _ in fields:
        if not name or name.startswith(b"_") or not all(c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_" for c in name):
            raise ValueError("a field name journald refuses: %r" % name)
    return fields


def export(fields, boot_id, creds):
    out = bytearray()
    now = time.time_ns() // 1000
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    base = [(b"__REALTIME_TIMESTAMP", str(now).encode()), (b"__MONOTONIC_TIMESTAMP", str(mono).encode()),
            (b"_BOOT_ID", boot_id.encode()), (b"_TRANSPORT", b"journal")]
    if creds:
        pid, uid, gid = creds
        base += [(b"_PID", str(pid).encode()), (b"_UID", str(uid).encode()), (b"_GID", str(gid).encode())]
    for name, value in base + fields:
        if b"\n" in value:
            out += name + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
        else:
            out += name + b"=" + value + b"\n"
    out += b"\n"
    return bytes(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--output", required=True, help="the .journal file to append to")
    args = parser.parse_args(argv)
    boot_id = open("/proc/sys/kernel/random/boot_id").read().strip().replace("-", "")
    os.makedirs(os.path.dirname(args.socket), exist_ok=True)
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(args.socket)
    os.chmod(args.socket, 0o666)
    writer = subprocess.Popen([JOURNAL_REMOTE, "--output=" + args.output, "-"], stdin=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)

    def stop(*_):
        try:
            writer.stdin.close()
        except OSError:
            pass
        writer.wait(timeout=5)
        try:
            os.unlink(args.socket)
        except OSError:
            pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"journald-sim: {args.socket} -> {args.output}", flush=True)
    creds_size = struct.calcsize("3i")
    while True:
        data, ancdata, _, _ = sock.recvmsg(256 * 1024, socket.CMSG_SPACE(creds_size))
        creds = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= creds_size:
                creds = struct.unpack("3i", payload[:creds_size])
        try:
            fields = decode(data)
        except ValueError as e:
            print(f"journald-sim: dropped a malformed entry: {e}", file=sys.stderr, flush=True)
            continue
        writer.stdin.write(export(fields, boot_id, creds))
        writer.stdin.flush()


if __name__ == "__main__":
    sys.exit(main())

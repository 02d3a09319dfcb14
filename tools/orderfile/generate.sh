#!/usr/bin/env bash
# Regenerates tools/orderfile/gpu-node-supervisor.order: the functions the supervisor runs from
# exec through 30 s at rest with every module on (the make run set, production timers, as
# tools/idle-bench.sh runs it), recorded by callgrind, as mangled symbol names.
#
# Why: a file page counts in VmRSS once touched and the kernel maps 64 KiB around every fault,
# so functions that run scattered over 12 MB of text make nearly all of it resident (96%
# measured). The optimised build links with lld and --symbol-ordering-file: what runs is laid
# out together (cmake/GnsStaticDeps.cmake). A stale list only costs memory, never correctness:
# symbols that no longer exist are ignored, new functions go after the listed ones.
#
#   tools/orderfile/generate.sh [build_dir]     (default build/release; needs valgrind)
set -euo pipefail
build_dir=${1:-build/release}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
binary=$build_dir/src/gpu-node-supervisor
[[ -x $binary ]] || { echo "orderfile: no $binary (build first)" >&2; exit 1; }
command -v valgrind > /dev/null || { echo "orderfile: valgrind is not installed" >&2; exit 1; }

work=$(mktemp -d /tmp/gns-orderfile-XXXXXX)
real=$work/gpu-node-supervisor
cp "$binary" "$real"
mv "$binary" "$work/original"
restore() {
  [[ -n ${runner:-} ]] && { kill -TERM -- -"$runner" 2>/dev/null || true; wait "$runner" 2>/dev/null || true; }
  mv -f "$work/original" "$binary"
  rm -rf "$work"
}
trap restore EXIT
# run-local.sh starts $build_dir/src/gpu-node-supervisor: `run` goes through callgrind.
cat > "$binary" <<WRAP
#!/usr/bin/env bash
if [[ \$1 == run ]]; then
  exec valgrind --tool=callgrind --callgrind-out-file=$work/callgrind.out --dump-instr=no \
    --compress-strings=no --compress-pos=no "$real" "\$@"
fi
exec "$real" "\$@"
WRAP
chmod +x "$binary"

port=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
sed -e '/eventWaitTimeout:/d' -e '/retryBackoff:/d' -e '/^    resync:/d' -e '/retryMax:/d' \
    -e '/leaderElection: {namespace/d' -e '/retryInterval:/d' -e 's/^  level: info/  level: warn/' \
    config/local.yaml > "$work/site.yaml"
GNS_SIM_BOOKMARK_MS=60000 GNS_SANDBOX=$work/sim GNS_METRICS_LISTEN=127.0.0.1:$port GNS_DEMO=0 \
  GNS_CONFIG=$work/site.yaml NODE_NAME=sim-node-0 setsid tools/sim/run-local.sh "$build_dir" > "$work/run.log" 2>&1 &
runner=$!
ready=0
for _ in $(seq 600); do
  if /usr/bin/python3 -c 'import sys,urllib.request as u;u.urlopen(sys.argv[1],timeout=1)' \
      "http://127.0.0.1:$port/readyz" 2>/dev/null; then ready=1; break; fi
  sleep 0.5
done
[[ $ready == 1 ]] || { echo "orderfile: the supervisor did not get ready; its log:" >&2; tail -30 "$work/run.log" >&2; exit 1; }
sleep 30
kill -TERM -- -"$runner"
wait "$runner" 2>/dev/null || true
runner=
for _ in $(seq 120); do [[ -s $work/callgrind.out ]] && break; sleep 0.5; done

# callgrind names functions demangled; nm pairs each demangled name with its symbol(s).
nm --defined-only "$real" | awk '$2 ~ /^[tTwW]$/ {print $3}' > "$work/mangled"
nm --defined-only -C "$real" | awk '$2 ~ /^[tTwW]$/' | cut -d' ' -f3- > "$work/demangled"
/usr/bin/python3 - "$work" "$real" tools/orderfile/gpu-node-supervisor.order <<'PY'
import collections, sys
work, real, out = sys.argv[1:]
mangled = open(f"{work}/mangled").read().split("\n")
demangled = open(f"{work}/demangled").read().split("\n")
if len(mangled) != len(demangled):
    sys.exit("orderfile: nm listings differ in length")
symbols = collections.defaultdict(list)
for m, d in zip(mangled, demangled):
    symbols[d].append(m)
ran, obj = set(), None
for line in open(f"{work}/callgrind.out", errors="replace"):
    if line.startswith("ob="):
        obj = line[3:].strip()
    elif line.startswith("fn=") and obj == real:
        ran.add(line[3:].strip().split("'")[0])  # callgrind marks recursion cycles with 'N
ordered = sorted({m for name in ran for m in symbols.get(name, [])})
if len(ordered) < 1000:
    sys.exit(f"orderfile: only {len(ordered)} functions recorded; not writing {out}")
with open(out, "w") as f:
    f.write("\n".join(ordered) + "\n")
print(f"orderfile: {len(ordered)} of {len(mangled)} functions ran; wrote {out}")
PY

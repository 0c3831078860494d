#!/usr/bin/env bash
# Installs every Debian package Strata's build, tests and benchmarks need. Idempotent and
# non-interactive: packages already present are skipped, and apt is only touched when one is missing.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected at /usr/local/cuda; without it the build is CPU-only.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libaio-dev libhwloc-dev libtbb-dev libhwy-dev
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  fio
  chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

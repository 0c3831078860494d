#!/usr/bin/env bash
# Configures and builds Strata into build/ (Release, cuda backend when nvcc is found).
# Usage: scripts/build.sh [extra cmake args...]   e.g. -DSTRATA_CUDA=OFF
# BUILD_DIR overrides the folder; JOBS the parallelism (default: all cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
jobs=${JOBS:-$(nproc)}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake "$build" "$@"
fi
cmake --build "$build" --parallel "$jobs"

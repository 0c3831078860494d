#!/usr/bin/env bash
# Installs the dependencies, builds everything (the cuda backend compiled when nvcc is present) and runs
# the whole test suite. Tests that need a GPU skip with their reason when none is visible.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
# The Python package is required here (STRATA_PYTHON=ON): with AUTO a missing pybind11 would leave its
# tests out with one status line, and the suite would pass without them.
bash "$root/scripts/build.sh" -DSTRATA_PYTHON=ON
build=${BUILD_DIR:-$root/build}
ctest --test-dir "$build" --output-on-failure --timeout 600 -j "${JOBS:-$(nproc)}"

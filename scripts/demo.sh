#!/usr/bin/env bash
# The main job: installs the dependencies, builds Strata, prints `strata report` for this machine, and
# runs a short smoke of what is built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
mkdir -p "$build/demo"
"$build/tools/strata" report --nvme-path "$build/demo"

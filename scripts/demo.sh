#!/usr/bin/env bash
# The main job: installs the dependencies, builds Strata, prints `strata report` for this machine, then
# trains the 10m model with its parameters and optimizer states offloaded to pinned host memory (ZeRO-3
# CPU offload, the device capped at 64 MiB) on this repository's own documentation, tokenized as bytes.
# The loss falls from about 5.5 to about 3 in 60 steps (under a minute on 2 cores, after the build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/install-deps.sh"
bash "$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
mkdir -p "$build/demo"
"$build/tools/strata" report --nvme-path "$build/demo"

# Training text: every Markdown file in the repository, concatenated.
find "$root" -name '*.md' -not -path '*/build*' -print0 | sort -z | xargs -0 cat > "$build/demo/text.txt"
"$build/tools/strata" train --config "$root/configs/demo_cpu.json" --model 10m --text "$build/demo/text.txt" \
  --seq-len 64 --steps "${DEMO_STEPS:-60}" --save "$build/demo/ckpt" --export "$build/demo/model.safetensors"

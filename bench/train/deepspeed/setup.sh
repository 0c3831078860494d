#!/usr/bin/env bash
# Installs what bench/train/deepspeed/compare.py needs into a virtual environment of its own (default
# build-deepspeed/venv, or $STRATA_DS_VENV; the same one bench/cpu_adam/deepspeed/setup.sh makes): PyTorch,
# numpy, ninja, transformers and DeepSpeed from PyPI. DeepSpeed compiles its ops (CPU Adam, async I/O for
# NVMe offload, the CPU accelerator's shared-memory collectives) from its own source with its own builder
# the first time compare.py uses them (a minute or more each; cached in ~/.cache/torch_extensions).
# Optional: only this head-to-head benchmark uses it; the project never needs it to build or test.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${STRATA_DS_VENV:-build-deepspeed/venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# DeepSpeed's setup imports torch, so torch goes first.
"$venv/bin/python" -m pip install --quiet torch numpy ninja transformers
"$venv/bin/python" -m pip install --quiet deepspeed
"$venv/bin/python" - <<'PY'
import torch, transformers, deepspeed
print(f"setup: torch {torch.__version__}, transformers {transformers.__version__}, deepspeed {deepspeed.__version__}")
PY

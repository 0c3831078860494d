#!/usr/bin/env bash
# Installs what bench/train/deepspeed/compare.py needs: bench/cpu_adam/deepspeed/setup.sh's virtual
# environment (default build-deepspeed/venv, or $STRATA_DS_VENV: PyTorch, numpy, ninja, DeepSpeed from
# PyPI) plus transformers. DeepSpeed compiles its ops (CPU Adam, async I/O for NVMe offload, the CPU
# accelerator's shared-memory collectives) with its own builder the first time compare.py uses them (a
# minute or more each; cached in ~/.cache/torch_extensions).
# Optional: only this head-to-head benchmark uses it; the project never needs it to build or test.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash bench/cpu_adam/deepspeed/setup.sh
venv="${STRATA_DS_VENV:-build-deepspeed/venv}"
"$venv/bin/python" -m pip install --quiet transformers
"$venv/bin/python" -c 'import transformers; print(f"setup: transformers {transformers.__version__}")'

#!/usr/bin/env bash
# Installs what bench/cpu_adam/deepspeed/compare.py needs into a virtual environment of its own
# (default build-deepspeed/venv, or $STRATA_DS_VENV): PyTorch, DeepSpeed and ninja from PyPI. DeepSpeed's
# CPU Adam is compiled from DeepSpeed's source by its own op builder (-march=native, OpenMP) the first time
# compare.py loads it. Optional: only the head-to-head benchmark uses it; the project does not.
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv="${STRATA_DS_VENV:-build-deepspeed/venv}"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup: creating $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# DeepSpeed's setup imports torch, so torch goes first.
"$venv/bin/python" -m pip install --quiet torch numpy ninja
"$venv/bin/python" -m pip install --quiet deepspeed
"$venv/bin/python" - <<'PY'
import torch, deepspeed
print(f"setup: torch {torch.__version__}, deepspeed {deepspeed.__version__}")
PY

#!/usr/bin/env bash
# Makes the optional interpreter that tests/python/test_torch_beside.py runs torch and transformers with
# (docs/python.md, "Beside PyTorch"): a venv over Debian's /usr/bin/python3 (the interpreter the extension
# is built for; --system-site-packages keeps its numpy and pytest) with PyPI's default Linux torch (a
# CUDA build: it brings its own NCCL, cuDNN and cuBLAS, the point of the test, and imports without a GPU)
# and transformers. About 3 GB to download; neither the build nor CI needs it.
#
# Usage: scripts/torch-venv.sh [DIR]      (default /work/venv-torch), then
#   STRATA_TORCH_PYTHON=DIR/bin/python ctest --test-dir build -R python_test_torch_beside --output-on-failure
set -euo pipefail
dir="${1:-/work/venv-torch}"
if [ ! -x "$dir/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$dir"
fi
"$dir/bin/pip" install --progress-bar off torch transformers
"$dir/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "torch-venv: STRATA_TORCH_PYTHON=$dir/bin/python"

#!/usr/bin/env bash
# Installs every Debian package Strata's build, tests and benchmarks need. Idempotent and
# non-interactive: packages already present are skipped, and apt is only touched when one is missing.
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is expected at /usr/local/cuda; without it the build is CPU-only.
# Then fetches the cuDNN frontend's C++ headers (header-only, pinned below) into deps/cudnn-frontend/ for
# kernels/cuda/attention_cudnn.cpp; when that download fails (offline) the build goes on without the
# cuDNN attention path (cmake/StrataCudnn.cmake says so) and attention runs on kernels/cuda's own kernel.
# Last makes deps/pyenv/, a Python venv holding Hugging Face `tokenizers`, `transformers` and `jinja2`
# (pinned below) for scripts/tokenize_text.py (docs/train.md); offline, it warns and the script still succeeds.
# Usage: scripts/install-deps.sh                    packages, the cuDNN frontend headers, the venv
#        scripts/install-deps.sh --cudnn-frontend   only the headers (no apt, no sudo)
#        scripts/install-deps.sh --python           only the venv (no apt, no sudo)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The cuDNN frontend, from NVIDIA's nvidia-cudnn-frontend wheel on PyPI: the wheel carries the headers
# under include/. Pinned by version and by the sha256 of one build of it (cp311, manylinux_2_28 x86_64,
# fetched whatever the host's Python is; only its headers are used). To move the pin, change both and
# run this again.
cudnn_fe_version=1.32.0
cudnn_fe_sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
cudnn_fe_dir=$root/deps/cudnn-frontend  # ignored by git (.gitignore: /deps/)

# Never fails the script: on any error it says why and that the build will use the fallback.
fetch_cudnn_frontend() {
  local stamp="$cudnn_fe_dir/VERSION"
  if [ -f "$cudnn_fe_dir/include/cudnn_frontend.h" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$cudnn_fe_version" ]; then
    echo "install-deps: cuDNN frontend $cudnn_fe_version present in $cudnn_fe_dir"
    return 0
  fi
  local py tmp wheel
  py=$(command -v python3 || true)
  if [ -z "$py" ] || ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "install-deps: WARNING: no python3 with pip; the cuDNN frontend headers were not fetched, so the" \
         "build uses kernels/cuda's own attention (install python3-pip and run $0 --cudnn-frontend)"
    return 0
  fi
  tmp=$(mktemp -d)
  echo "install-deps: fetching nvidia-cudnn-frontend==$cudnn_fe_version (headers only) into $cudnn_fe_dir"
  if ! "$py" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
         --python-version 3.11 --implementation cp --dest "$tmp" "nvidia-cudnn-frontend==$cudnn_fe_version"; then
    echo "install-deps: WARNING: pip download of nvidia-cudnn-frontend==$cudnn_fe_version failed (offline?);" \
         "the build uses kernels/cuda's own attention. Run $0 --cudnn-frontend once online."
    rm -rf "$tmp"
    return 0
  fi
  wheel=$(ls "$tmp"/nvidia_cudnn_frontend-"$cudnn_fe_version"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$wheel" ] || [ "$(sha256sum "$wheel" | cut -d' ' -f1)" != "$cudnn_fe_sha256" ]; then
    echo "install-deps: WARNING: the downloaded wheel ${wheel:-(none)} does not have the pinned sha256" \
         "$cudnn_fe_sha256; not installed, the build uses kernels/cuda's own attention"
    rm -rf "$tmp"
    return 0
  fi
  rm -rf "$cudnn_fe_dir"
  mkdir -p "$cudnn_fe_dir"
  # The wheel is a zip; keep its include/ tree and its licenses only.
  if ! "$py" - "$wheel" "$cudnn_fe_dir" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/") or "/licenses/" in n]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit("include/cudnn_frontend.h is not in " + wheel)
    z.extractall(dest, names)
PY
  then
    echo "install-deps: WARNING: could not unpack $wheel; the build uses kernels/cuda's own attention"
    rm -rf "$tmp" "$cudnn_fe_dir"
    return 0
  fi
  echo "$cudnn_fe_version" >"$stamp"
  rm -rf "$tmp"
  echo "install-deps: cuDNN frontend $cudnn_fe_version headers in $cudnn_fe_dir/include"
}

# Hugging Face `tokenizers` for scripts/tokenize_text.py, in a venv of its own made with the system python3
# (the host's Python is left alone); `transformers` and `jinja2` for its --chat mode (the model's own chat
# template, rendered by apply_chat_template). tests/model's tokenize test runs with this venv's python3 when
# it exists at configure time. To move a pin, change it and run this again; transformers 5.24.0 requires
# tokenizers >=0.23.1,<0.24.
tokenizers_version=0.23.3
transformers_version=5.24.0
jinja2_version=3.1.6
pyenv_dir=$root/deps/pyenv  # ignored by git (.gitignore: /deps/)

# Never fails the script: on any error it says why; only scripts/tokenize_text.py and its test need the venv.
make_pyenv() {
  local py=$pyenv_dir/bin/python3
  local have
  local want="$tokenizers_version $transformers_version $jinja2_version"
  have=$("$py" -c 'import tokenizers, transformers, jinja2
print(tokenizers.__version__, transformers.__version__, jinja2.__version__)' 2>/dev/null || true)
  if [ "$have" = "$want" ]; then
    echo "install-deps: tokenizers $tokenizers_version, transformers $transformers_version and jinja2" \
         "$jinja2_version present in $pyenv_dir"
    return 0
  fi
  if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "install-deps: WARNING: no python3 with the venv module; $pyenv_dir was not made, so" \
         "scripts/tokenize_text.py cannot run (install python3-venv and run $0 --python)"
    return 0
  fi
  if [ ! -x "$py" ] && ! python3 -m venv "$pyenv_dir"; then
    echo "install-deps: WARNING: python3 -m venv $pyenv_dir failed; scripts/tokenize_text.py cannot run" \
         "(install python3-venv and run $0 --python)"
    rm -rf "$pyenv_dir"
    return 0
  fi
  local pins=("tokenizers==$tokenizers_version" "transformers==$transformers_version" "jinja2==$jinja2_version")
  echo "install-deps: installing ${pins[*]} into $pyenv_dir"
  if ! "$py" -m pip install --quiet --disable-pip-version-check "${pins[@]}"; then
    echo "install-deps: WARNING: pip install ${pins[*]} failed (offline?); scripts/tokenize_text.py" \
         "cannot run (or cannot run --chat) and its test is skipped (or its --chat checks). Run $0 --python" \
         "once online."
    return 0
  fi
  echo "install-deps: ${pins[*]} in $pyenv_dir (scripts/tokenize_text.py runs with $py)"
}

if [ "${1:-}" = "--cudnn-frontend" ]; then
  fetch_cudnn_frontend
  exit 0
fi
if [ "${1:-}" = "--python" ]; then
  make_pyenv
  exit 0
fi

packages=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libaio-dev libhwloc-dev libtbb-dev libhwy-dev
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  libdnnl-dev  # oneDNN: bf16 matrix products on the host backend (kernels/cpu/linear_bf16.cpp)
  fio
  tmux  # tests/tools/config_wizard_test.sh drives `strata config new` in a terminal
  chromium
  clang libclang-rt-14-dev  # scripts/ci-sanitize.sh: the fuzz targets (libFuzzer needs clang and its runtime)
  debootstrap  # scripts/bundle-rehearsal.sh: the bare root file system the GPU archive is rehearsed in
  python3-dev pybind11-dev libdlpack-dev python3-numpy python3-pytest  # the Python package and its tests
  patchelf  # the Python package: private copies of the CUDA libraries beside torch (python/private_cuda_libs.py)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

fetch_cudnn_frontend
make_pyenv

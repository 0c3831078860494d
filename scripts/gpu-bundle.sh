#!/usr/bin/env bash
# Builds Strata here (cuda backend on) and gathers what a GPU machine needs to run the tests and
# benchmarks into one folder: the executables, the non-system shared libraries they load (hwloc, oneTBB,
# Highway, liburing, OpenBLAS, OpenMPI, ...), the test fixtures, and run.sh. The GPU machine needs only
# the CUDA driver and a CUDA 13 runtime, cuBLAS, NCCL, NVRTC and cuDNN 9 (from /usr/local/cuda or the
# nvidia-* Python wheels); those are too large to carry and are found there. See docs/gpu-bundle.md.
#
# Usage: scripts/gpu-bundle.sh [OUT_DIR]     (default: bundle/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bundle}
build=${BUILD_DIR:-$root/build-gpu}

# The cuDNN frontend headers for the cuDNN attention path (a no-op once fetched; offline, the bundle is
# built without that path and cmake says so).
bash "$root/scripts/install-deps.sh" --cudnn-frontend
BUILD_DIR=$build bash "$root/scripts/build.sh" -DSTRATA_CUDA=ON
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"

# Executables: every test and bench binary, and the strata tool.
mapfile -t exes < <(find "$build/tests" "$build/bench" "$build/tools" -type f -perm -u+x \
                    ! -name '*.so*' ! -path '*/CMakeFiles/*' 2>/dev/null | sort)
for e in "${exes[@]}"; do
  if file -b "$e" | grep -q ELF; then cp "$e" "$out/bin/"; fi
done

# Shared libraries: everything ldd resolves, except the C runtime (present on any Linux) and the CUDA
# libraries (driver, runtime, cuBLAS, NCCL, NVRTC, cuDNN: found on the GPU machine; cuBLASLt alone is
# ~500 MiB, cuDNN's engines as much). cuDNN's small dispatcher library (libcudnn.so.9) goes to
# lib-fallback/, last on run.sh's search path: the machine's own cuDNN wins, and where it has none the
# binaries still start, cuDNN fails to load its engines and attention falls back to kernels/cuda's kernel
# (the cuDNN attention tests then fail, saying so).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libnvidia|libnvrtc|libcudnn)'
mkdir -p "$out/lib-fallback"
for e in "$out"/bin/*; do
  ldd "$e" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ $name =~ ^libcudnn\.so ]]; then
      [ -e "$out/lib-fallback/$name" ] || cp -L "$path" "$out/lib-fallback/$name"
    elif ! [[ $name =~ $skip ]] && [ ! -e "$out/lib/$name" ]; then
      cp -L "$path" "$out/lib/$name"
    fi
  done
done

# Test data the binaries read at run time.
for d in tests/config/fixtures docs configs; do
  if [ -d "$root/$d" ]; then mkdir -p "$out/src/$d" && cp -r "$root/$d/." "$out/src/$d/"; fi
done

# A tiny probe run.sh starts with: the CUDA driver and runtime versions and the devices, as CUDA sees them
# (cudart linked statically, so it runs whatever runtime the machine has).
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
cat > "$build/cuda_probe.cpp" <<'PROBE'
// Prints the CUDA driver and runtime versions and the visible devices; exit 1 when no device is usable.
#include <cuda_runtime.h>
#include <cstdio>
int main() {
  int driver = 0, runtime = 0, n = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("cuda driver API %d.%d, runtime (bundled build) %d.%d\n", driver / 1000, driver % 1000 / 10,
              runtime / 1000, runtime % 1000 / 10);
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    std::printf("cudaGetDeviceCount: %s\n", cudaGetErrorString(e));
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) == cudaSuccess)
      std::printf("device %d: %s, compute capability %d.%d, %.1f GiB\n", i, p.name, p.major, p.minor,
                  double(p.totalGlobalMem) / (1u << 30));
  }
  return n > 0 ? 0 : 1;
}
PROBE
g++ -std=c++17 -O2 -I"$cuda_home/include" "$build/cuda_probe.cpp" -o "$out/bin/cuda_probe" \
  -L"$cuda_home/lib64" -lcudart_static -ldl -lpthread -lrt

cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test binary (or the command given) on this machine with the bundled libraries, then
# prints a pass/fail table. Exits non-zero when a test binary fails or when no CUDA test actually ran
# (every cuda test skipped: no GPU, or a driver too old for the CUDA 13 runtime). See docs/gpu-bundle.md.
# CUDA 13 runtime, cuBLAS, NCCL, NVRTC and cuDNN 9 come from /usr/local/cuda or the nvidia-* Python wheels.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cudalibs=/usr/local/cuda/lib64
py=$(command -v python3 || true)
if [ -n "$py" ]; then
  wheels=$("$py" - <<'PY' 2>/dev/null
import glob, os, site
paths = []
for s in site.getsitepackages():
    paths += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
    paths += glob.glob(os.path.join(s, "nvidia", "cu13", "lib"))
print(":".join(sorted(set(paths))))
PY
)
  cudalibs="$cudalibs:$wheels"
fi
# lib-fallback/ last: cuDNN's dispatcher, used only where the machine has no cuDNN 9 of its own.
export LD_LIBRARY_PATH="$here/lib:$cudalibs:${LD_LIBRARY_PATH:-}:$here/lib-fallback"
export STRATA_SOURCE_DIR="$here/src"
export STRATA_TEST_TMPDIR=${STRATA_TEST_TMPDIR:-/tmp/strata-test}
mkdir -p "$STRATA_TEST_TMPDIR"
if [ $# -gt 0 ]; then exec "$@"; fi

echo "=== NVIDIA driver"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
else
  echo "nvidia-smi not found"
fi
"$here/bin/cuda_probe" || echo "cuda_probe: no usable CUDA device (a CUDA 13 build needs driver >= 580)"
echo "=== strata report"
"$here/bin/strata" report --nvme-path "$STRATA_TEST_TMPDIR"

logs="$STRATA_TEST_TMPDIR/gpu-bundle-logs"
mkdir -p "$logs"
rows=()
fails=0
cuda_ran=0
# n of "[  WORD ] n tests" in a gtest log, 0 when absent.
count() { sed -n "s/^\[ *$1 *\] \([0-9][0-9]*\) tests\{0,1\}[,.].*/\1/p" "$2" | head -1 | grep . || echo 0; }
for t in "$here"/bin/test_*; do
  name=$(basename "$t")
  log="$logs/$name.log"
  echo "=== $name (log: $log)"
  "$t" >"$log" 2>&1
  rc=$?
  grep -E '^\[  FAILED  \] .*\(' "$log" || true
  passed=$(count PASSED "$log")
  failed=$(count FAILED "$log")
  skipped=$(count SKIPPED "$log")
  # CUDA tests that ran (passed or failed): their names say Cuda or cuda (suite, test or parameter).
  cuda=$(grep -cE '^\[ +(OK|FAILED) +\] [^ ]*[Cc]uda[^ ]* \(' "$log")
  cuda_ran=$((cuda_ran + cuda))
  result=pass
  if [ $rc -ne 0 ]; then result="FAIL (exit $rc)"; fails=$((fails + 1)); fi
  rows+=("$(printf '%-28s %7s %7s %8s %10s  %s' "$name" "$passed" "$failed" "$skipped" "$cuda" "$result")")
done

echo
echo "=== summary"
printf '%-28s %7s %7s %8s %10s  %s\n' binary passed failed skipped "cuda ran" result
for r in "${rows[@]}"; do echo "$r"; done
status=0
if [ $fails -gt 0 ]; then
  echo "FAIL: $fails test binaries failed (logs in $logs)"
  status=1
fi
if [ $cuda_ran -eq 0 ]; then
  echo "FAIL: no CUDA test ran: every cuda test was skipped. Reason given by the tests:"
  grep -h -m1 -E 'no CUDA GPU visible|cudaGetDeviceCount' "$logs"/*.log | sort -u | head -3
  echo "(a CUDA 13 build needs an NVIDIA driver >= 580; see the driver version above)"
  status=1
fi
[ $status -eq 0 ] && echo "PASS: every test binary passed; $cuda_ran CUDA tests ran"
exit $status
RUN
chmod +x "$out/run.sh"
du -sh "$out"
echo "bundle ready: $out (carry it to the GPU machine and run $out/run.sh)"

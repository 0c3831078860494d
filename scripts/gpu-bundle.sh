#!/usr/bin/env bash
# Builds Strata here (cuda backend on) and gathers what a GPU machine needs to run the tests and
# benchmarks into one folder: the executables, the non-system shared libraries they load (hwloc, oneTBB,
# Highway, liburing, OpenBLAS, OpenMPI, ...), the test fixtures, and run.sh. The GPU machine needs only
# the CUDA driver and a CUDA 13 runtime, cuBLAS and NCCL (from /usr/local/cuda or the nvidia-* Python
# wheels); those are too large to carry and are found there. See docs/gpu-bundle.md.
#
# Usage: scripts/gpu-bundle.sh [OUT_DIR]     (default: bundle/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bundle}
build=${BUILD_DIR:-$root/build-gpu}

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
# libraries (driver, runtime, cuBLAS, NCCL: found on the GPU machine; cuBLASLt alone is ~500 MiB).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libnvidia)'
for e in "$out"/bin/*; do
  ldd "$e" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]] && [ ! -e "$out/lib/$name" ]; then cp -L "$path" "$out/lib/$name"; fi
  done
done

# Test data the binaries read at run time.
for d in tests/config/fixtures docs configs; do
  if [ -d "$root/$d" ]; then mkdir -p "$out/src/$d" && cp -r "$root/$d/." "$out/src/$d/"; fi
done

cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs every bundled test binary (or the command given) on this machine with the bundled libraries.
# CUDA 13 runtime, cuBLAS and NCCL come from /usr/local/cuda or the nvidia-* Python wheels.
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
export LD_LIBRARY_PATH="$here/lib:$cudalibs:${LD_LIBRARY_PATH:-}"
export STRATA_SOURCE_DIR="$here/src"
export STRATA_TEST_TMPDIR=${STRATA_TEST_TMPDIR:-/tmp/strata-test}
mkdir -p "$STRATA_TEST_TMPDIR"
if [ $# -gt 0 ]; then exec "$@"; fi
"$here/bin/strata" report --nvme-path "$STRATA_TEST_TMPDIR"
fails=0
for t in "$here"/bin/test_*; do
  echo "=== $(basename "$t")"
  "$t" --gtest_brief=1 || fails=$((fails + 1))
done
echo "test binaries failed: $fails"
exit $fails
RUN
chmod +x "$out/run.sh"
du -sh "$out"
echo "bundle ready: $out (carry it to the GPU machine and run $out/run.sh)"

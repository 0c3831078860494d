#!/usr/bin/env bash
# Builds Strata with the cuda backend and packs what a GPU machine needs to run the tests, the training
# runs and the benchmarks into ONE archive of at most 48 MiB: the executables (stripped), the non-system
# shared libraries they load (hwloc, oneTBB, Highway, liburing, libaio, libevent, OpenBLAS, oneDNN,
# OpenMPI, ...), the data the tests read, and run.sh (scripts/bundle-run.sh). The GPU machine needs the
# NVIDIA driver and CUDA 13's runtime, cuBLAS, NVRTC, NCCL and cuDNN 9, from /usr/local/cuda or the
# nvidia-* Python wheels: those are too large to carry, and run.sh finds them. See docs/gpu-bundle.md.
#
# Packing needs no network: everything carried comes from the build and this machine's installed
# packages. (scripts/build.sh, run when BUILD_DIR is not configured yet, installs packages first.)
#
# Usage: scripts/gpu-bundle.sh [ARCHIVE]          (default: bundle/strata-gpu.tar.xz)
#
# BUILD_DIR: the build folder (default build-gpu/, configured here with -DSTRATA_CUDA=ON on first use). A
# folder that is already configured, such as build/ (scripts/build.sh: the cuda backend when nvcc is
# found), is built as it is configured, and must have the cuda backend.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archive=${1:-$root/bundle/strata-gpu.tar.xz}
build=${BUILD_DIR:-$root/build-gpu}
jobs=${JOBS:-$(nproc)}
limit_mib=48
# The newest glibc the bundle may need: the GPU machine's (its image is Ubuntu 24.04-based).
floor_max=2.39

if [ -f "$build/CMakeCache.txt" ]; then
  cmake --build "$build" --parallel "$jobs"
else
  # The Python package is not part of the bundle.
  BUILD_DIR=$build bash "$root/scripts/build.sh" -DSTRATA_CUDA=ON -DSTRATA_PYTHON=OFF
fi
if ! readelf -d "$build/tools/strata" | grep -q 'libcudart'; then
  echo "gpu-bundle: $build was built without the cuda backend (no nvcc when it was configured?);" \
    "configure it with -DSTRATA_CUDA=ON or use another BUILD_DIR" >&2
  exit 1
fi
# The cuDNN attention path is built when configure found the cuDNN frontend headers (deps/, fetched by
# scripts/install-deps.sh --cudnn-frontend, never at packing time); without it the cuDNN tests skip
# saying so, which run.sh accepts.
if readelf -d "$build/tools/strata" | grep -q 'libcudnn'; then
  echo "gpu-bundle: built with the cuDNN attention path"
else
  echo "gpu-bundle: built WITHOUT the cuDNN attention path (no cuDNN frontend headers when $build was" \
    "configured: run scripts/install-deps.sh --cudnn-frontend once online, then reconfigure)"
fi

stage=$build/bundle-stage
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback" "$stage/src"

# --- executables ---------------------------------------------------------------------------------------------
# Every test binary, every benchmark, strata and memprof. Left out: the helpers that only run as ranks
# under mpirun (the bundle has no MPI launcher; docs/gpu-bundle.md) and the docs generator.
leave_out=' comm_abort_helper ranks_failure strata_config_doc '
while IFS= read -r e; do
  name=$(basename "$e")
  [[ $leave_out == *" $name "* ]] && continue
  [ "$(head -c 4 "$e" | tail -c 3)" = ELF ] || continue  # executables, not scripts
  cp "$e" "$stage/bin/$name"
done < <(find "$build/tests" "$build/bench" "$build/tools" -type f -perm -u+x ! -name '*.so*' \
           ! -path '*/CMakeFiles/*' 2>/dev/null | sort)

# A tiny probe run.sh starts with: the CUDA driver and runtime versions and the devices, as CUDA sees
# them (cudart linked statically, so it runs whatever runtime the machine has).
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")}
cat >"$build/cuda_probe.cpp" <<'PROBE'
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
g++ -std=c++17 -O2 -I"$cuda_home/include" "$build/cuda_probe.cpp" -o "$stage/bin/cuda_probe" \
  -L"$cuda_home/lib64" -lcudart_static -ldl -lpthread -lrt

# --- shared libraries ----------------------------------------------------------------------------------------
# Everything ldd resolves, except the C library (every Linux has one), the C++ runtime (libstdc++,
# libgcc_s: any machine that runs PyTorch has its own, as new or newer; run.sh checks that it has the
# GLIBCXX_ version the binaries need) and the CUDA libraries (the GPU machine's:
# cuBLASLt alone is ~500 MiB, cuDNN's engines as much). cuDNN's small dispatcher, libcudnn.so.9, goes to
# lib-fallback/, last on run.sh's search path: the machine's own cuDNN wins; where it has none the
# binaries still start and the cuDNN attention tests fail saying why.
system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil\.so|libresolv|libstdc\+\+|libgcc_s)'
cuda='^(libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libnvidia|libnvrtc|libcudnn)'
for e in "$stage"/bin/*; do
  ldd "$e" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    if [[ $name =~ ^libcudnn\.so ]]; then
      [ -e "$stage/lib-fallback/$name" ] || cp -L "$path" "$stage/lib-fallback/$name"
    elif ! [[ $name =~ $system || $name =~ $cuda ]] && [ ! -e "$stage/lib/$name" ]; then
      cp -L "$path" "$stage/lib/$name"
    fi
  done
done
chmod -R u+w "$stage"

# --- the glibc floor -----------------------------------------------------------------------------------------
# Note [glibc floor]: the newest GLIBC_ symbol version anything carried needs (objdump -T) is the oldest
# glibc the bundle runs on. Built on Debian 12 the binaries need 2.34, and Debian 12's libevent (Open
# MPI's libopen-pal loads it) 2.36 (arc4random), so the floor is 2.36: Debian 12, Ubuntu 23.04 and
# later; the GPU machine's Ubuntu 24.04-based image has 2.39, and run.sh's libraries stage checks the
# machine's glibc against the floor anyway. Debian 11's build of the same libevent (glibc 2.25) would keep
# the floor at 2.34 for Ubuntu 22.04, but fetching it needs the network at packing time and fails once
# bullseye leaves the mirrors: everything carried comes from this machine's installed packages. A floor
# above floor_max fails the packing.
needs() { objdump -T "$2" 2>/dev/null | grep -o "$1_[0-9][0-9.]*" | sed "s/^$1_//" | sort -uV | tail -1; }
newest() { printf '%s\n' "$@" | grep . | sort -V | tail -1; }
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*
floor=0 floor_file='' bin_floor=0 glibcxx=0
for f in "$stage"/bin/* "$stage"/lib/* "$stage"/lib-fallback/*; do
  v=$(needs GLIBC "$f")
  if [ "$(newest "$floor" "$v")" != "$floor" ]; then floor=$v floor_file=$(basename "$f"); fi
  [[ $f == "$stage/bin/"* ]] && bin_floor=$(newest "$bin_floor" "$v")
  [[ $f == "$stage/lib-fallback/"* ]] || glibcxx=$(newest "$glibcxx" "$(needs GLIBCXX "$f")")
done
echo "gpu-bundle: glibc floor $floor (set by $floor_file; the binaries alone need $bin_floor); libstdc++ with GLIBCXX_$glibcxx"
if [ "$(newest "$floor" "$floor_max")" != "$floor_max" ]; then
  echo "gpu-bundle: the bundle would need glibc $floor ($floor_file), newer than the GPU machine's $floor_max" >&2
  exit 1
fi

# --- data, run.sh, manifest ----------------------------------------------------------------------------------
# What the tests read (tests/common/source_dir.h finds src/ beside bin/) and the text the training runs
# train on.
for d in configs docs tests/config/fixtures tests/reference/data; do
  mkdir -p "$stage/src/$d"
  cp -r "$root/$d/." "$stage/src/$d/"
done
cp "$root/README.md" "$stage/src/"
cp "$root/scripts/bundle-run.sh" "$stage/run.sh"
chmod +x "$stage/run.sh"

# manifest-needed.txt: each binary's CUDA libraries (run.sh: a binary built with cuDNN or NCCL must not
# skip those tests).
for e in "$stage"/bin/*; do
  echo "$(basename "$e"): $(readelf -d "$e" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
done >"$stage/manifest-needed.txt"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+changes"
cat >"$stage/manifest.env" <<EOF
bundle_commit=$commit
bundle_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
bundle_cuda=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
glibc_floor=$floor
glibc_floor_file=$floor_file
glibcxx_need=$glibcxx
EOF

# --- the archive ---------------------------------------------------------------------------------------------
# xz: every machine with tar has it. Files sorted by name, so the test binaries, which share most of their
# code, sit next to each other within the dictionary window. Blocks of 48 MiB compress on every core:
# 76 s for the 146 MiB here on 2 cores and 23.3 MiB, where one 192 MiB block took 3 minutes for 22.1 MiB.
mkdir -p "$(dirname "$archive")"
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -cf - . |
  xz -T0 --block-size=48MiB --lzma2=preset=9,dict=48MiB >"$archive.tmp"
mv "$archive.tmp" "$archive"
bytes=$(stat -c %s "$archive")
unpacked=$(du -sm "$stage" | cut -f1)
printf 'gpu-bundle: %s: %.1f MiB (limit %d MiB; %d MiB unpacked, %d files)\n' "$archive" \
  "$(awk -v b="$bytes" 'BEGIN {print b / 1048576}')" "$limit_mib" "$unpacked" "$(find "$stage" -type f | wc -l)"
if [ "$bytes" -gt $((limit_mib * 1024 * 1024)) ]; then
  echo "gpu-bundle: the archive is over $limit_mib MiB" >&2
  exit 1
fi
echo "gpu-bundle: on the GPU machine: mkdir -p /tmp/s && tar -xJf $(basename "$archive") -C /tmp/s && /tmp/s/run.sh --budget 480 OUTDIR" \
  "(docs/gpu-bundle.md)"

#!/usr/bin/env bash
# The GPU bundle rehearsed without a GPU (a CI stage: .ci/run). Packs the archive (scripts/gpu-bundle.sh),
# unpacks it into a minimal Debian root file system that holds none of Strata's libraries (debootstrap
# --variant=minbase bookworm, made once and kept in build-rehearsal/root), and runs it there as the GPU
# machine would, with `run.sh --host-only`: every host-backend test binary from the archive alone (cuda
# tests skip: no GPU), multi-rank ones only loaded (no MPI launcher), then short host `strata train` runs
# of the 10m preset with CPU and with NVMe offload. The CUDA toolkit's libraries are mounted read-only at
# /usr/local/cuda inside the root, where the GPU machine has them. docs/gpu-bundle.md, "Rehearsal".
#
# Usage: scripts/bundle-rehearsal.sh [ARCHIVE]
#   ARCHIVE given: rehearse that archive as it is. Otherwise pack build-rehearsal/strata-gpu.tar.xz from
#   BUILD_DIR (default: build/ when it is built with the cuda backend, as scripts/test.sh leaves it where
#   nvcc is present, so CI builds nothing twice; else build-gpu/).
# Needs root (chroot, mounts). DEBIAN_MIRROR: where debootstrap fetches from (default deb.debian.org).
# REHEARSAL_BUDGET: seconds run.sh may take in the root (default 2400).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build-rehearsal
sysroot=$work/root
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
budget=${REHEARSAL_BUDGET:-2400}
start=$SECONDS

if [ "$(id -u)" != 0 ]; then
  echo "bundle-rehearsal: needs root (debootstrap, chroot, mounts); run it with sudo" >&2
  exit 1
fi
mkdir -p "$work"

# --- the archive ---------------------------------------------------------------------------------------------
archive=${1:-}
if [ -z "$archive" ]; then
  build=${BUILD_DIR:-}
  if [ -z "$build" ]; then
    build=$root/build-gpu
    if [ -x "$root/build/tools/strata" ] && readelf -d "$root/build/tools/strata" | grep -q libcudart; then
      build=$root/build
    fi
  fi
  archive=$work/strata-gpu.tar.xz
  echo "bundle-rehearsal: packing $archive from $build"
  BUILD_DIR=$build bash "$root/scripts/gpu-bundle.sh" "$archive"
fi
archive=$(readlink -f "$archive")

# --- the root file system ------------------------------------------------------------------------------------
# Made once (a minute or two with the network), then reused; removing build-rehearsal/root makes it again.
if [ ! -x "$sysroot/bin/bash" ]; then
  if ! command -v debootstrap >/dev/null 2>&1; then
    echo "bundle-rehearsal: installing debootstrap"
    apt-get install -y -q debootstrap >/dev/null
  fi
  rm -rf "$sysroot.tmp"
  echo "bundle-rehearsal: debootstrap --variant=minbase bookworm $sysroot ($mirror)"
  debootstrap --variant=minbase bookworm "$sysroot.tmp" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    exit 1
  }
  mv "$sysroot.tmp" "$sysroot"
fi
# None of the libraries the archive carries may come from the root itself.
ours=$(find "$sysroot/usr/lib" "$sysroot/lib" -maxdepth 2 \( -name 'libtbb*' -o -name 'libhwloc*' -o \
  -name 'libhwy*' -o -name 'liburing*' -o -name 'libaio*' -o -name 'libopenblas*' -o -name 'libdnnl*' -o \
  -name 'libmpi*' -o -name 'libgtest*' \) 2>/dev/null | head -5)
if [ -n "$ours" ]; then
  echo "bundle-rehearsal: $sysroot is not bare, it holds: $ours (remove the folder to make it again)" >&2
  exit 1
fi

# --- the run -------------------------------------------------------------------------------------------------
rm -rf "$sysroot/opt/strata" "$sysroot/tmp/rehearsal-out"
mkdir -p "$sysroot/opt/strata" "$sysroot/tmp/rehearsal-out"
tar -xJf "$archive" -C "$sysroot/opt/strata"
echo "bundle-rehearsal: $(basename "$archive") ($(du -h "$archive" | cut -f1)) unpacked into $sysroot/opt/strata"

cuda=$(readlink -f /usr/local/cuda)
# A private mount and PID namespace: /proc, /sys, /dev/shm and the CUDA toolkit are mounted for this run
# only and go away with it, as do any processes it leaves.
set +e
# shellcheck disable=SC2016  # the inner bash expands them
unshare --mount --pid --fork --kill-child -- bash -euc '
  r=$1 cuda=$2 budget=$3
  mount --make-rprivate /
  mount -t proc proc "$r/proc"
  mount -t sysfs -o ro sysfs "$r/sys"
  mkdir -p "$r/dev/shm" "$r/usr/local/cuda"
  mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
  if [ -d "$cuda" ]; then mount --bind "$cuda" "$r/usr/local/cuda" && mount -o remount,bind,ro "$r/usr/local/cuda"; fi
  exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    /opt/strata/run.sh --host-only --budget "$budget" /tmp/rehearsal-out
' rehearsal "$sysroot" "$cuda" "$budget"
rc=$?
set -e
rm -rf "$work/out"
mv "$sysroot/tmp/rehearsal-out" "$work/out"
echo "bundle-rehearsal: results in $work/out (summary.txt, results.json, tests/); $((SECONDS - start)) s in all"
if [ $rc != 0 ]; then
  echo "bundle-rehearsal: FAILED (run.sh exited $rc)" >&2
  exit 1
fi
echo "bundle-rehearsal: PASS"

#!/usr/bin/env bash
# The GPU bundle rehearsed without a GPU (a CI stage: .ci/run). Packs the archive (scripts/gpu-bundle.sh),
# unpacks it into a minimal Debian root file system that holds none of Strata's libraries (debootstrap
# --variant=minbase bookworm, made once and kept in build-rehearsal/root), and runs run.sh's whole
# timeline there with --host-only, as the GPU machine would run it but on the host backend's stand-ins:
# every stage in the same order within its (host-only) deadline, the test stages running their binaries
# whole (cuda tests skip: no GPU; multi-rank ones only listed: no MPI launcher), the training runs, the
# bench and the library listing on the 10m preset. Then a short run without --host-only, which must stop
# cleanly at the probe (no GPU here). The CUDA toolkit's libraries are mounted read-only at
# /usr/local/cuda inside the root, where the GPU machine has them. docs/gpu-bundle.md, "Rehearsal".
#
# Fails when run.sh fails, when its OUTDIR lacks results.tar.gz or summary.txt or holds more than 8 files
# (what a GPU run brings back), when a stage of the timeline was skipped, stopped at its deadline or
# overran it, or when the run without --host-only does not fail at the probe with its results written.
#
# Usage: scripts/bundle-rehearsal.sh [ARCHIVE]
#   ARCHIVE given: rehearse that archive as it is. Otherwise pack build-rehearsal/strata-gpu.tar.xz from
#   BUILD_DIR (default: build/ when it is built with the cuda backend, as scripts/test.sh leaves it where
#   nvcc is present, so CI builds nothing twice; else build-gpu/).
# Needs root (chroot, mounts). DEBIAN_MIRROR: where debootstrap fetches from (default deb.debian.org).
# REHEARSAL_BUDGET: seconds run.sh --host-only may take in the root (default 1350: the sum of its
# host-only deadlines; today about 150 s here on 2 cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/build-rehearsal
sysroot=$work/root
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
budget=${REHEARSAL_BUDGET:-1350}
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

# --- the runs ------------------------------------------------------------------------------------------------
rm -rf "$sysroot/opt/strata" "$sysroot/tmp/rehearsal-out" "$sysroot/tmp/rehearsal-gpu-out"
mkdir -p "$sysroot/opt/strata"
tar -xJf "$archive" -C "$sysroot/opt/strata"
echo "bundle-rehearsal: $(basename "$archive") ($(du -h "$archive" | cut -f1)) unpacked into $sysroot/opt/strata"

cuda=$(readlink -f /usr/local/cuda)
# in_root SECONDS ARGS...: /opt/strata/run.sh ARGS in the root, stopped (SIGTERM: it packs what it has)
# after SECONDS, in a private mount and PID namespace: /proc, /sys, /dev/shm and the CUDA toolkit are
# mounted for this run only and go away with it, as do any processes it leaves. A clean environment, as
# on a machine that knows nothing of Strata.
in_root() {
  # shellcheck disable=SC2016  # the inner bash expands them
  unshare --mount --pid --fork --kill-child -- bash -euc '
    r=$1 cuda=$2 secs=$3
    shift 3
    mount --make-rprivate /
    mount -t proc proc "$r/proc"
    mount -t sysfs -o ro sysfs "$r/sys"
    mkdir -p "$r/dev/shm" "$r/usr/local/cuda"
    mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
    if [ -d "$cuda" ]; then mount --bind "$cuda" "$r/usr/local/cuda" && mount -o remount,bind,ro "$r/usr/local/cuda"; fi
    exec timeout -k 15 "$secs" chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
      LANG=C.UTF-8 /opt/strata/run.sh "$@"
  ' rehearsal "$sysroot" "$cuda" "$@"
}

problems=()
# check_outdir DIR: what a GPU run brings back: the archive and summary.txt, at most 8 files.
check_outdir() {
  local dir=$1 n
  [ -s "$dir/results.tar.gz" ] || problems+=("$dir has no results.tar.gz")
  [ -s "$dir/summary.txt" ] || problems+=("$dir has no summary.txt")
  n=$(find "$dir" -type f | wc -l)
  [ "$n" -le 8 ] || problems+=("$dir holds $n files; a GPU run brings back at most 8")
}

# 1. The whole timeline, host only, within its deadlines.
t0=$SECONDS
set +e
in_root $((budget + 60)) --host-only --budget "$budget" /tmp/rehearsal-out | sed -u 's/^/  /'
rc=${PIPESTATUS[0]}
set -e
host_secs=$((SECONDS - t0))
out=$sysroot/tmp/rehearsal-out
check_outdir "$out"
[ "$rc" = 0 ] || problems+=("run.sh --host-only exited $rc")
if [ -f "$out/results.json" ]; then
  for s in libraries probe report kernel-tests train-cpu engine-tests train-nvme bench; do
    line=$(grep "\"name\": \"$s\"" "$out/results.json" || true)
    if [ -z "$line" ]; then problems+=("stage $s did not run"); continue; fi
    case $line in
      *'"status": "skipped"'* | *'"status": "deadline"'*) problems+=("stage ${line#*\"name\": }") ;;
    esac
    case $line in *'"overran": true'*) problems+=("stage $s overran its deadline: $line") ;; esac
  done
else
  problems+=("$out has no results.json")
fi

# 2. Without --host-only on a machine with no GPU: fails at the probe, quickly, results written.
t0=$SECONDS
set +e
in_root 120 --budget 90 /tmp/rehearsal-gpu-out >"$work/gpu-mode.log" 2>&1
rc=$?
set -e
gpu_secs=$((SECONDS - t0))
check_outdir "$sysroot/tmp/rehearsal-gpu-out"
[ "$rc" = 1 ] || problems+=("run.sh without --host-only and no GPU exited $rc, not 1 (build-rehearsal/gpu-mode.log)")
grep -q '^FAIL: probe: no usable CUDA device' "$sysroot/tmp/rehearsal-gpu-out/summary.txt" 2>/dev/null ||
  problems+=("run.sh without --host-only and no GPU did not fail at the probe (build-rehearsal/gpu-mode.log)")

# The outputs, the archive unpacked beside them.
rm -rf "$work/out" "$work/gpu-out"
[ ! -d "$out" ] || mv "$out" "$work/out"
[ ! -d "$sysroot/tmp/rehearsal-gpu-out" ] || mv "$sysroot/tmp/rehearsal-gpu-out" "$work/gpu-out"
[ ! -f "$work/out/results.tar.gz" ] || tar -xzf "$work/out/results.tar.gz" -C "$work/out"
echo "bundle-rehearsal: host-only timeline $host_secs s, GPU mode without a GPU $gpu_secs s, $((SECONDS - start)) s in all;" \
  "results in $work/out (summary.txt, results.json, results.tar.gz unpacked in strata-results/)"
if [ ${#problems[@]} -gt 0 ]; then
  printf 'bundle-rehearsal: FAILED: %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "bundle-rehearsal: PASS"

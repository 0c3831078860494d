#!/usr/bin/env bash
# `strata train --save` onto a file system too small for the run's checkpoint fails before the first
# step, naming both sizes. The small file system is a 256 KiB tmpfs; where mounting one is not allowed
# (not root, or a container without the capability) the test is skipped (exit 77) with that reason.
# usage: save_space_test.sh STRATA CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
mkdir -p "$dir"
if ! mount -t tmpfs -o size=256k tmpfs "$dir" 2>"$dir.why"; then
  echo "SKIP: cannot mount a small tmpfs here: $(cat "$dir.why")"
  exit 77
fi
trap 'umount "$dir"' EXIT
out=$("$strata" train --config "$config" --model 10m --text "$text" --seq-len 64 --steps 2 \
  --save "$dir/ckpt" --no-progress 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: the run was accepted"; exit 1; }
if echo "$out" | grep -q '^step '; then echo "FAIL: a step ran before the refusal"; exit 1; fi
echo "$out" | grep -q 'a checkpoint of this run takes .* and the file system has .* free' ||
  { echo "FAIL: the message does not name the sizes"; exit 1; }
echo "PASS: refused before training"

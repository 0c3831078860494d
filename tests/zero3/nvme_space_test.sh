#!/usr/bin/env bash
# `strata train` with an nvme_path on a file system too small for the swap file fails before the first
# step, and its message says what the bytes are: the working parameters, the master weights, optimizer
# states and gradients, and the room on top. The small file system is a 1 MiB tmpfs; where mounting one is not allowed
# the test is skipped (exit 77) with that reason.
# usage: nvme_space_test.sh STRATA NVME_CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir/nvme"
if ! mount -t tmpfs -o size=1m tmpfs "$dir/nvme" 2>"$dir/why"; then
  echo "SKIP: cannot mount a small tmpfs here: $(cat "$dir/why")"
  exit 77
fi
trap 'umount "$dir/nvme"' EXIT
sed -e "s#/local_nvme#$dir/nvme#g" -e "s#\"gradient_accumulation_steps\": 16#\"gradient_accumulation_steps\": 1#" "$config" >"$dir/config.json"
out=$("$strata" train --config "$dir/config.json" --backend host --model tiny \
  --text "$text" --seq-len 32 --steps 2 --no-progress 2>&1)
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || { echo "FAIL: the run was accepted"; exit 1; }
if echo "$out" | grep -q '^step '; then echo "FAIL: a step ran before the refusal"; exit 1; fi
echo "$out" | grep -Eq 'needs .* \(.* of bf16 working parameters \(offload_param\) and .* of fp32 master weights, 2 optimizer states and gradients \(offload_optimizer, 16 bytes a parameter; strata.nvme_gradients false keeps the gradients in host memory\), plus .* of room' ||
  { echo "FAIL: the message does not say what the bytes are"; exit 1; }
echo "$out" | grep -q 'the file system has only .* free' || { echo "FAIL: the free space is not named"; exit 1; }
echo "PASS: refused before training, the bytes explained"

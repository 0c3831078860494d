#!/usr/bin/env bash
# strata train --epochs E: the run's length in optimizer steps, counted as transformers' Trainer does
# (docs/train.md), is the schedule's total where the config leaves it to the run ("auto"), and a resumed
# run trains the steps left. Usage: epochs_test.sh STRATA CONFIG WORKDIR
set -euo pipefail
strata=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# 20 samples of 64 tokens (+1): byte tokens, so 1281 bytes.
head -c 1281 /dev/zero | tr '\0' 'a' > "$work/text.txt"
run() { "$strata" train --config "$config" --model tiny --text "$work/text.txt" --seq-len 64 --no-progress "$@" 2>&1; }
out=$(run --epochs 2 --save "$work/ckpt")
grep -q "config: scheduler.params.total_num_steps = 10: the run's length, --epochs 2" <<<"$out" ||
  { echo "FAIL: the schedule's total is not 10 steps"; echo "$out"; exit 1; }
grep -q "summary: 10 steps" <<<"$out" || { echo "FAIL: 2 epochs did not train 10 steps"; echo "$out"; exit 1; }
out=$(run --epochs 3 --load "$work/ckpt")
grep -q "5 steps from step 10" <<<"$out" || { echo "FAIL: --epochs 3 after step 10 does not train 5"; echo "$out"; exit 1; }
grep -q "summary: 5 steps" <<<"$out" || { echo "FAIL: the resumed run did not train 5 steps"; echo "$out"; exit 1; }
echo "PASS: --epochs sets the run's length"

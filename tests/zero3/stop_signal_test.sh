#!/usr/bin/env bash
# SIGTERM during `strata train --save` (what a preemptible machine sends): the step in progress finishes,
# a checkpoint is saved, the run exits 143, and the checkpoint loads. No timing: the signal is sent once
# the first step line is out.
# usage: stop_signal_test.sh STRATA CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir"
"$strata" train --config "$config" --model tiny --text "$text" --seq-len 32 --steps 1000000 \
  --save "$dir/ckpt" --no-progress >"$dir/log" 2>&1 &
pid=$!
until grep -q '^step 1/' "$dir/log"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$dir/log"
    echo "FAIL: the run ended before its first step"
    exit 1
  fi
  sleep 0.05
done
kill -TERM "$pid"
wait "$pid"
rc=$?
cat "$dir/log"
echo "exit status $rc"
[ "$rc" -eq 143 ] || { echo "FAIL: expected exit status 143 (128 + SIGTERM)"; exit 1; }
[ -f "$dir/ckpt/latest" ] || { echo "FAIL: no checkpoint was saved"; exit 1; }
if ls -d "$dir"/ckpt/*.tmp 2>/dev/null; then echo "FAIL: a partial checkpoint was left"; exit 1; fi
"$strata" train --config "$config" --model tiny --text "$text" --seq-len 32 --steps 1 --load "$dir/ckpt" \
  --no-progress || { echo "FAIL: the checkpoint does not load"; exit 1; }
echo "PASS: stopped by SIGTERM with a loadable checkpoint"

#!/usr/bin/env bash
# One command line for a preemptible job's first start and its restarts (Note [Resuming from nothing] in
# tools/cmd_train.cpp): `--load DIR --save DIR --max-steps N` on a DIR with no checkpoint yet starts fresh
# saying so; run again after an interruption it resumes and trains only the steps left to N; at N it
# trains nothing. With checkpoint.keep_last 1 and --save-interval 1 only the newest checkpoint stays.
# usage: restartable_run_test.sh STRATA CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }
python3 - "$config" "$dir/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["checkpoint"] = {"keep_last": 1}
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
run() {
  "$strata" train --config "$dir/config.json" --model tiny --text "$text" --seq-len 32 --no-progress \
    --load "$dir/ckpt" --save "$dir/ckpt" --save-interval 1 --max-steps "$1" >"$dir/$2.log" 2>&1 ||
    { cat "$dir/$2.log"; fail "run $2 failed"; }
  cat "$dir/$2.log"
}
run 2 first
grep -q "holds no checkpoint yet: starting fresh" "$dir/first.log" || fail "the first start does not say it starts fresh"
grep -q "2 steps from step 0" "$dir/first.log" || fail "the first start does not train steps 1-2"
run 5 restart
grep -q "3 steps from step 2" "$dir/restart.log" || fail "the restart does not train the 3 steps left to 5"
[ "$(ls "$dir/ckpt")" = "$(printf 'global_step5\nlatest')" ] ||
  fail "checkpoint.keep_last 1 left: $(ls "$dir/ckpt" | tr '\n' ' ')"
run 5 done
grep -q "nothing left to train" "$dir/done.log" || fail "a run already at --max-steps does not say so"
grep -q "0 steps from step 5" "$dir/done.log" || fail "a run already at --max-steps trained"
echo "PASS: one command line starts, resumes and finishes the run"

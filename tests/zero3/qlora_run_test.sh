#!/usr/bin/env bash
# QLoRA from the command line (docs/train.md, "Adapters (LoRA)", the NF4 base): configs/qlora.json over a
# base read from files trains, saves (the base named, not held), resumes over the base quantised again, and
# exports; a preset base is refused naming base_dtype; `strata config --model llama2-13b` plans the stock
# config on a 24 GiB GPU and finds it fits, where the same adapters over a bf16 base do not.
# usage: qlora_run_test.sh STRATA QLORA_CONFIG TEXT BASE_DIR SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 base=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$strata" train --config "$config" --init-from "$base" --text "$text" --seq-len 32 --steps 2 --no-progress \
  --save "$dir/ckpt" --export-merged "$dir/merged" >"$dir/train.log" 2>&1 ||
  { cat "$dir/train.log"; fail "training failed"; }
grep -q "(frozen, NF4)" "$dir/train.log" || { cat "$dir/train.log"; fail "the train line does not name the NF4 base"; }
grep -q "its block projections in NF4" "$dir/train.log" || { cat "$dir/train.log"; fail "no NF4 lora line"; }
[ -f "$dir/merged/model.safetensors" ] || fail "the merged export was not written"
"$strata" train --config "$config" --init-from "$base" --text "$text" --seq-len 32 --max-steps 3 --no-progress \
  --load "$dir/ckpt" >"$dir/resume.log" 2>&1 || { cat "$dir/resume.log"; fail "resume failed"; }
grep -q "loaded checkpoint" "$dir/resume.log" || { cat "$dir/resume.log"; fail "did not resume"; }
"$strata" train --config "$config" --model tiny --text "$text" --seq-len 32 --steps 1 --no-progress \
  >"$dir/preset.log" 2>&1 && fail "an NF4 base without files was accepted"
grep -q 'base_dtype "nf4"' "$dir/preset.log" || { cat "$dir/preset.log"; fail "not refused by name"; }
"$strata" config "$config" --model llama2-13b --device-memory 24GiB --seq-len 2048 >"$dir/plan.txt" 2>&1 ||
  { cat "$dir/plan.txt"; fail "strata config --model failed"; }
grep -q "^fits: yes" "$dir/plan.txt" || { cat "$dir/plan.txt"; fail "the NF4 plan does not fit 24 GiB"; }
grep -q "^host link per step: " "$dir/plan.txt" || { cat "$dir/plan.txt"; fail "no host link line"; }
sed 's/"base_dtype": "nf4"/"base_dtype": "bf16"/' "$config" >"$dir/bf16.json"
"$strata" config "$dir/bf16.json" --model llama2-13b --device-memory 24GiB --seq-len 2048 >"$dir/plan16.txt" 2>&1 ||
  { cat "$dir/plan16.txt"; fail "strata config --model failed for bf16"; }
grep -q "^fits: no" "$dir/plan16.txt" || { cat "$dir/plan16.txt"; fail "the bf16 base fits 24 GiB?"; }
echo "PASS: QLoRA trained over an NF4 base, resumed and planned"

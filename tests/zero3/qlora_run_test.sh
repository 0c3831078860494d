#!/usr/bin/env bash
# QLoRA from the command line (docs/train.md, "Adapters (LoRA)", the NF4 base): configs/qlora.json over a
# base read from files trains, saves (the base named, not held), resumes over the base quantised again, and
# exports (the pair evaluated over the NF4 base, eval --base-dtype nf4, is the merged export); a preset
# base is refused naming base_dtype; `strata config --model llama2-13b` plans the stock
# config on a 24 GiB GPU and finds it fits, where the same adapters over a bf16 base do not.
# usage: qlora_run_test.sh STRATA QLORA_CONFIG TEXT BASE_DIR SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 base=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$strata" train --config "$config" --init-from "$base" --text "$text" --seq-len 32 --steps 2 --no-progress \
  --save "$dir/ckpt" --export "$dir/adapter" --export-merged "$dir/merged" >"$dir/train.log" 2>&1 ||
  { cat "$dir/train.log"; fail "training failed"; }
grep -q "(frozen, NF4)" "$dir/train.log" || { cat "$dir/train.log"; fail "the train line does not name the NF4 base"; }
grep -q "its block projections in NF4" "$dir/train.log" || { cat "$dir/train.log"; fail "no NF4 lora line"; }
[ -f "$dir/merged/model.safetensors" ] || fail "the merged export was not written"
# The pair over the NF4 base (eval --base-dtype nf4) evaluates as the merged export does, within bf16's
# rounding of the merged weights; over the bf16 base it does not.
python3 -c "import random, struct, sys; random.seed(1); open(sys.argv[1], 'wb').write(struct.pack('<130H', *[random.randrange(256) for _ in range(130)]))" "$dir/val.bin"
for how in nf4 bf16; do
  "$strata" eval --model "$base" --adapter "$dir/adapter" --base-dtype $how --data "$dir/val.bin" --seq-len 32 \
    >"$dir/pair_$how.txt" 2>"$dir/pair_$how.log" || { cat "$dir/pair_$how.log"; fail "eval --base-dtype $how failed"; }
done
"$strata" eval --model "$dir/merged" --data "$dir/val.bin" --seq-len 32 >"$dir/merged.txt" 2>"$dir/merged.log" ||
  { cat "$dir/merged.log"; fail "eval of the merged export failed"; }
python3 - "$dir/pair_nf4.txt" "$dir/pair_bf16.txt" "$dir/merged.txt" <<'PY' || exit 1
import sys
nf4, bf16, merged = (float(open(p).read().split()[2]) for p in sys.argv[1:4])
if abs(nf4 - merged) > 1e-3 * merged:
    sys.exit(f"FAIL: the NF4 pair's loss {nf4} is not the merged export's {merged}")
if nf4 == bf16:
    sys.exit(f"FAIL: --base-dtype nf4 evaluated the bf16 base ({nf4})")
print(f"eval --base-dtype nf4 {nf4}, bf16 {bf16}, merged {merged}")
PY
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

#!/usr/bin/env bash
# LoRA from the command line (docs/train.md, "Adapters (LoRA)"): `strata train --init-from BASE --adapter
# PEFT_DIR` trains PEFT's adapters over the frozen base, `--export` writes a PEFT adapter directory holding
# the same tensors under PEFT's names, `--export-merged` the merged model; `strata eval --adapter` of the
# export gives the loss the run's last forward computes on the same data (the merged model's within bf16's
# rounding of the merged weights); a resume reads the base again, and a checkpoint of adapters holds no base.
# usage: adapter_run_test.sh STRATA CONFIG TEXT DATA_DIR SCRATCH_DIR
#   CONFIG: a host config; DATA_DIR: tests/reference/data/lora_llama (base/, adapter/ written by PEFT)
set -u
strata=$1 config=$2 text=$3 data=$4 dir=$5
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$strata" train --config "$config" --init-from "$data/base" --adapter "$data/adapter" --text "$text" --seq-len 32 \
  --steps 2 --no-progress --save "$dir/ckpt" --export "$dir/adapter" --export-merged "$dir/merged" \
  >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; fail "training failed"; }
grep -q "lora: r 8, scale 2, 14 adapted modules" "$dir/train.log" || { cat "$dir/train.log"; fail "no lora line"; }
grep -q "frozen: gathered only" "$dir/train.log" || { cat "$dir/train.log"; fail "the base is not frozen"; }
for f in adapter/adapter_config.json adapter/adapter_model.safetensors merged/config.json merged/model.safetensors; do
  [ -f "$dir/$f" ] || fail "$f was not written"
done
python3 - "$data/adapter/adapter_model.safetensors" "$dir/adapter/adapter_model.safetensors" <<'PY' || exit 1
import json, struct, sys
def keys(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return {k: (v["dtype"], v["shape"]) for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
a, b = keys(sys.argv[1]), keys(sys.argv[2])
if a != b:
    sys.exit(f"FAIL: the export's tensors differ from PEFT's: {sorted(set(a) ^ set(b))}")
PY
# Resume with the same command line: the base is read again (the checkpoint holds the adapters), one more
# step; without the adapters the resume is refused naming them.
"$strata" train --config "$config" --init-from "$data/base" --text "$text" --seq-len 32 --max-steps 3 --no-progress \
  --load "$dir/ckpt" >"$dir/bare.log" 2>&1 && fail "a resume without the adapters was accepted"
grep -q "trained LoRA adapters over this base" "$dir/bare.log" || { cat "$dir/bare.log"; fail "not refused by name"; }
"$strata" train --config "$config" --init-from "$data/base" --adapter "$data/adapter" --text "$text" --seq-len 32 \
  --max-steps 3 --no-progress \
  --load "$dir/ckpt" >"$dir/resume.log" 2>&1 || { cat "$dir/resume.log"; fail "resume failed"; }
grep -q "loaded checkpoint" "$dir/resume.log" || { cat "$dir/resume.log"; fail "did not resume"; }
# The pair evaluates; the merged model evaluates within bf16 rounding of it.
python3 -c "import random, struct, sys; random.seed(1); open(sys.argv[1], 'wb').write(struct.pack('<130H', *[random.randrange(256) for _ in range(130)]))" "$dir/val.bin"
"$strata" eval --model "$data/base" --adapter "$dir/adapter" --data "$dir/val.bin" --seq-len 32 >"$dir/pair.txt" \
  2>"$dir/pair.log" || { cat "$dir/pair.log"; fail "eval --adapter failed"; }
"$strata" eval --model "$dir/merged" --data "$dir/val.bin" --seq-len 32 >"$dir/merged.txt" 2>"$dir/merged.log" ||
  { cat "$dir/merged.log"; fail "eval of the merged export failed"; }
python3 - "$dir/pair.txt" "$dir/merged.txt" <<'PY' || exit 1
import sys
pair, merged = (float(open(p).read().split()[2]) for p in sys.argv[1:3])
if abs(pair - merged) > 1e-3 * pair:
    sys.exit(f"FAIL: the merged export's loss {merged} is not the pair's {pair}")
print(f"eval --adapter {pair}, merged {merged}")
PY
echo "PASS: adapters trained, exported as PEFT's directory and merged, resumed over the base"

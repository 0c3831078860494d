#!/usr/bin/env bash
# `strata train --init-from` and `--export DIR` end to end: the tiny model exported at step 0 as a Hugging
# Face directory; training from that directory starts from its weights (the first step's loss is the fresh
# run's, whose working weights they are), exports a directory again, and a directory with its own tokenizer
# refuses --text (bytes) and names the script that makes a token file; `strata export` of the run's
# checkpoint writes the same files as the run's own --export; --eval-data's loss at the last step is
# `strata eval`'s of the export to 1e-5 relative (the run's evaluation multiplies in bf16, as training does
# with bf16 working params; strata eval in fp32: kernels/cpu/linear_bf16.cpp) and on the same tokens.
# usage: init_from_test.sh STRATA CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir"
common=(--config "$config" --text "$text" --seq-len 32 --no-progress)
fail() { echo "FAIL: $*"; exit 1; }
"$strata" train "${common[@]}" --model tiny --steps 0 --export "$dir/step0" >"$dir/export.log" 2>&1 ||
  { cat "$dir/export.log"; fail "--steps 0 --export"; }
for f in config.json generation_config.json model.safetensors; do
  [ -f "$dir/step0/$f" ] || fail "--export wrote no $f"
done
grep -q '"architectures": \[' "$dir/step0/config.json" || fail "config.json names no architecture"
fresh=$("$strata" train "${common[@]}" --model tiny --steps 2 2>&1 | grep '^step 1/2')
from=$("$strata" train "${common[@]}" --init-from "$dir/step0" --steps 2 --export "$dir/step2" \
  --save "$dir/ckpt" 2>&1 | tee "$dir/train.log" | grep '^step 1/2')
cat "$dir/train.log"
[ -n "$from" ] || fail "training from the directory did not run"
[ "$(echo "$fresh" | grep -o 'loss [0-9.]*')" = "$(echo "$from" | grep -o 'loss [0-9.]*')" ] ||
  fail "the first step's loss differs: fresh '$fresh', from the export '$from'"
[ -f "$dir/step2/model.safetensors" ] || fail "the trained model was not exported"
"$strata" export "$dir/ckpt" "$dir/from-ckpt" || fail "strata export of the checkpoint"
for f in config.json generation_config.json model.safetensors; do
  cmp "$dir/step2/$f" "$dir/from-ckpt/$f" || fail "strata export's $f differs from the run's --export"
done
python3 - "$text" "$dir/eval.bin" <<'PY' || fail "cannot write the eval token file"
import struct, sys
ids = list(open(sys.argv[1], "rb").read())
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack(f"<{len(ids)}H", *ids))
PY
during=$("$strata" train "${common[@]}" --init-from "$dir/step0" --steps 2 --export "$dir/evaled" \
  --eval-data "$dir/eval.bin" --eval-interval 1 2>&1 | grep '^eval step 2 ')
after=$("$strata" eval --model "$dir/evaled" --data "$dir/eval.bin" --seq-len 32 --batch-size 4 2>/dev/null)
echo "during training: $during"
echo "strata eval:     $after"
[ -n "$during" ] && python3 - "${during#eval step 2 }" "${after#eval }" <<'PY' || fail "--eval-data's loss is not strata eval's"
import sys
a, b = (dict(zip(s.split()[::2], s.split()[1::2])) for s in sys.argv[1:3])
assert a["tokens"] == b["tokens"], (a, b)
assert abs(float(a["loss"]) - float(b["loss"])) <= 1e-5 * abs(float(b["loss"])), (a, b)
PY
echo '{"model": {"type": "BPE"}}' >"$dir/step2/tokenizer.json"
out=$("$strata" train "${common[@]}" --init-from "$dir/step2" --steps 1 2>&1)
echo "$out"
echo "$out" | grep -q 'has its own tokenizer (tokenizer.json): make a token file with .*scripts/tokenize_text.py' ||
  fail "--text with a model's own tokenizer was not refused"
echo "PASS: init-from and export round trip"

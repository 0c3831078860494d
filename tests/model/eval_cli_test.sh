#!/usr/bin/env bash
# `strata eval` end to end: a tiny model trained for two steps is exported (--export) and checkpointed
# (--save), then evaluated on the bytes of a text file from each kind of --model path — the safetensors
# export, a Hugging Face directory (config.json + model.safetensors), the checkpoint directory (its
# `latest`) and the checkpoint's tag directory. All hold the same bf16 working params, so all four print the
# same loss line, bit for bit. --batch-size / --max-batches limit the tokens counted. A loss mask beside the
# token file adds `counted C` to the line, and strata train reports it.
# Needs python3 to write the token file and config.json (skipped, exit 77, without it).
# usage: eval_cli_test.sh STRATA CONFIG TEXT SCRATCH_DIR
set -u
strata=$1 config=$2 text=$3 dir=$4
command -v python3 >/dev/null || { echo "SKIP: python3 is needed to write the token file"; exit 77; }
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

"$strata" train --config "$config" --model tiny --text "$text" --seq-len 32 --steps 2 --no-progress \
  --save "$dir/ckpt" --export "$dir/model.safetensors" >"$dir/train.log" 2>&1 ||
  { cat "$dir/train.log"; fail "strata train failed"; }

# The text's bytes as flat little-endian uint16 tokens (what `strata train --text` trains on), and the
# tiny model's config.json under Hugging Face's key names.
python3 - "$text" "$dir" <<'EOF' || fail "python3 could not write the inputs"
import array, json, os, sys
text, out = sys.argv[1], sys.argv[2]
tokens = array.array("H", list(open(text, "rb").read()))
if sys.byteorder == "big":
    tokens.byteswap()
open(os.path.join(out, "tokens.bin"), "wb").write(tokens.tobytes())
os.makedirs(os.path.join(out, "hf"))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
           "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 64, "max_position_embeddings": 64, "tie_word_embeddings": False,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"},
          open(os.path.join(out, "hf", "config.json"), "w"))
EOF
cp "$dir/model.safetensors" "$dir/hf/model.safetensors" || exit 1

line_re='^eval loss [0-9.]+ ppl [0-9.]+ tokens [0-9]+$'
run_eval() {
  "$strata" eval --model "$1" --data "$dir/tokens.bin" --seq-len 32 "${@:2}" 2>"$dir/eval.err" ||
    { cat "$dir/eval.err"; fail "strata eval --model $1 failed"; }
}
export_line=$(run_eval "$dir/model.safetensors")
echo "export:     $export_line"
echo "$export_line" | grep -Eq "$line_re" || fail "no loss line"
# README.md-sized text: (bytes - 1) / 32 whole sequences of 32 tokens.
bytes=$(wc -c <"$text")
expect_tokens=$(((bytes - 1) / 32 * 32))
echo "$export_line" | grep -q " tokens $expect_tokens\$" || fail "expected $expect_tokens tokens"
tag=$(cat "$dir/ckpt/latest")
for model in "$dir/hf" "$dir/ckpt" "$dir/ckpt/$tag"; do
  line=$(run_eval "$model")
  echo "$(basename "$model"): $line"
  [ "$line" = "$export_line" ] || fail "--model $model gives another loss than the export"
done
limited=$(run_eval "$dir/model.safetensors" --batch-size 4 --max-batches 2)
echo "limited:    $limited"
echo "$limited" | grep -q " tokens 256\$" || fail "--batch-size 4 --max-batches 2 should count 256 tokens"

# A loss mask beside the token file (model/loss_mask.h): eval says how many targets counted (the mask's
# ones among the evaluated targets, tokens 1 .. S·32), and strata train says so at its start.
python3 - "$dir/tokens.bin" <<'EOF2' || fail "python3 could not write the mask"
import os, struct, sys
path = sys.argv[1]
n = os.path.getsize(path) // 2
header = struct.pack("<256i", 20261127, 1, n & 0xFFFFFFFF, n >> 32, *([0] * 252))
open(path + ".mask", "wb").write(header + bytes(0 if i % 4 == 0 else 1 for i in range(n)))
EOF2
masked=$(run_eval "$dir/model.safetensors")
echo "masked:     $masked"
targets=$expect_tokens
expect_counted=$(python3 -c "print(sum(1 for i in range(1, $targets + 1) if i % 4))")
echo "$masked" | grep -Eq "^eval loss [0-9.]+ ppl [0-9.]+ tokens $expect_tokens counted $expect_counted\$" ||
  fail "expected tokens $expect_tokens counted $expect_counted"
[ "$masked" != "$export_line" ] || fail "the mask did not change the loss"
"$strata" train --config "$config" --model tiny --data "$dir/tokens.bin" --seq-len 32 --steps 1 --no-progress \
  >"$dir/train-masked.log" 2>&1 || { cat "$dir/train-masked.log"; fail "strata train on the masked file failed"; }
grep -E "^loss mask: .*tokens.bin.mask: [0-9]+ of [0-9]+ targets count" "$dir/train-masked.log" ||
  { cat "$dir/train-masked.log"; fail "strata train did not report the loss mask"; }
printf 'x' | dd of="$dir/tokens.bin.mask" bs=1 seek=5000 conv=notrunc 2>/dev/null
if "$strata" eval --model "$dir/model.safetensors" --data "$dir/tokens.bin" --seq-len 32 >/dev/null 2>"$dir/bad.err"; then
  fail "a mask byte other than 0/1 was accepted"
fi
grep -q "tokens.bin.mask .* does not go with token file .*tokens.bin .*scripts/tokenize_text.py" "$dir/bad.err" ||
  { cat "$dir/bad.err"; fail "the bad mask's error does not name both files and the fix"; }
echo "PASS: every kind of --model gives the same loss"

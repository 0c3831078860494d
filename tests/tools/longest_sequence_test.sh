#!/usr/bin/env bash
# How long a sequence fits, from the command line (docs/train.md, "Long-context fine-tuning"): `strata
# config --model` for llama2-7b (configs/models/llama2-7b.json, its max_seq_len raised to 1048576 as a
# context extension would) on an 80 GiB cuda device, zero3_cpu at micro-batch 1 with checkpointing and the
# block inputs in host memory "auto", prints the longest row the plan accepts; the plan at that length fits
# and at one token more, and one step of 1024 more, does not.
# usage: longest_sequence_test.sh STRATA ZERO3_CPU_CONFIG LLAMA2_7B_MODEL SCRATCH_DIR
set -u
strata=$1 config=$2 model=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
python3 - "$config" "$model" "$dir" <<'PY' || fail "could not write the config and model"
import json, sys
c = json.load(open(sys.argv[1]))
c["train_micro_batch_size_per_gpu"] = 1
c.pop("train_batch_size", None)
c["gradient_accumulation_steps"] = 1
c.setdefault("strata", {})["checkpoint_activations"] = True
c["activation_checkpointing"] = {"cpu_checkpointing": "auto"}
json.dump(c, open(sys.argv[3] + "/config.json", "w"))
m = json.load(open(sys.argv[2]))
m["max_seq_len"] = 1048576
json.dump(m, open(sys.argv[3] + "/model.json", "w"))
PY
plan() {  # plan T: strata config's output at --seq-len T
  "$strata" config "$dir/config.json" --model "$dir/model.json" --backend cuda --device-memory 80GiB \
    --seq-len "$1" 2>&1
}
out=$(plan 4096) || { echo "$out"; fail "strata config failed"; }
n=$(echo "$out" | sed -n 's/^longest sequence: \([0-9][0-9]*\) tokens a row at micro-batch 1 fit the device.*/\1/p')
[ -n "$n" ] || { echo "$out"; fail "no longest-sequence line"; }
[ "$n" -gt 4096 ] && [ "$n" -lt 1048576 ] || fail "longest sequence $n is not inside (4096, 1048576)"
echo "longest sequence: $n tokens"
plan "$n" | grep -q "^fits: yes" || fail "the plan at $n tokens does not fit"
for more in 1 1024; do
  plan $((n + more)) | grep -q "^fits: no" || fail "the plan at $n + $more tokens fits"
done
echo "PASS: llama2-7b on 80 GiB: $n tokens a row fit, $n + 1 and $n + 1024 do not"

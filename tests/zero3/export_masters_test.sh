#!/usr/bin/env bash
# `strata export --dtype fp32` of a bf16 run's checkpoint writes the fp32 master weights (as DeepSpeed's
# zero_to_fp32), not the bf16 working params widened: some exported values carry bits below bf16's, and
# each one rounds to the working value the bf16 export holds. --dtype bf16 keeps exporting the working
# params the run computed with.
# usage: export_masters_test.sh STRATA CONFIG TEXT SCRATCH_DIR   (CONFIG: a bf16 config)
set -u
strata=$1 config=$2 text=$3 dir=$4
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
"$strata" train --config "$config" --model tiny --text "$text" --seq-len 32 --steps 3 --no-progress \
  --save "$dir/ckpt" >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; fail "training failed"; }
"$strata" export "$dir/ckpt" "$dir/fp32" --dtype fp32 >"$dir/fp32.log" 2>&1 || { cat "$dir/fp32.log"; fail "export fp32"; }
grep -q "fp32 master weights" "$dir/fp32.log" || { cat "$dir/fp32.log"; fail "the fp32 export does not say it writes the masters"; }
"$strata" export "$dir/ckpt" "$dir/bf16" >"$dir/bf16.log" 2>&1 || { cat "$dir/bf16.log"; fail "export bf16"; }
python3 - "$dir/fp32/model.safetensors" "$dir/bf16/model.safetensors" <<'PY' || exit 1
import json, struct, sys

def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], data[a:b])
    return out

def rne_bf16(bits):  # fp32 bits -> the bf16 bits round-to-nearest-even gives (finite values)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16

f32, b16 = tensors(sys.argv[1]), tensors(sys.argv[2])
below, total = 0, 0
for name, (dt, raw) in f32.items():
    assert dt == "F32" and b16[name][0] == "BF16", (name, dt, b16[name][0])
    xs = struct.unpack(f"<{len(raw) // 4}I", raw)
    ys = struct.unpack(f"<{len(raw) // 4}H", b16[name][1])
    for x, y in zip(xs, ys):
        total += 1
        below += (x & 0xFFFF) != 0
        if rne_bf16(x) != y:
            sys.exit(f"FAIL: {name}: master bits {x:#010x} do not round to the working value {y:#06x}")
if below == 0:
    sys.exit(f"FAIL: all {total} fp32 values are bf16 values: the working params, not the masters")
print(f"{below} of {total} exported fp32 values carry bits below bf16's; each rounds to the working value")
PY
echo "PASS: export --dtype fp32 writes the fp32 masters"

#!/usr/bin/env bash
# strata eval --logits over a token file with document boundaries (FILE.docs, model/packed_docs.h) keeps
# the documents apart as its loss does: the logits of a row's second document equal those of that document
# evaluated alone (attention within the document, positions from 0), and differ from a run without the
# boundaries (where the second document attends to the first).
# usage: eval_logits_documents_test.sh STRATA MODEL_DIR SCRATCH_DIR
set -u
strata=$1 model=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
python3 - "$dir" <<'PY' || fail "could not write the token files"
import struct, sys
d = sys.argv[1]
def tokens(path, ids):  # llm.c's .bin: 256 int32 of header (magic, version, count), then uint16 ids
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
        f.write(struct.pack(f"<{len(ids)}H", *ids))
a = [(7 * i + 3) % 128 for i in range(8)]
b = [(11 * i + 5) % 128 for i in range(8)]
tokens(d + "/packed.bin", a + b + [1])
with open(d + "/packed.bin.docs", "wb") as f:  # magic, version, token count, document count; starts
    f.write(struct.pack("<256i", 20261204, 1, 17, 0, 3, 0, *([0] * 250)))
    f.write(struct.pack("<3Q", 0, 8, 16))
tokens(d + "/plain.bin", a + b + [1])
tokens(d + "/alone.bin", b + [1])
PY
ev() { "$strata" eval --model "$model" --data "$dir/$1.bin" --seq-len "$2" --logits "$dir/$1.logits" 2>&1; }
ev packed 16 >"$dir/packed.log" || { cat "$dir/packed.log"; fail "strata eval (packed) failed"; }
grep -q "documents kept apart" "$dir/packed.log" || { cat "$dir/packed.log"; fail "no documents line"; }
ev plain 16 >"$dir/plain.log" || { cat "$dir/plain.log"; fail "strata eval (plain) failed"; }
ev alone 8 >"$dir/alone.log" || { cat "$dir/alone.log"; fail "strata eval (alone) failed"; }
python3 - "$dir" <<'PY' || exit 1
import struct, sys
d, V = sys.argv[1], 128
def logits(name, rows):
    raw = open(f"{d}/{name}.logits", "rb").read()
    v = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert len(v) == rows * V, (name, len(v))
    return v
packed, plain, alone = logits("packed", 16), logits("plain", 16), logits("alone", 8)
second = packed[8 * V:]
scale = max(abs(x) for x in alone)
err = max(abs(x - y) for x, y in zip(second, alone)) / scale
cross = max(abs(x - y) for x, y in zip(plain[8 * V:], alone)) / scale
print(f"second document against alone: max |diff| / max |logit| {err:.2e}; without the boundaries {cross:.2e}")
if not err < 1e-5: sys.exit("FAIL: the packed row's second document is not its logits alone")
if not cross > 1e-3: sys.exit("FAIL: without the boundaries the documents should attend to each other")
print("PASS: eval --logits keeps the documents apart")
PY

#!/usr/bin/env python3
"""scripts/tokenize_text.py end to end, with a BPE tokenizer trained here by the `tokenizers` library (no
network, no downloaded model).

Usage: tokenize_test.py SCRIPT TMPDIR   (tests/model/CMakeLists.txt passes scripts/tokenize_text.py and a
directory under the build's test-tmp). Exit status 0 passed, 1 failed, 77 skipped (no `tokenizers`).

Each check asserts the bytes of the token file: llm.c's header (magic, version, count) and the tokens,
[BOS] + encode(document) + [EOS] per document in input order.
"""

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # importing scripts/tokenize_text.py below writes nothing into the source tree

try:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
except ImportError:
    print(f"SKIP: the Python package `tokenizers` is not importable by {sys.executable} "
          f"(bash scripts/install-deps.sh --python makes deps/pyenv with it; then re-run cmake)")
    sys.exit(77)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny tokenizer is trained in this test, so nothing is downloaded.",
    "Offloading the optimizer state to NVMe keeps the device memory small.",
    "Caf\u00e9 cr\u00e8me and na\u00efve r\u00e9sum\u00e9s: bytes beyond ASCII.",
]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def train_tokenizer(model_dir, config):
    """A byte-level BPE with <s> and </s>, and a post-processor that adds <s> itself: the script must not
    let that through (it encodes with add_special_tokens=False and applies its own convention)."""
    os.makedirs(model_dir, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    if config is not None:
        with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
    return tok


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=60)


def expected_file(tok, docs, bos, eos, width):
    tokens = []
    for d in docs:
        tokens += ([bos] if bos is not None else []) + tok.encode(d, add_special_tokens=False).ids + \
                  ([eos] if eos is not None else [])
    magic, version = (20240520, 1) if width == 2 else (20240801, 7)
    header = struct.pack("<256i", magic, version, len(tokens), *([0] * 253))
    return header + struct.pack(f"<{len(tokens)}{'H' if width == 2 else 'I'}", *tokens), tokens


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    script, tmp_root = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(tmp_root, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=tmp_root)
    try:
        model = os.path.join(tmp, "model")
        # The config names BOS and EOS as transformers writes them: one plain, one an AddedToken object.
        tok = train_tokenizer(model, {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}})
        bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
        check(bos is not None and eos is not None and bos != eos, "the trained tokenizer has <s> and </s>")

        txt = os.path.join(tmp, "a.txt")
        txt_doc = SENTENCES[0] + "\n" + SENTENCES[3] + "\n"
        with open(txt, "w", encoding="utf-8") as f:
            f.write(txt_doc)
        jsonl = os.path.join(tmp, "b.jsonl")
        jsonl_docs = [SENTENCES[1], SENTENCES[2] + "\nsecond line"]
        with open(jsonl, "w", encoding="utf-8") as f:
            for d in jsonl_docs:
                f.write(json.dumps({"id": 7, "text": d}) + "\n")
            f.write("\n")  # a trailing blank line is no document
        docs = [txt_doc] + jsonl_docs

        # (1) [BOS] + encode(doc) + [EOS] per document, in input order, uint16 for a small vocabulary.
        out = os.path.join(tmp, "tokens.bin")
        r = run(script, "--tokenizer", model, "--out", out, txt, jsonl)
        check(r.returncode == 0, f"tokenize_text.py succeeds (rc {r.returncode}: {r.stderr.strip()})")
        if r.returncode == 0:
            want, tokens = expected_file(tok, docs, bos, eos, 2)
            check(read(out) == want, "the token file is llm.c's uint16 header, [BOS]+doc+[EOS] per document")
            check(tokens.count(bos) == 3 and tokens.count(eos) == 3, "one BOS and one EOS per document")
            check("3 documents" in r.stdout and f"{len(tokens)} tokens" in r.stdout and "uint16" in r.stdout,
                  f"the summary names documents, tokens and width: {r.stdout.strip()}")
            check(not os.path.exists(out + ".tmp"), "no .tmp file is left behind")

        # (2) --no-bos --no-eos: the tokenizer's own encoding only, its post-processor's <s> not applied.
        out2 = os.path.join(tmp, "plain.bin")
        r = run(script, "--tokenizer", os.path.join(model, "tokenizer.json"), "--out", out2, "--no-bos",
                "--no-eos", jsonl)
        check(r.returncode == 0 and read(out2) == expected_file(tok, jsonl_docs, None, None, 2)[0],
              f"--no-bos --no-eos writes the documents' tokens only ({r.stderr.strip()})")

        # (3) add_eos_token false in tokenizer_config.json (Llama 2's convention): BOS only; --jsonl-field.
        model3 = os.path.join(tmp, "model3")
        tok3 = train_tokenizer(model3, {"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                                        "add_bos_token": True, "add_eos_token": False})
        j3 = os.path.join(tmp, "c.jsonl")
        with open(j3, "w", encoding="utf-8") as f:
            f.write(json.dumps({"content": SENTENCES[2]}) + "\n")
        out3 = os.path.join(tmp, "bos-only.bin")
        r = run(script, "--tokenizer", model3, "--out", out3, "--jsonl-field", "content", j3)
        check(r.returncode == 0 and read(out3) == expected_file(tok3, [SENTENCES[2]], bos, None, 2)[0],
              f"add_eos_token false gives BOS only ({r.stderr.strip()})")

        # (4) No config: BOS/EOS found among tokenizer.json's added tokens by name.
        model4 = os.path.join(tmp, "model4")
        tok4 = train_tokenizer(model4, None)
        out4 = os.path.join(tmp, "no-config.bin")
        r = run(script, "--tokenizer", model4, "--out", out4, txt)
        check(r.returncode == 0 and read(out4) == expected_file(tok4, [txt_doc], bos, eos, 2)[0],
              f"with no tokenizer_config.json, <s> and </s> come from the added tokens ({r.stderr.strip()})")

        # (5) A vocabulary past 65536 ids: uint32 tokens, magic 20240801 / version 7.
        spec = importlib.util.spec_from_file_location("strata_tokenize_script", script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        check(mod.token_width(65536) == 2 and mod.token_width(65537) == 4 and mod.token_width(128256) == 4,
              "token_width: uint16 up to 65536 ids, uint32 beyond")
        big = os.path.join(tmp, "big")
        tok5 = train_tokenizer(big, {"bos_token": "<s>", "eos_token": "</s>"})
        tok5.add_tokens([f"<extra_{i}>" for i in range(66000)])
        tok5.save(os.path.join(big, "tokenizer.json"))
        check(tok5.get_vocab_size(with_added_tokens=True) > 65536, "the big tokenizer has > 65536 ids")
        doc5 = SENTENCES[0] + " <extra_65900> " + SENTENCES[1]
        j5 = os.path.join(tmp, "big.jsonl")
        with open(j5, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": doc5}) + "\n")
        out5 = os.path.join(tmp, "big.bin")
        r = run(script, "--tokenizer", big, "--out", out5, j5)
        want5, tokens5 = expected_file(tok5, [doc5], bos, eos, 4)
        check(max(tokens5) > 65535, "the big document holds an id that needs uint32")
        check(r.returncode == 0 and read(out5) == want5 and "uint32" in r.stdout,
              f"a vocabulary > 65536 writes llm.c's uint32 format ({r.stderr.strip()})")

        # (6) Errors: exit 2 with a message naming the place; no output written.
        bad = os.path.join(tmp, "bad.jsonl")
        with open(bad, "w", encoding="utf-8") as f:
            f.write(json.dumps({"text": "fine"}) + "\n" + "{not json\n")
        out6 = os.path.join(tmp, "bad.bin")
        r = run(script, "--tokenizer", model, "--out", out6, txt, bad)
        check(r.returncode == 2 and f"{bad}:2" in r.stderr, f"a bad JSONL line exits 2 naming file:line "
                                                           f"(rc {r.returncode}: {r.stderr.strip()})")
        check(not os.path.exists(out6) and not os.path.exists(out6 + ".tmp"), "a failed run leaves no file")
        nofield = os.path.join(tmp, "nofield.jsonl")
        with open(nofield, "w", encoding="utf-8") as f:
            f.write(json.dumps({"body": "x"}) + "\n")
        r = run(script, "--tokenizer", model, "--out", out6, nofield)
        check(r.returncode == 2 and f"{nofield}:1" in r.stderr and "'text'" in r.stderr,
              f"a JSONL line without the field exits 2 naming file:line ({r.stderr.strip()})")
        r = run(script, "--tokenizer", tmp, "--out", out6, txt)
        check(r.returncode == 2 and "tokenizer.json" in r.stderr,
              f"a directory without tokenizer.json exits 2 ({r.stderr.strip()})")
        r = run(script, "--tokenizer", model, "--out", out6, os.path.join(tmp, "missing.txt"))
        check(r.returncode == 2 and "missing.txt" in r.stderr,
              f"a missing input exits 2 ({r.stderr.strip()})")
        empty = os.path.join(tmp, "empty.txt")
        open(empty, "w").close()
        r = run(script, "--tokenizer", model, "--out", out6, "--no-bos", "--no-eos", empty)
        check(r.returncode == 2 and "no tokens" in r.stderr and not os.path.exists(out6),
              f"empty output exits 2 and writes nothing ({r.stderr.strip()})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("PASS: scripts/tokenize_text.py writes [BOS]+doc+[EOS] per document in llm.c's uint16/uint32 format")
    return 0


if __name__ == "__main__":
    sys.exit(main())

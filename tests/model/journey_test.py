#!/usr/bin/env python3
"""The fine-tuning journey of docs/train.md ("Fine-tuning on conversations"), end to end, for a tiny random
model of each family: a model directory (weights written by `strata train --steps 0 --export`, a byte-level
BPE tokenizer and a ChatML chat template made here and saved by transformers' save_pretrained, the template
as chat_template.jinja), a chat JSONL, `scripts/tokenize_text.py --chat`, `strata eval` before,
`strata train --init-from ... --export`, `strata eval` after, and the result loaded in transformers.

    journey_test.py STRATA TOKENIZE_SCRIPT CONFIG PRESETS_DIR SCRATCH_DIR

Checks, per family: the token file's mask counts exactly the assistant replies; `strata eval` reports the
counted targets; training lowers the eval loss on the replies by at least half a nat; the export's
config.json names the family's class, and the export carries the source's tokenizer and chat template files
byte for byte, so that transformers' apply_chat_template on it gives the source's tokens. Where a python
with torch and transformers is available (this one, or STRATA_TORCH_PYTHON), transformers loads the export
as that class and its masked loss of the first eval batch (labels = -100 where the mask is 0) equals
`strata eval`'s within bf16 rounding; without one that step says it was skipped, and why. Exit 0 when every
check passed, 1 otherwise, 77 when this python lacks `tokenizers` or transformers
(scripts/install-deps.sh --python installs both in deps/pyenv).
"""
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import tokenizers  # noqa: F401
    import transformers  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e.name} is not installed in {sys.executable} (scripts/install-deps.sh --python)")
    sys.exit(77)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma")
SEQ_LEN = 32
STEPS = 40
VOCAB = 512  # the model's; the tokenizer's 400 ids fit
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
COLORS = ["red", "green", "blue", "black", "white", "gray", "pink", "brown"]
THINGS = ["apple", "leaf", "sky", "coal", "snow", "stone", "rose", "bark", "grass", "sea", "milk", "ash",
          "ink", "cloud", "lime", "wood"]
# ChatML, as Qwen2.5's template renders it (without the tools branch).
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def run(*cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        print(f"$ {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")
    return r


def conversations():
    """Questions whose answers the model can learn: each thing has one color."""
    out = []
    for i in range(96):
        thing = THINGS[i % len(THINGS)]
        color = COLORS[THINGS.index(thing) % len(COLORS)]
        msgs = [{"role": "user", "content": f"What color is the {thing} ?"},
                {"role": "assistant", "content": f"It is {color} ."}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "You are helpful ."})
        out.append({"messages": msgs})
    return out


def reply(c):
    return c["messages"][-1]["content"]


def make_tokenizer(d, convs):
    """A byte-level BPE as Qwen2.5's, trained on the conversations' text, saved with the chat template by
    transformers' own save_pretrained: transformers 5 writes the template as chat_template.jinja (not in
    tokenizer_config.json), which the export must carry along."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["".join(f"{m['role']}\n{m['content']}\n" for m in c["messages"]) for c in convs]
    tok.train_from_iterator(text * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(d)
    with open(os.path.join(d, "tokenizer_config.json")) as f:
        check(os.path.exists(os.path.join(d, "chat_template.jinja")) and "chat_template" not in json.load(f),
              "transformers' save_pretrained wrote the template as chat_template.jinja alone")


def same_files(src, dst, names):
    """The names of `names` that are not in dst byte for byte as in src."""
    def data(path):
        with open(path, "rb") as f:
            return f.read()
    return [n for n in names if not os.path.exists(os.path.join(dst, n)) or
            data(os.path.join(src, n)) != data(os.path.join(dst, n))]


def eval_line(strata, model, data, *extra):
    r = run(strata, "eval", "--model", model, "--data", data, "--seq-len", SEQ_LEN, *extra)
    m = re.search(r"^eval loss ([0-9.e+-]+) ppl [0-9.e+-]+ tokens ([0-9]+) counted ([0-9]+)$", r.stdout, re.M)
    return (float(m.group(1)), int(m.group(2)), int(m.group(3))) if r.returncode == 0 and m else None


TORCH_CHECK = r"""
import json, os, struct, sys
import torch, transformers
model_dir, data, seq_len, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
def body(path, header_ints, fmt):
    raw = open(path, "rb").read()[header_ints * 4:]
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw))
tokens, mask = body(data, 256, "H"), body(data + ".mask", 256, "B")
# Packed examples kept apart (OUT.docs, model/packed_docs.h): position_ids from 0 at each example and row
# start, and no example scored on the one before it, as transformers' padding-free packing does.
starts = set(body(data + ".docs", 256, "Q")) if os.path.exists(data + ".docs") else set()
ids, labels, pos = [], [], []
for s in range(rows):  # strata eval's rows: consecutive windows of seq_len + 1 tokens from the start
    w = tokens[s * seq_len: s * seq_len + seq_len + 1]
    ids.append(w[:seq_len])
    labels.append([w[j + 1] if mask[s * seq_len + j + 1] and s * seq_len + j + 1 not in starts else -100
                   for j in range(seq_len)])
    p = []
    for j in range(seq_len):
        p.append(0 if j == 0 or s * seq_len + j in starts else p[-1] + 1)
    pos.append(p)
extra = dict(position_ids=torch.tensor(pos), use_cache=False) if starts else {}
logits = m(input_ids=torch.tensor(ids), **extra).logits.float()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1),
                                         ignore_index=-100)
print(json.dumps({"class": type(m).__name__, "loss": float(loss)}))
"""


def torch_python():
    """A python with torch and transformers: STRATA_TORCH_PYTHON, or this one; None with the reason."""
    cand = os.environ.get("STRATA_TORCH_PYTHON") or sys.executable
    r = subprocess.run([cand, "-c", "import torch, transformers"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"{cand} has no torch (set STRATA_TORCH_PYTHON to a python with torch and transformers)"
    return cand, ""


def journey(strata, script, config, presets, scratch, family, torch_py):
    had = len(failures)
    d = os.path.join(scratch, family)
    shutil.rmtree(d, ignore_errors=True)
    base, tuned = os.path.join(d, "base"), os.path.join(d, "tuned")
    os.makedirs(base)
    # 1. A model directory: random weights of the family's tiny shape (a vocabulary of VOCAB), and its
    # tokenizer with the template.
    with open(os.path.join(presets, "tiny.json" if family == "llama" else f"tiny-{family}.json")) as f:
        shape = dict(json.load(f), vocab_size=VOCAB)
    preset = os.path.join(d, "model.json")
    with open(preset, "w") as f:
        json.dump(shape, f)
    with open(os.path.join(d, "seed.txt"), "w") as f:
        f.write("seed text for the zero-step run that writes the weights\n" * 8)
    r = run(strata, "train", "--config", config, "--model", preset, "--text", os.path.join(d, "seed.txt"),
            "--seq-len", SEQ_LEN, "--steps", 0, "--no-progress", "--export", base)
    check(r.returncode == 0, f"{family}: strata train --steps 0 --export wrote no model directory")
    convs = conversations()
    make_tokenizer(base, convs)
    # 2. The conversations, tokenized with the directory's own template and a loss mask.
    chat, data = os.path.join(d, "chat.jsonl"), os.path.join(d, "train.bin")
    with open(chat, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in convs)
    r = run(sys.executable, script, "--chat", "--tokenizer", base, "--out", data, chat)
    check(r.returncode == 0 and os.path.exists(data + ".mask"), f"{family}: tokenize_text.py --chat failed")
    if len(failures) > had:
        return
    # The tokens that count are exactly the replies, each with the <|im_end|>\n the template closes it with.
    with open(data + ".mask", "rb") as f:
        mask = f.read()[1024:]
    with open(data, "rb") as f:
        raw = f.read()[1024:]
    ids = [int.from_bytes(raw[i:i + 2], "little") for i in range(0, len(raw), 2)]
    tok = transformers.AutoTokenizer.from_pretrained(base)
    counted = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
    want = "".join(reply(c) + "<|im_end|>\n" for c in convs)
    check(len(mask) == len(ids) and counted == want,
          f"{family}: the tokens the mask counts decode to {counted[:80]!r}..., not the replies {want[:80]!r}...")
    # 3. Eval before, train with --init-from and --export, eval after.
    before = eval_line(strata, base, data)
    check(before is not None and before[2] > 0, f"{family}: strata eval of the base model printed no counted targets")
    r = run(strata, "train", "--config", config, "--init-from", base, "--data", data, "--seq-len", SEQ_LEN,
            "--steps", STEPS, "--no-progress", "--export", tuned)
    check(r.returncode == 0, f"{family}: strata train --init-from failed")
    after = eval_line(strata, tuned, data)
    check(after is not None, f"{family}: strata eval of the tuned model failed")
    if before is None or after is None:
        return
    print(f"{family}: eval loss on the replies {before[0]:.4f} -> {after[0]:.4f} ({after[2]} targets counted)")
    check(after[0] < before[0] - 0.5, f"{family}: training did not lower the replies' loss ({before[0]} -> {after[0]})")
    with open(os.path.join(tuned, "config.json")) as f:
        cfg = json.load(f)
    want = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM"}[family]
    check(cfg.get("architectures") == [want], f"{family}: the export's architectures are {cfg.get('architectures')}")
    # The export carries the tokenizer and its chat template: transformers renders the conversations there
    # as in the source directory, token for token.
    names = [n for n in sorted(os.listdir(base)) if n.startswith("tokenizer") or n.endswith(".jinja")]
    missing = same_files(base, tuned, names)
    check("chat_template.jinja" in names and not missing, f"{family}: the export lacks {missing} of {names}")
    try:
        exported = transformers.AutoTokenizer.from_pretrained(tuned)
        same = all(exported.apply_chat_template(c["messages"])["input_ids"] ==
                   tok.apply_chat_template(c["messages"])["input_ids"] for c in convs[:4])
        why = "different tokens"
    except ValueError as e:  # "Cannot use apply_chat_template because this processor does not have a chat template"
        same, why = False, str(e)
    check(same, f"{family}: apply_chat_template on the export does not give the source's tokens ({why})")
    # 4. The export in transformers: the same class, the same masked loss on the first eval batch.
    if torch_py is None:
        return
    rows = 4
    ours = eval_line(strata, tuned, data, "--batch-size", rows, "--max-batches", 1)
    r = run(torch_py, "-c", TORCH_CHECK, tuned, data, SEQ_LEN, rows)
    if r.returncode != 0 or ours is None:
        check(False, f"{family}: transformers could not load the export")
        return
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    check(theirs["class"] == want, f"{family}: transformers loaded {theirs['class']}, not {want}")
    # Both compute from the same bf16 weights; strata's host backend in fp32 (bf16 working params).
    check(abs(theirs["loss"] - ours[0]) <= 1e-3 * max(1.0, ours[0]),
          f"{family}: transformers' masked loss {theirs['loss']} differs from strata eval's {ours[0]}")
    print(f"{family}: transformers loads {theirs['class']}, masked loss {theirs['loss']:.6f} vs strata {ours[0]:.6f}")


def main():
    if len(sys.argv) != 6:
        print(__doc__)
        return 2
    strata, script, config, presets, scratch = sys.argv[1:]
    torch_py, why = torch_python()
    if torch_py is None:
        print(f"transformers step skipped: {why}")
    for family in FAMILIES:
        journey(strata, script, config, presets, scratch, family, torch_py)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("PASS: the fine-tuning journey for every family")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""scripts/tokenize_text.py end to end, with a BPE tokenizer trained here by the `tokenizers` library (no
network, no downloaded model).

Usage: tokenize_test.py SCRIPT TMPDIR   (tests/model/CMakeLists.txt passes scripts/tokenize_text.py and a
directory under the build's test-tmp). Exit status 0 passed, 1 failed, 77 skipped (no `tokenizers`).

Each check asserts the bytes of the token file: llm.c's header (magic, version, count) and the tokens,
[BOS] + encode(document) + [EOS] per document in input order. Long documents, encoded in pieces, must give
the tokens of encoding them in one call, with the peak RSS of the script bounded whatever their size.

--chat (chat_checks) runs with a word-level tokenizer and chat templates made here, and asserts the bytes of
the token file and its OUT.mask against ids written out by hand; skipped (said) without `transformers`.
"""

import contextlib
import importlib.util
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # importing scripts/tokenize_text.py below writes nothing into the source tree

try:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
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


def docs_file(count, starts):
    """OUT.docs as model/packed_docs.h reads it: magic 20261204, version 1, the token and document counts as
    uint64, then each document's first token as a uint64."""
    header = struct.pack("<6i", 20261204, 1, count, 0, len(starts), 0) + bytes(4 * 250)
    return header + struct.pack(f"<{len(starts)}Q", *starts)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def run_measured(script, *args):
    """(exit status, peak RSS in MiB, stderr) of the script, run by a small python that reports its child's
    ru_maxrss (in KiB on Linux). Not this process's child: a child's peak counts the memory of the process
    it was forked from, and this one holds tokenizers and long documents."""
    measure = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    r = subprocess.run([sys.executable, "-c", measure, sys.executable, script, *args], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, RAYON_NUM_THREADS="4"))
    return r.returncode, int(r.stdout.split()[-1]) / 1024 if r.stdout.strip() else float("inf"), r.stderr


def long_text(chars, seed):
    """Lines of SENTENCES and other words with the whitespace a pre-tokenizer treats specially: two spaces,
    a tab, spaces before and after a line break, blank lines, punctuation before a line break, CJK."""
    extra = ["don't", "1234567", "(x)", "\u4e2d\u6587\u6587\u672c", "foo.bar", "--", "\u00a0na\u00efve"]
    seps = [" ", " ", " ", "  ", "\t", "\n", " \n", "\n ", "\n\n", ".\n", ", ", "   \n  "]
    words = " ".join(SENTENCES).split() + extra
    out, n, i = [], 0, seed
    while n < chars:
        i = (i * 1103515245 + 12345) % 2**31  # a fixed LCG: the same text on every machine
        w, sep = words[i % len(words)], seps[(i >> 8) % len(seps)]
        out.append(w + sep)
        n += len(w) + len(sep)
    return "".join(out)


# --chat: a word-level tokenizer whose ids are written out by hand below, and a chat template in two forms
# rendering the same text: with {% generation %} blocks (transformers' assistant mask) and without (the
# script's prefix method).
CHAT_SPECIALS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]  # ids 0-6
CHAT_WORDS = ["[UNK]", "Hello", "there", "Hi", "How", "are", "you", "Fine", "Be", "brief"]  # ids 7-16
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}<|assistant|> "
                 "{% generation %}{{ m.content }} <|end|>{% endgeneration %} {% else %}<|{{ m.role }}|> "
                 "{{ m.content }} <|end|> {% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|> "
                 "{% endif %}")
CHAT_TEMPLATE_PLAIN = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
# Renders the last message with a word more than the same message followed by others: not prefix-stable.
CHAT_TEMPLATE_UNSTABLE = CHAT_TEMPLATE_PLAIN.replace("{{ m.content }} <|end|>",
                                                     "{{ m.content }}{% if loop.last %} Fine{% endif %} <|end|>")
CONV1 = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"},
         {"role": "user", "content": "How are you"}, {"role": "assistant", "content": "Fine"}]
# <s> <|user|> Hello there <|end|> <|assistant|> Hi <|end|> <|user|> How are you <|end|> <|assistant|> Fine <|end|>
CONV1_IDS = [0, 4, 8, 9, 6, 5, 10, 6, 4, 11, 12, 13, 6, 5, 14, 6]
CONV1_MASK = [0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1]  # "Hi <|end|>", "Fine <|end|>"
CONV2 = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hello"}]  # no assistant turn
CONV2_IDS = [0, 3, 15, 16, 6, 4, 8, 6]


def chat_model(model_dir, config, jinja=None):
    """The word-level tokenizer in model_dir, with tokenizer_config.json = config and, when given,
    chat_template.jinja = jinja."""
    from tokenizers import AddedToken
    os.makedirs(model_dir, exist_ok=True)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(CHAT_SPECIALS + CHAT_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in CHAT_SPECIALS])
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    write(os.path.join(model_dir, "tokenizer_config.json"), json.dumps(config))
    if jinja is not None:
        write(os.path.join(model_dir, "chat_template.jinja"), jinja)


def token_bytes(ids):
    return struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack(f"<{len(ids)}H", *ids)


def mask_bytes(mask):
    return struct.pack("<256i", 20261127, 1, len(mask), 0, *([0] * 252)) + bytes(mask)


def jsonl(path, lines):
    """Writes `lines` (objects as JSON, strings as they are) one a line."""
    write(path, "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def chat_checks(script, tmp):
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found": not needed
    try:
        import jinja2  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"SKIP: the --chat checks: {e} (bash scripts/install-deps.sh --python installs transformers and "
              f"jinja2 into deps/pyenv)")
        return
    spec = importlib.util.spec_from_file_location("strata_tokenize_chat", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def run_in(*args):
        """(exit status, stderr) of the script's main(args), run in this process: transformers is imported once."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = mod.main(list(args))
            except SystemExit as e:  # argparse's usage errors
                rc = e.code
        return rc, err.getvalue()

    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    gen, plain = os.path.join(tmp, "chat-gen"), os.path.join(tmp, "chat-plain")
    chat_model(gen, dict(config, chat_template=CHAT_TEMPLATE))
    chat_model(plain, config, jinja=CHAT_TEMPLATE_PLAIN)  # the template as a file, as transformers reads it
    convs = jsonl(os.path.join(tmp, "convs.jsonl"), [{"messages": CONV1}, "", {"messages": CONV2, "id": 3}])
    out = os.path.join(tmp, "chat.bin")
    want_ids, want_mask = CONV1_IDS + CONV2_IDS, CONV1_MASK + [0] * len(CONV2_IDS)

    # (c1) The command as users run it, with the {% generation %} template: the template's tokens, concatenated
    # (the blank line skipped), and OUT.mask's header and bytes.
    r = run(script, "--chat", "--tokenizer", gen, "--out", out, convs)
    check(r.returncode == 0 and read(out) == token_bytes(want_ids) and read(out + ".mask") == mask_bytes(want_mask),
          f"--chat with {{% generation %}}: the template's tokens and the assistant mask ({r.stderr.strip()})")
    check("2 examples (messages 2), 24 tokens, 4 tokens that count" in r.stderr and
          "1 examples have no token that counts" in r.stderr and "Traceback" not in r.stderr,
          f"--chat reports conversations, tokens, tokens that count and those with none: {r.stderr.strip()}")
    check(not os.path.exists(out + ".tmp") and not os.path.exists(out + ".mask.tmp"), "no .tmp file is left")
    check(read(out + ".docs") == docs_file(24, [0, len(CONV1_IDS)]) and not os.path.exists(out + ".docs.tmp"),
          "packed --chat writes OUT.docs: each conversation's first token")

    # (c2) The template without {% generation %} (the prefix method) gives the same tokens and mask.
    rc, err = run_in("--chat", "--tokenizer", plain, "--out", out, convs)
    check(rc == 0 and read(out) == token_bytes(want_ids) and read(out + ".mask") == mask_bytes(want_mask) and
          "found by rendering prefixes" in err,
          f"--chat without {{% generation %}}: the same mask by prefixes ({err.strip()})")

    # (c3) --train-on-prompt: every byte 1.
    rc, err = run_in("--chat", "--train-on-prompt", "--tokenizer", plain, "--out", out, convs)
    check(rc == 0 and read(out) == token_bytes(want_ids) and read(out + ".mask") == mask_bytes([1] * 24),
          f"--train-on-prompt: every mask byte is 1 ({err.strip()})")

    # (c4) --pad-rows --seq-len 12: CONV1 cut after 12 tokens (its second answer gone), CONV2 padded with
    # <pad> (id 2) whose mask is 0, also with --train-on-prompt; the cut is counted.
    for extra, conv2_mask in (([], [0] * 8), (["--train-on-prompt"], [1] * 8)):
        rc, err = run_in("--chat", *extra, "--pad-rows", "--seq-len", "12", "--tokenizer", gen, "--out", out, convs)
        conv1_mask = [1] * 12 if extra else CONV1_MASK[:12]
        check(rc == 0 and read(out) == token_bytes(CONV1_IDS[:12] + CONV2_IDS + [2] * 4) and
              read(out + ".mask") == mask_bytes(conv1_mask + conv2_mask + [0] * 4) and
              "1 examples were cut to --seq-len 12" in err,
              f"--pad-rows {' '.join(extra)}: rows of 12, cut and padded with <pad> (mask 0) ({err.strip()})")
        check(not os.path.exists(out + ".docs"), "--pad-rows writes no OUT.docs (a row holds one example)")
    # Packed, --seq-len only reports the conversations longer than it.
    rc, err = run_in("--chat", "--seq-len", "10", "--tokenizer", gen, "--out", out, convs)
    check(rc == 0 and read(out) == token_bytes(want_ids) and "1 examples are longer than --seq-len 10" in err,
          f"packed --chat --seq-len reports the longer conversations ({err.strip()})")
    # No pad_token: the eos_token pads; neither: refused.
    no_pad = os.path.join(tmp, "chat-no-pad")
    chat_model(no_pad, {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE})
    rc, err = run_in("--chat", "--pad-rows", "--seq-len", "12", "--tokenizer", no_pad, "--out", out, convs)
    check(rc == 0 and read(out)[-8:] == struct.pack("<4H", 1, 1, 1, 1),
          f"--pad-rows pads with eos_token when there is no pad_token ({err.strip()})")

    # (c5) Stale files: a failed --chat run leaves the earlier pair alone; a run without --chat on the same
    # OUT removes OUT.mask (its text mode reads the same tokenizer.json).
    pair = (read(out), read(out + ".mask"))
    rc, err = run_in("--chat", "--tokenizer", gen, "--out", out, jsonl(os.path.join(tmp, "one-bad.jsonl"),
                                                                       [{"messages": CONV1}, "{"]))
    check(rc == 2 and (read(out), read(out + ".mask")) == pair and not os.path.exists(out + ".tmp") and
          not os.path.exists(out + ".mask.tmp"),
          f"a failed --chat run leaves OUT and OUT.mask as they were ({err.strip()})")
    text = jsonl(os.path.join(tmp, "words.jsonl"), [{"text": "Hello there"}])
    rc, err = run_in("--tokenizer", gen, "--out", out, text)
    check(rc == 0 and read(out) == token_bytes([0, 8, 9, 1]) and not os.path.exists(out + ".mask"),
          f"a run without --chat removes the stale OUT.mask ({err.strip()})")

    # (c6) No token that counts at all: exit 2, nothing written.
    out6 = os.path.join(tmp, "chat-none.bin")
    none = jsonl(os.path.join(tmp, "no-assistant.jsonl"), [{"messages": CONV2}])
    rc, err = run_in("--chat", "--tokenizer", gen, "--out", out6, none)
    check(rc == 2 and "no token of the output counts" in err and not os.path.exists(out6) and
          not os.path.exists(out6 + ".mask") and not os.path.exists(out6 + ".mask.tmp"),
          f"no assistant token in the whole output exits 2, nothing written ({err.strip()})")

    # (c7) Malformed lines: exit 2 naming file:line; nothing written.
    good = {"messages": CONV1}
    for line, says in (("{not json", "not valid JSON"), ({"text": "x"}, '"messages"'),
                       ({"messages": "hi"}, "a str"), ({"messages": []}, "an empty list"),
                       ({"messages": ["hi"]}, "message 0 is a str"),
                       ({"messages": [{"role": "user"}]}, "no 'content'"),
                       ({"messages": [{"role": "user", "content": 5}]}, "'content' is 5, not a string"),
                       ({"messages": [{"role": "user", "content": [{"type": "image", "url": "a.png"}]}]},
                        "part 0 is of type 'image'"),
                       ({"conversations": [{"from": "bing", "value": "x"}]}, 'turn 0 is "from" "bing"'),
                       ({"conversations": [{"role": "user", "content": "x"}]}, 'with "from" and "value"'),
                       ({"conversations": [{"from": "system", "value": "a"}, {"from": "human", "value": "b"}],
                         "system": "c"}, "keep one"),
                       ({"prompt": "x"}, 'no "completion"'),
                       ({"prompt": "x", "completion": [{"role": "assistant", "content": "y"}]}, "a str and a list"),
                       ({"messages": CONV1, "chat_template_kwargs": {"add_generation_prompt": True}},
                        "sets add_generation_prompt")):
        bad = jsonl(os.path.join(tmp, "bad-chat.jsonl"), [good, "", line])
        rc, err = run_in("--chat", "--tokenizer", gen, "--out", out6, bad)
        check(rc == 2 and f"{bad}:3" in err and says in err and not os.path.exists(out6) and
              not os.path.exists(out6 + ".mask"), f"the line {line!r} exits 2 naming file:3 ({err.strip()})")
    # Rendering parts refuses a template that renders a message differently as the last one (and the rest
    # of the conversation, rendered on its own, does not end the whole: it starts with <s>), and an
    # assistant message first.
    unstable = os.path.join(tmp, "chat-unstable")
    chat_model(unstable, dict(config, chat_template=CHAT_TEMPLATE_UNSTABLE))
    rc, err = run_in("--chat", "--tokenizer", unstable, "--out", out6, convs)
    check(rc == 2 and f"{convs}:1" in err and "assistant message 1's tokens cannot be found" in err and
          "--chat-template" in err, f"a template no rule of Note [Assistant spans] covers exits 2 naming file:line "
                                    f"({err.strip()})")
    first = jsonl(os.path.join(tmp, "assistant-first.jsonl"), [{"messages": [{"role": "assistant", "content": "Hi"}]}])
    rc, err = run_in("--chat", "--tokenizer", plain, "--out", out6, first)
    check(rc == 2 and f"{first}:1" in err and "message 0" in err,
          f"the prefix method refuses an assistant message first ({err.strip()})")

    # (c8) A model directory without a chat template is refused, naming the fix; so are the text-only options.
    no_template = os.path.join(tmp, "chat-no-template")
    chat_model(no_template, config)
    rc, err = run_in("--chat", "--tokenizer", no_template, "--out", out6, convs)
    check(rc == 2 and "no chat template" in err and "chat_template.jinja" in err and not os.path.exists(out6),
          f"a model directory without a chat template is refused ({err.strip()})")
    rc, err = run_in("--chat", "--no-bos", "--tokenizer", gen, "--out", out6, convs)
    check(rc == 2 and "--bos/--no-bos" in err, f"--bos/--no-bos is refused with --chat ({err.strip()})")
    rc, err = run_in("--pad-rows", "--seq-len", "8", "--tokenizer", gen, "--out", out6, text)
    check(rc == 2 and "only with --chat" in err, f"--pad-rows is refused without --chat ({err.strip()})")

    # (c9) Without transformers (imports made to fail): text still tokenizes; --chat says what to install.
    block = ("import runpy, sys; sys.modules['transformers'] = None; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", block, script, "--tokenizer", gen, "--out", out6, text],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and read(out6) == token_bytes([0, 8, 9, 1]),
          f"without transformers the text mode runs ({r.stderr.strip()})")
    r = subprocess.run([sys.executable, "-c", block, script, "--chat", "--tokenizer", gen, "--out", out6, convs],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "install-deps.sh --python" in r.stderr and "Traceback" not in r.stderr,
          f"without transformers --chat exits 2 naming the fix ({r.stderr.strip()})")

    # (c10) The other formats, content lists and thinking templates, against transformers' own rendering.
    chat_format_checks(run_in, tmp)


# The formats of scripts/chat_data.py against transformers' own rendering, with a byte-level BPE (as Qwen's
# and Llama 3's) holding ChatML's tokens and a post-processor that adds <s>, and templates made here, each in
# two forms: [GEN] ... [/GEN] as {% generation %} blocks (transformers' assistant mask: the oracle) or
# dropped (what the script must find by rendering parts).
BPE_SPECIALS = ["<s>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML; a content list is printed as Python prints a list (so the script must join its parts).
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}[GEN]{{ m.content }}"
          "<|im_end|>\n[/GEN]{% else %}{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML that renders a content list itself, its parts' texts back to back.
CHATML_LISTS = CHATML.replace("{{ m.content }}", "{% if m.content is string %}{{ m.content }}{% else %}"
                                                 "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}")
# A thinking template as Qwen3's behaves (written here): an assistant message after the last user message
# shows its reasoning (reasoning_content, or <think>...</think> at the start of its content) in a <think>
# block, the last one always; earlier ones show the answer only. enable_thinking false puts an empty
# <think> block in the generation prompt.
THINKING = ("{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
            "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
            "{% for m in messages %}{% if m.role == 'assistant' %}{% set content = m.content %}"
            "{% set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}"
            "{% if '</think>' in content %}"
            "{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
            "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
            "<|im_start|>assistant\n[GEN]{% if loop.index0 > ns.last_user and (loop.last or reasoning) %}"
            "<think>\n{{ reasoning }}\n</think>\n\n{% endif %}{{ content }}<|im_end|>\n[/GEN]"
            "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
            "{% endif %}")


def blocks(template, generation):
    return template.replace("[GEN]", "{% generation %}" if generation else "").replace(
        "[/GEN]", "{% endgeneration %}" if generation else "")


def bpe_model(model_dir, template):
    os.makedirs(model_dir, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES * 4, trainers.BpeTrainer(
        vocab_size=400, special_tokens=BPE_SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    write(os.path.join(model_dir, "tokenizer_config.json"), json.dumps(config))
    if template is not None:
        write(os.path.join(model_dir, "chat_template.jinja"), template)


def text_parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


def chat_format_checks(run_in, tmp):
    import transformers
    model, base = os.path.join(tmp, "bpe-chat"), os.path.join(tmp, "bpe-base")
    bpe_model(model, blocks(CHATML, False))
    bpe_model(base, None)
    tok = transformers.AutoTokenizer.from_pretrained(model)
    templates = {}  # (name, generation) -> a --chat-template FILE
    for name, t in (("chatml-lists", CHATML_LISTS), ("thinking", THINKING)):
        for generation in (False, True):
            templates[name, generation] = os.path.join(tmp, f"{name}-{generation}.jinja")
            write(templates[name, generation], blocks(t, generation))
    out = os.path.join(tmp, "formats.bin")

    def oracle(conversations, template, **kwargs):
        """The tokens and assistant masks transformers gives, concatenated."""
        ids, mask = [], []
        for messages in conversations:
            enc = tok.apply_chat_template(messages, chat_template=template, return_dict=True,
                                          return_assistant_tokens_mask=True, **kwargs)
            ids += enc["input_ids"]
            mask += enc["assistant_masks"]
        return ids, mask

    def written(ids, mask):
        return read(out) == token_bytes(ids) and read(out + ".mask") == mask_bytes(mask)

    # (f1) "messages" with string and content-list contents, and ShareGPT, with the directory's own template
    # (ChatML, no generation blocks; it prints a list as Python does): the lists' parts joined by a space.
    listed = [{"role": "system", "content": text_parts("Be", "brief .")},
              {"role": "user", "content": text_parts("The quick brown fox", "jumps over the lazy dog.")},
              {"role": "assistant", "content": "A tiny tokenizer is trained"},
              {"role": "user", "content": "Offloading the optimizer state"},
              {"role": "assistant", "content": text_parts("keeps the", "device memory small.")}]
    joined = [dict(m, content=" ".join(p["text"] for p in m["content"])) if isinstance(m["content"], list) else m
              for m in listed]
    sharegpt = [{"from": "system", "value": "Be brief ."}, {"from": "human", "value": "Caf\u00e9 cr\u00e8me"},
                {"from": "gpt", "value": "na\u00efve r\u00e9sum\u00e9s"}, {"from": "user", "value": "bytes"},
                {"from": "assistant", "value": "beyond ASCII."}]
    as_messages = [{"role": {"human": "user", "gpt": "assistant"}.get(t["from"], t["from"]), "content": t["value"]}
                   for t in sharegpt]
    # ShareGPT's system prompt as a turn, and as LlamaFactory's top-level "system" column: the same messages.
    data = jsonl(os.path.join(tmp, "formats.jsonl"), [{"messages": listed}, {"conversations": sharegpt},
                                                      {"conversations": sharegpt[1:], "system": "Be brief ."}])
    rc, err = run_in("--chat", "--tokenizer", model, "--out", out, data)
    want = oracle([joined, as_messages, as_messages], blocks(CHATML, True))
    check(rc == 0 and written(*want) and "messages 1, sharegpt 2" in err,
          f"content lists joined by a space for a template that prints lists, and ShareGPT's roles mapped: "
          f"transformers' tokens and assistant mask ({err.strip()})")
    # (f2) --chat-template FILE that renders content lists itself: they are passed through (no space).
    rc, err = run_in("--chat", "--chat-template", templates["chatml-lists", False], "--tokenizer", model, "--out",
                     out, data)
    want2 = oracle([listed, as_messages, as_messages], blocks(CHATML_LISTS, True))
    check(rc == 0 and written(*want2) and want2[0] != want[0],
          f"--chat-template FILE, a template that renders content lists: they reach it as they are ({err.strip()})")

    # (f3) Prompt-completion, TRL's SFTTrainer rule. Conversational: what follows the prompt rendered with the
    # generation prompt counts. Standard (strings; a directory without a chat template): tokenizer(prompt +
    # completion + eos_token) with its <s>, the prompt's tokens 0.
    prompt = [{"role": "system", "content": "Be brief ."}, {"role": "user", "content": "The quick brown fox"}]
    completion = [{"role": "assistant", "content": "jumps over the lazy dog."}]
    p_ids = tok.apply_chat_template(prompt, chat_template=blocks(CHATML, False), add_generation_prompt=True)
    pc_ids = tok.apply_chat_template(prompt + completion, chat_template=blocks(CHATML, False))
    p_ids, pc_ids = list(p_ids["input_ids"]), list(pc_ids["input_ids"])
    check(pc_ids[:len(p_ids)] == p_ids, "the prompt's tokens begin prompt + completion's")
    plain = [("The quick brown fox", " jumps over the lazy dog."), ("Offloading the", " optimizer<|endoftext|>")]
    data = jsonl(os.path.join(tmp, "prompt-completion.jsonl"), [{"prompt": prompt, "completion": completion}])
    rc, err = run_in("--chat", "--tokenizer", model, "--out", out, data)
    check(rc == 0 and written(pc_ids, [0] * len(p_ids) + [1] * (len(pc_ids) - len(p_ids))),
          f"conversational prompt-completion: the completion counts, as TRL's completion_mask ({err.strip()})")
    data = jsonl(os.path.join(tmp, "plain-pc.jsonl"), [{"prompt": p, "completion": c} for p, c in plain])
    rc, err = run_in("--chat", "--tokenizer", base, "--out", out, data)
    ids, mask = [], []
    for p, c in plain:
        p_ids = tok(p)["input_ids"]
        pc_ids = tok(p + c + ("" if c.endswith("<|endoftext|>") else "<|endoftext|>"))["input_ids"]
        ids += pc_ids
        mask += [0] * len(p_ids) + [1] * (len(pc_ids) - len(p_ids))
    check(rc == 0 and written(ids, mask) and ids[0] == 0 and ids.count(1) == 2 and "prompt-completion 2" in err,
          f"standard prompt-completion: TRL's tokens (<s> first, one <|endoftext|> each) and mask ({err.strip()})")

    # (f4) A thinking template (no generation blocks), multi-turn: earlier turns render without their reasoning
    # once a later user message follows, so rendering messages[:k+1] does not begin the whole; the rest of
    # the conversation rendered on its own ends it (Note [Assistant spans]). The mask equals that of the same
    # template with generation blocks; with that template as --chat-template the blocks give it directly.
    thinking = [
        [{"role": "system", "content": "Be brief ."}, {"role": "user", "content": "The quick brown fox"},
         {"role": "assistant", "content": "jumps", "reasoning_content": "over the"},
         {"role": "user", "content": "lazy dog."},
         {"role": "assistant", "content": "<think>\nA tiny tokenizer\n</think>\n\nis trained"}],
        [{"role": "user", "content": "Offloading"}, {"role": "assistant", "content": "the optimizer"}],
        [{"role": "user", "content": "bytes"}, {"role": "assistant", "content": "<think>beyond</think>ASCII."},
         {"role": "user", "content": "Caf\u00e9"}, {"role": "assistant", "content": "cr\u00e8me"},
         {"role": "user", "content": "na\u00efve"}, {"role": "assistant", "content": "r\u00e9sum\u00e9s"}]]
    t_plain = blocks(THINKING, False)
    whole = tok.apply_chat_template(thinking[0], chat_template=t_plain, tokenize=False)
    check(not whole.startswith(tok.apply_chat_template(thinking[0][:3], chat_template=t_plain, tokenize=False)),
          "the thinking template renders an earlier turn differently once later messages follow")
    data = jsonl(os.path.join(tmp, "thinking.jsonl"), [{"messages": m} for m in thinking])
    want = oracle(thinking, blocks(THINKING, True))
    for generation in (False, True):
        rc, err = run_in("--chat", "--chat-template", templates["thinking", generation], "--tokenizer", model,
                         "--out", out, data)
        how = "from the template's {% generation %} blocks" if generation else "found by rendering prefixes"
        check(rc == 0 and written(*want) and how in err,
              f"a thinking template {how}: transformers' tokens and assistant mask ({err.strip()})")
    counted = tok.decode([i for i, m in zip(*want) if m][:40])
    check(counted.startswith("jumps<|im_end|>\n<think>\nA tiny tokenizer\n</think>\n\nis trained<|im_end|>"),
          f"the earlier turn counts as rendered (no reasoning), the last with its <think> block: {counted!r}")
    # (f5) enable_thinking false (chat_template_kwargs, as TRL passes them): the generation prompt's empty
    # <think> block does not begin an earlier turn's rendering: no exact rule, refused naming the line. A
    # single turn is fine: the answer counts, the empty block (part of the prompt) does not.
    off = {"enable_thinking": False}
    data = jsonl(os.path.join(tmp, "no-thinking.jsonl"), [{"messages": thinking[1], "chat_template_kwargs": off},
                                                         {"messages": thinking[2], "chat_template_kwargs": off}])
    rc, err = run_in("--chat", "--chat-template", templates["thinking", False], "--tokenizer", model, "--out", out,
                     data)
    check(rc == 2 and f"{data}:2" in err and "assistant message 1" in err and "--chat-template" in err,
          f"enable_thinking false on a multi-turn conversation: refused naming the line ({err.strip()})")
    data = jsonl(os.path.join(tmp, "no-thinking1.jsonl"), [{"messages": thinking[1], "chat_template_kwargs": off}])
    rc, err = run_in("--chat", "--chat-template", templates["thinking", False], "--tokenizer", model, "--out", out,
                     data)
    ids = list(tok.apply_chat_template(thinking[1], chat_template=t_plain, **off)["input_ids"])
    mask = list(read(out + ".mask")[1024:]) if rc == 0 else []
    check(rc == 0 and read(out) == token_bytes(ids) and
          tok.decode([i for i, m in zip(ids, mask) if m]) == "the optimizer<|im_end|>\n",
          f"enable_thinking false on one turn: the answer counts, not the prompt's empty <think> ({err.strip()})")


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
            # Packed: OUT.docs says where each document (its BOS) starts.
            lengths = [len(expected_file(tok, [d], bos, eos, 2)[1]) for d in docs]
            starts = [sum(lengths[:i]) for i in range(len(docs))]
            check(read(out + ".docs") == docs_file(len(tokens), starts) and "3 document starts" in r.stdout,
                  f"OUT.docs holds the documents' starts {starts} ({r.stdout.strip()})")
            r = run(script, "--tokenizer", model, "--out", out, "--no-docs", txt, jsonl)
            check(r.returncode == 0 and read(out) == want and not os.path.exists(out + ".docs"),
                  f"--no-docs writes no OUT.docs and removes a stale one ({r.stderr.strip()})")

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

        # (7) An input with no text adds no document (an empty .txt as an empty .jsonl): named on stderr,
        # and, when no input adds one, exit 2 naming it (above: empty.txt alone).
        check(empty in r.stderr, f"the run with only an empty .txt names it ({r.stderr.strip()})")
        empty_docs = os.path.join(tmp, "empty-docs.jsonl")
        write(empty_docs, json.dumps({"text": ""}) + "\n\n")
        r = run(script, "--tokenizer", model, "--out", out6, empty, empty_docs, txt)
        check(r.returncode == 0 and read(out6) == expected_file(tok, [txt_doc], bos, eos, 2)[0] and
              "1 documents" in r.stdout, f"an empty .txt and an empty text add no document ({r.stderr.strip()})")
        check(empty in r.stderr and empty_docs in r.stderr, f"inputs with no text are named: {r.stderr.strip()}")
        os.remove(out6)

        # (8) A lone surrogate in JSONL (not encodable as UTF-8): exit 2 naming file:line, nothing written.
        lone = os.path.join(tmp, "lone.jsonl")
        write(lone, json.dumps({"text": "fine"}) + "\n" + '{"text": "a\\ud800b"}\n')
        r = run(script, "--tokenizer", model, "--out", out6, lone)
        check(r.returncode == 2 and f"{lone}:2" in r.stderr and "surrogate" in r.stderr and
              "Traceback" not in r.stderr and not os.path.exists(out6),
              f"a lone surrogate exits 2 naming file:line (rc {r.returncode}: {r.stderr.strip()})")

        # (9) --out that is an input (by another spelling too, or as OUT.tmp): exit 2, the input untouched.
        before = read(txt)
        tmp_named = os.path.join(tmp, "tok.bin.tmp")  # an input named as --out tok.bin's temporary
        shutil.copy(txt, tmp_named)
        for out9, named in ((txt, txt), (os.path.join(tmp, ".", "a.txt"), txt), (tmp_named[:-4], tmp_named)):
            r = run(script, "--tokenizer", model, "--out", out9, jsonl, named)
            check(r.returncode == 2 and named in r.stderr and "--out" in r.stderr,
                  f"--out {out9} refused as the input {named} (rc {r.returncode}: {r.stderr.strip()})")
            check(read(named) == before, f"the input {named} is not overwritten")

        chat_checks(script, tmp)

        # (10) Long documents are encoded in pieces (Note [Long documents] in the script): the tokens are those
        # of encoding the whole document in one call, as .txt and as one JSONL line.
        doc = long_text(2 << 20, 1)
        long_txt, long_jsonl = os.path.join(tmp, "long.txt"), os.path.join(tmp, "long.jsonl")
        write(long_txt, doc)
        write(long_jsonl, json.dumps({"text": doc}) + "\n")
        out10 = os.path.join(tmp, "long.bin")
        r = run(script, "--tokenizer", model, "--out", out10, long_txt, long_jsonl)
        ids = [bos] + tok.encode(doc, add_special_tokens=False).ids + [eos]
        want10 = struct.pack("<256i", 20240520, 1, 2 * len(ids), *([0] * 253)) + \
            struct.pack(f"<{len(ids)}H", *ids) * 2
        check(len(doc) > 16 * mod.PIECE_CHARS, "the long document spans many pieces")
        check(r.returncode == 0 and read(out10) == want10 and "2 documents" in r.stdout and
              "warning" not in r.stderr,
              f"a long document's tokens are those of encoding it in one call ({r.stderr.strip()})")

        # The pieces' mechanics on small pieces (many cuts at the places the doc's whitespace offers), for
        # three kinds of tokenizer: byte-level BPE with GPT-2's regex (the test's), with Llama 3's regex, and
        # Llama 2's (a Prepend("▁") normalizer and no pre-tokenizer: each piece needs its context).
        llama3 = Tokenizer(models.BPE())
        llama3.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                                       r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        llama3.train_from_iterator([doc[:50000]], trainers.BpeTrainer(
            vocab_size=500, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        llama2 = Tokenizer(models.BPE(unk_token="<unk>"))
        llama2.pre_tokenizer = pre_tokenizers.Metaspace()  # to train; then as Llama 2's tokenizer.json has it
        llama2.train_from_iterator([doc[:50000]], trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>"],
                                                                      show_progress=False))
        llama2.pre_tokenizer = None
        llama2.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                  normalizers.Replace(" ", "\u2581")])
        small = doc[:40000]
        for name, t in (("gpt2", tok), ("llama3", llama3), ("llama2", llama2)):
            cutter = mod.Cutter(lambda text: t.encode(text, add_special_tokens=False).ids, piece_chars=1000)
            pieces = list(cutter.pieces("small", [small[i:i + 777] for i in range(0, len(small), 777)]))
            got = [i for p in pieces for i in t.encode(p.context + p.text, add_special_tokens=False).ids[p.skip:]]
            check(len(pieces) > 40 and "".join(p.text for p in pieces) == small and pieces[0].first and
                  pieces[-1].last and not any(p.first or p.last for p in pieces[1:-1]),
                  f"{name}: the pieces are the document in order, first and last marked")
            check(got == t.encode(small, add_special_tokens=False).ids,
                  f"{name}: the pieces' tokens are those of the document encoded in one call")
        # A stretch with no place to cut is cut at piece_chars, with a warning naming the document.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            cutter = mod.Cutter(lambda text: list(text.encode()), piece_chars=1000)
            pieces = list(cutter.pieces("blob.txt", ["ab" * 3000]))
        check([len(p.text) for p in pieces] == [1000] * 6 and pieces[1].context == "" and
              "warning: blob.txt" in err.getvalue(),
              f"a stretch with no place to cut is cut at piece_chars, with a warning ({err.getvalue().strip()})")

        # (11) Memory is bounded whatever the document's size: one ~8 MB document as .txt (read in pieces)
        # and as one ~6 MB JSONL line (decoded whole, then cut). The old script (each document encoded in one
        # call) peaked at ~120 bytes per character: ~1 GB and ~0.8 GB here; it now stays near 100 MB. Four
        # encoding threads, so that the bound holds on any machine (each thread's malloc arena keeps some
        # memory: 64 threads hold ~270 MB).
        block = long_text(1 << 20, 2)
        huge_txt, huge_jsonl = os.path.join(tmp, "huge.txt"), os.path.join(tmp, "huge.jsonl")
        write(huge_txt, block * 8)
        write(huge_jsonl, json.dumps({"text": block * 6}) + "\n")
        del block
        bound_mib = 400
        for path, chars in ((huge_txt, 8 << 20), (huge_jsonl, 6 << 20)):
            out11 = os.path.join(tmp, "huge.bin")
            rc, peak, err = run_measured(script, "--tokenizer", model, "--out", out11, path)
            data = read(out11) if rc == 0 else b""
            n = struct.unpack("<3i", data[:12])[2] if data else 0
            check(rc == 0 and n > chars // 10 and len(data) == 1024 + 2 * n and
                  data[1024:1026] == struct.pack("<H", bos) and data[-2:] == struct.pack("<H", eos),
                  f"{os.path.basename(path)} (~{chars >> 20} MB, one document): BOS, its tokens, EOS "
                  f"(rc {rc}: {err.strip()})")
            check(peak < bound_mib, f"{os.path.basename(path)}: peak RSS {peak:.0f} MiB < {bound_mib} MiB")
            print(f"{os.path.basename(path)}: {chars >> 20} MiB of text in one document, peak RSS {peak:.0f} MiB")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("PASS: scripts/tokenize_text.py writes [BOS]+doc+[EOS] per document in llm.c's uint16/uint32 format, "
          "and with --chat the template's tokens and their loss mask (unless skipped above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

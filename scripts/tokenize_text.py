#!/usr/bin/env python3
"""Turns text into a token file for `strata train --data`, with a model's own tokenizer.json.

Example:
  deps/pyenv/bin/python3 scripts/tokenize_text.py --tokenizer models/Llama-3.2-1B --out train.bin \\
      corpus.jsonl notes.txt

Inputs, in the order given: a `.jsonl` file holds one document per line (a JSON object; its "text" field,
or the --jsonl-field name; blank lines are skipped); any other file is one document. Text is UTF-8.

Each document is encoded by Hugging Face `tokenizers` without the tokenizer's own special tokens
(add_special_tokens=False, truncation and padding off), then this convention is applied: the model's BOS
id before it and its EOS id after it. BOS and EOS are looked up in the model directory's
tokenizer_config.json (bos_token / eos_token), else special_tokens_map.json, else tokenizer.json's added
tokens (<s>, <|begin_of_text|>, ... / </s>, <|end_of_text|>, ...). tokenizer_config.json's add_bos_token /
add_eos_token, where present, decide whether each is added; otherwise a token that was found is added.
--bos / --no-bos and --eos / --no-eos override that. When BOS and EOS are the same token (GPT-2's
<|endoftext|>) it is added once per document, before it, as llm.c does.

Output: llm.c's .bin (model/token_file.h): 256 little-endian int32 (magic, version, token count, 0...),
then the tokens: uint16 (magic 20240520, version 1) when the vocabulary, added tokens included, has at
most 65536 ids, else uint32 (magic 20240801, version 7). Written to OUT.tmp, then renamed.

Exit status: 0 done, 2 a usage or input error (the message says which file, and for JSONL which line).
"""

import argparse
import json
import os
import sys
from array import array

try:
    import tokenizers
except ImportError:
    tokenizers = None

LLMC_HEADER_INTS = 256
LLMC_U16 = (20240520, 1)  # (magic, version)
LLMC_U32 = (20240801, 7)
INT32_MAX = 2**31 - 1

# Fallback names, looked up in tokenizer.json's added tokens when no config names the token.
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
EOS_NAMES = ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>")

# Documents are encoded in batches of about this many characters (encode_batch runs them in parallel).
BATCH_CHARS = 4 << 20
BATCH_DOCS = 1024


class InputError(Exception):
    """A problem with the command line or the inputs: printed and exit status 2."""


def token_width(vocab_size):
    """Bytes per token in the output: 2 (uint16) when every id fits, i.e. vocab_size <= 65536, else 4."""
    return 2 if vocab_size <= 65536 else 4


def llmc_header(count, width):
    """llm.c's 1024-byte header for `count` tokens of `width` bytes."""
    magic, version = LLMC_U16 if width == 2 else LLMC_U32
    header = array("i", [0] * LLMC_HEADER_INTS)
    header[0], header[1], header[2] = magic, version, count
    if sys.byteorder == "big":
        header.byteswap()
    return header.tobytes()


def _read_json(path):
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not readable JSON ({e})")


def _token_content(value):
    """A special token as configs write it: a string, or an AddedToken object {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class Special:
    """One of BOS / EOS: the token, its id, where it was found, and whether it is added by default."""

    def __init__(self, role):
        self.role = role
        self.content = None
        self.id = None
        self.source = None
        self.default_add = True
        self.add = False


def find_specials(tok, model_dir):
    """BOS and EOS for the tokenizer `tok` from model_dir's configs, else its added tokens."""
    config = _read_json(os.path.join(model_dir, "tokenizer_config.json")) or {}
    special_map = _read_json(os.path.join(model_dir, "special_tokens_map.json")) or {}
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    result = []
    for role, names in (("bos", BOS_NAMES), ("eos", EOS_NAMES)):
        s = Special(role)
        for source, table in (("tokenizer_config.json", config), ("special_tokens_map.json", special_map)):
            content = _token_content(table.get(f"{role}_token"))
            if content is not None:
                s.content, s.source = content, source
                break
        if s.content is None:
            for name in names:
                if name in added:
                    s.content, s.source = name, "tokenizer.json's added tokens"
                    break
        if s.content is not None:
            s.id = tok.token_to_id(s.content)
            if s.id is None:
                raise InputError(f"{role}_token {s.content!r} ({s.source} in {model_dir}) is not in the "
                                 f"tokenizer's vocabulary; the model directory is inconsistent")
            flag = config.get(f"add_{role}_token")
            if isinstance(flag, bool):
                s.default_add = flag
        result.append(s)
    return result


def documents(paths, field):
    """Yields (where, text) for every document of every input, in order, reading one line at a time."""
    for path in paths:
        try:
            if not path.endswith(".jsonl"):
                with open(path, encoding="utf-8") as f:
                    yield path, f.read()
                continue
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        obj = json.loads(line)
                    except ValueError as e:
                        raise InputError(f"{where}: not valid JSON ({e})")
                    if not isinstance(obj, dict) or field not in obj:
                        raise InputError(f"{where}: no {field!r} field (set the field with --jsonl-field)")
                    if not isinstance(obj[field], str):
                        raise InputError(f"{where}: the {field!r} field is a {type(obj[field]).__name__}, "
                                         f"not a string")
                    yield where, obj[field]
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 text ({e})")
        except OSError as e:
            raise InputError(f"{path}: cannot read ({e.strerror})")


def tokenize(args):
    if tokenizers is None:
        raise InputError("the Python package `tokenizers` is not installed for " + sys.executable +
                         "; install it with `pip install tokenizers`, or run `bash scripts/install-deps.sh "
                         "--python` and use deps/pyenv/bin/python3")
    if os.path.isdir(args.tokenizer):
        model_dir, tok_path = args.tokenizer, os.path.join(args.tokenizer, "tokenizer.json")
    else:
        model_dir, tok_path = os.path.dirname(args.tokenizer) or ".", args.tokenizer
    if not os.path.isfile(tok_path):
        raise InputError(f"{tok_path}: no such file; --tokenizer takes a model directory holding "
                         f"tokenizer.json, or the tokenizer.json itself")
    for path in args.inputs:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such input file")
    try:
        tok = tokenizers.Tokenizer.from_file(tok_path)
    except Exception as e:  # the library raises plain Exception for a malformed file
        raise InputError(f"{tok_path}: not a tokenizer.json the tokenizers library can load ({e})")
    tok.no_truncation()  # a tokenizer.json may carry a max_length; documents are never cut
    tok.no_padding()

    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
    width = token_width(vocab_size)

    bos, eos = find_specials(tok, model_dir)
    for s, want in ((bos, args.bos), (eos, args.eos)):
        if s.id is None:
            if want:
                raise InputError(f"--{s.role} was given but the model defines no {s.role.upper()} token")
            print(f"tokenize: no {s.role.upper()} token in {model_dir}'s tokenizer_config.json, "
                  f"special_tokens_map.json or tokenizer.json's added tokens; documents get none",
                  file=sys.stderr)
        s.add = s.id is not None and (s.default_add if want is None else want)
    # The same token as both BOS and EOS is one separator per document, put before it (llm.c's GPT-2 files).
    shared = bos.add and eos.add and bos.id == eos.id
    prefix = [bos.id] if bos.add else []
    suffix = [eos.id] if eos.add and not shared else []

    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    tmp = args.out + ".tmp"
    count = docs = 0
    try:
        with open(tmp, "wb") as out:
            out.write(llmc_header(0, width))  # rewritten with the count at the end

            def flush(batch):
                nonlocal count
                if not batch:
                    return
                tokens = array("I")
                for enc in encode(batch, add_special_tokens=False):
                    tokens.extend(prefix)
                    tokens.extend(enc.ids)
                    tokens.extend(suffix)
                if width == 2:
                    tokens = array("H", tokens)  # every id fits: width came from the vocabulary size
                if sys.byteorder == "big":
                    tokens.byteswap()
                out.write(tokens.tobytes())
                count += len(tokens)
                if count > INT32_MAX:
                    raise InputError(f"more than {INT32_MAX} tokens do not fit llm.c's int32 header count; "
                                     f"split the inputs over several token files")

            batch, chars = [], 0
            for _, text in documents(args.inputs, args.jsonl_field):
                batch.append(text)
                chars += len(text)
                docs += 1
                if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCS:
                    flush(batch)
                    batch, chars = [], 0
            flush(batch)
            if count == 0:
                raise InputError(f"the inputs hold no tokens ({docs} documents); {args.out} was not written")
            out.seek(0)
            out.write(llmc_header(count, width))
        os.replace(tmp, args.out)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise

    def said(s, other_shared=False):
        if s.id is None:
            return f"no {s.role.upper()}"
        if not s.add:
            return f"{s.role.upper()} {s.content}={s.id} not added"
        if other_shared:
            return f"{s.role.upper()} is the same token, added once"
        return f"{s.role.upper()} {s.content}={s.id} per document"

    print(f"tokenize: {docs} documents, {count} tokens, uint{8 * width} (vocabulary {vocab_size}) -> "
          f"{args.out}; {said(bos)}, {said(eos, shared)}")


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="scripts/tokenize_text.py",
        description="Text (.txt: one document per file; .jsonl: one per line) to an llm.c token file, "
                    "with a model's own tokenizer.json. See docs/train.md.")
    p.add_argument("--tokenizer", required=True, metavar="MODEL_DIR|tokenizer.json",
                   help="a model directory holding tokenizer.json (and tokenizer_config.json), or the file")
    p.add_argument("--out", required=True, help="the token file to write (llm.c .bin)")
    p.add_argument("--jsonl-field", default="text", help="the field of a .jsonl line holding the text "
                                                         "(default: text)")
    p.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="put the model's BOS before each document (default: as tokenizer_config.json's "
                        "add_bos_token says; yes when it does not say)")
    p.add_argument("--eos", action=argparse.BooleanOptionalAction, default=None,
                   help="put the model's EOS after each document (default: as add_eos_token says; yes when "
                        "it does not say)")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files and .jsonl files, in order")
    args = p.parse_args(argv)
    try:
        tokenize(args)
    except InputError as e:
        print(f"tokenize: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # writing the output (an input that cannot be read is an InputError)
        print(f"tokenize: error: {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

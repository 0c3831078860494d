#!/usr/bin/env python3
"""Turns text into a token file for `strata train --data`, with a model's own tokenizer.json; with --chat,
turns conversations into a token file and its loss mask (supervised fine-tuning).

Example:
  deps/pyenv/bin/python3 scripts/tokenize_text.py --tokenizer models/Llama-3.2-1B --out train.bin \\
      corpus.jsonl notes.txt
  deps/pyenv/bin/python3 scripts/tokenize_text.py --chat --tokenizer models/Llama-3.2-1B-Instruct \\
      --out sft.bin conversations.jsonl        # writes sft.bin and sft.bin.mask

Inputs, in the order given: a `.jsonl` file holds one document per line (a JSON object; its "text" field,
or the --jsonl-field name; blank lines are skipped); any other file is one document. Text is UTF-8 (a
JSONL text with a lone surrogate escape such as "\\ud800", which UTF-8 cannot hold, is an error). A
document with no text (an empty file, "text": "") is no document, as a blank line is none: an input that
adds no document is named on stderr, and inputs that add none at all stop the run (exit 2).

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
most 65536 ids, else uint32 (magic 20240801, version 7). Written to OUT.tmp, then renamed; an OUT (or
OUT.tmp, OUT.mask, OUT.mask.tmp) that is one of the inputs or the tokenizer's files is refused before
anything is written.

Long documents are encoded in pieces of at most PIECE_CHARS characters, so memory stays bounded whatever
the size of a document (Note [Long documents] below says where the pieces end and when their tokens are
those of encoding the document in one call).

Chat data (--chat). Every input is JSONL, one example a line (blank lines are skipped), in one of these
formats (scripts/chat_data.py reads them; its docstring and Note [Assistant spans] have the exact rules):
  {"messages": [{"role": ..., "content": ...}, ...]}, as transformers and TRL write it (other keys of a
      message go to the template): the tokens of the conversation rendered by the chat template; the
      assistant messages count.
  {"conversations": [{"from": ..., "value": ...}, ...]} (ShareGPT): "from" human -> user, gpt ->
      assistant, system -> system (user, assistant as they are; any other is refused naming the line);
      then as "messages".
  {"prompt": "...", "completion": "..."} (TRL's standard prompt-completion): as TRL's SFTTrainer tokenizes
      it, with no chat template: tokenizer(prompt + completion + eos_token), the tokenizer's own special
      tokens added (its BOS, where it adds one); the prompt's tokens count 0, the rest (EOS included) 1.
  {"prompt": [messages], "completion": [messages]} (TRL's conversational prompt-completion): prompt +
      completion rendered by the chat template; what follows the prompt rendered with the generation prompt
      counts (TRL's completion_mask).
A line's "tools" and "chat_template_kwargs" (e.g. {"enable_thinking": false}) go to the template, as TRL
passes them. A content is a string or a list of {"type": "text", "text": ...} parts: passed as they are to
a template that handles such lists (a probe says), else joined by one space, as transformers serve does
for a text-only model. Rendering is transformers' AutoTokenizer.from_pretrained(MODEL_DIR)
.apply_chat_template (no template engine of ours) with the directory's chat template (tokenizer_config.json's
"chat_template" or chat_template.jinja), or --chat-template FILE's instead: the template carries its special
tokens, and nothing is added before, between or after examples. Which assistant tokens count: a template's
{% generation %} blocks (transformers' assistant mask) where it has them, else found by rendering parts of
the conversation — the prefix before each assistant message, and what follows it either as a prefix or, for
templates that render earlier turns differently once later ones follow (Qwen3's thinking template), as the
rest of the conversation on its own (Note [Assistant spans]); a line no exact rule covers is refused,
naming it. Needs `transformers` (and jinja2), imported only for --chat.
Beside the token file, OUT.mask holds one byte per token: 1 if the token counts when it is a target, else 0;
--train-on-prompt makes every byte 1 but a pad's. Examples are packed one after another; with --pad-rows
--seq-len T each fills one row of exactly T tokens: cut after T (counted on stderr), else padded with the
pad token (pad_token, else eos_token) whose mask is 0. The trainer's window for row s is the T + 1 tokens
from s*T: its last target is the next row's first token, which counts only if its byte is 1 (a template
never starts with an assistant token; with --train-on-prompt it counts).

Packed documents (model/packed_docs.h, Note [Packed documents]): when documents or examples are packed one
after another (the default; not with --pad-rows, whose rows each hold one example), OUT.docs says where each
starts, so that `strata train` and `strata eval` keep them apart: attention within each document only,
rotary positions from 0 in each, and no document scored on the one before it, as transformers' padding-free
packing (DataCollatorWithFlattening) computes. --no-docs leaves it out (documents then attend to each
other, as before). OUT.docs: 256 little-endian int32, [0] magic 20261204, [1] version 1, [2] and [3] the
token count as a uint64 (low, high), [4] and [5] the document count likewise, the rest 0; then one
little-endian uint64 per document, the index of its first token (increasing, the first 0). Written as
OUT.docs.tmp and renamed before OUT.tmp, as the mask is; a run that writes none removes a stale OUT.docs.

Mask file OUT.mask (model/loss_mask.h reads it): 256 little-endian int32, [0] magic 20261127, [1] version 1,
[2] and [3] the token count as a little-endian uint64 (low 32 bits, high 32 bits), the rest 0; then one
byte per token of OUT. Written as OUT.mask.tmp; once both files are complete the old OUT is removed, then
OUT.mask.tmp and OUT.tmp are renamed in that order, so that no reader pairs a token file with a mask of
another run. A run without --chat removes a stale OUT.mask before it renames OUT.tmp.

Exit status: 0 done, 2 a usage or input error (the message says which file, and for JSONL which line).
"""

import argparse
import codecs
import collections
import io
import json
import os
import re
import sys
from array import array

try:
    import tokenizers
except ImportError:
    tokenizers = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when this file is imported by path
import chat_data  # noqa: E402  (scripts/chat_data.py: the --chat formats and loss masks; no transformers import)

LLMC_HEADER_INTS = 256
LLMC_U16 = (20240520, 1)  # (magic, version)
LLMC_U32 = (20240801, 7)
INT32_MAX = 2**31 - 1
MASK_HEADER_INTS = 256
MASK_MAGIC, MASK_VERSION = 20261127, 1
DOCS_HEADER_INTS = 256
DOCS_MAGIC, DOCS_VERSION = 20261204, 1

# Fallback names, looked up in tokenizer.json's added tokens when no config names the token.
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>")
EOS_NAMES = ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>")

# Documents, and the pieces of long ones, are encoded in batches of about this many characters
# (encode_batch runs them in parallel). Memory follows the batch: `tokenizers` holds 100-200 bytes per
# character while it encodes (offsets, alignments, token strings); with 1 MiB batches the script peaks at
# ~100-160 MB resident with 2-4 encoding threads, ~270 MB with 64 (each thread's malloc arena keeps some).
BATCH_CHARS = 1 << 20
BATCH_DOCS = 1024

# Note [Long documents]
# ~~~~~~~~~~~~~~~~~~~~~
# A document longer than PIECE_CHARS characters is encoded in pieces of at most that many, so memory is
# bounded whatever its size (encoding 50 MB in one call took 7.9 GB): a text file is read PIECE_CHARS
# bytes at a time, and a JSONL line is decoded whole (a copy or two of its text), then cut.
#
# Where a piece ends. At the last place within PIECE_CHARS that is
#   (a) right before a space between two non-whitespace characters ("word| next"), or
#   (b) right after a line break between two non-whitespace characters ("end.\n|Next"),
# and where the tokenizer itself splits: the CONTEXT_CHARS characters before the place, encoded alone,
# must give the first tokens of those characters and the CONTEXT_CHARS after it encoded together (else the
# place before it is tried, up to CUT_TRIES of them). Byte-level BPE with GPT-2's or Llama 3's regex splits
# at both (a space starts the next word's pre-token; a line break between two words ends one), and so do
# Whitespace / BERT; Metaspace (SentencePiece-style) and Llama 2's tokenizer.json (no pre-tokenizer, and
# no token with "▁" after its first character) split at (a), and at (b) when no token holds "\n" with
# other characters (Llama 2 has it alone, as the byte <0x0A>).
#
# Each piece after the first is encoded with the CONTEXT_CHARS characters before it put in front, and the
# tokens of those characters (as counted when the place was checked) dropped. So a tokenizer that marks
# the start of its input (Llama 2's Prepend("▁") normalizer, a Metaspace or ByteLevel prefix space) sees
# the piece in the middle of the text, as it does when it encodes the whole document. BOS goes before the
# first piece and EOS after the last, as for a document in one piece.
#
# The tokens are those of encoding the document in one call, except:
#  - where PIECE_CHARS characters hold no such place (a run with no space or line break between words: a
#    base64 blob, a line of CJK text longer than PIECE_CHARS, a long run of whitespace; or a tokenizer that
#    merges across spaces and line breaks): the piece is cut at PIECE_CHARS, encoded without context, and a
#    warning names the document. A pre-token running across that cut is encoded as two, so the tokens next
#    to it may differ (a word in two parts, a leading space or "▁" added to the second).
#  - where what the tokenizer does at the place depends on text more than CONTEXT_CHARS characters away
#    from it, which the check cannot see: an added token whose content holds a space or line break and
#    reaches across the place, or a custom pre-tokenizer regex that joins words across a space.
# Documents of at most PIECE_CHARS characters are encoded in one call, as before.
PIECE_CHARS = 1 << 16
CONTEXT_CHARS = 64
CUT_TRIES = 32

# The places (a) and (b) of Note [Long documents]: zero-width, at the position where the next piece starts.
CUT_PLACE = re.compile(r"(?<=\S)(?= \S)|(?<=\S\n)(?=\S)")
# A UTF-16 surrogate: JSON's "\ud800" decodes to one when it is not half of a pair; UTF-8 cannot hold it.
SURROGATE = re.compile("[\ud800-\udfff]")


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


def docs_bytes(count, starts):
    """OUT.docs for `count` tokens whose documents start at `starts` (increasing, below count)."""
    header = array("I", [0] * DOCS_HEADER_INTS)
    header[0], header[1] = DOCS_MAGIC, DOCS_VERSION
    header[2], header[3] = count & 0xFFFFFFFF, count >> 32
    header[4], header[5] = len(starts) & 0xFFFFFFFF, len(starts) >> 32
    body = array("Q", starts)
    if sys.byteorder == "big":
        header.byteswap()
        body.byteswap()
    return header.tobytes() + body.tobytes()


def mask_header(count):
    """OUT.mask's 1024-byte header for `count` tokens: magic, version, the count as a uint64 (low, high)."""
    header = array("I", [0] * MASK_HEADER_INTS)
    header[0], header[1], header[2], header[3] = MASK_MAGIC, MASK_VERSION, count & 0xFFFFFFFF, count >> 32
    if sys.byteorder == "big":
        header.byteswap()
    return header.tobytes()


class Output:
    """The token file OUT being written, as OUT.tmp, and with masks=True its loss mask, as OUT.mask.tmp;
    with docs=True its document starts (start_document() before each document's tokens), written as
    OUT.docs.tmp at commit. write() appends tokens (and their mask bytes); commit() writes the counts into the
    headers and renames the files into place (the module docstring says in which order); discard() removes
    what was written."""

    def __init__(self, path, width, masks, docs=False):
        self.path, self.width, self.count = path, width, 0
        self.tmp, self.mask_path, self.mask_tmp = path + ".tmp", path + ".mask", path + ".mask.tmp"
        self.docs_path, self.docs_tmp = path + ".docs", path + ".docs.tmp"
        self.starts = array("Q") if docs else None
        self.out = self.mask = None
        try:
            self.out = open(self.tmp, "wb")
            self.out.write(llmc_header(0, width))  # rewritten with the count by commit()
            if masks:
                self.mask = open(self.mask_tmp, "wb")
                self.mask.write(mask_header(0))
        except BaseException:
            self.discard()
            raise

    def start_document(self, offset=0):
        """The next document starts `offset` tokens past what was written (an empty one adds no start)."""
        at = self.count + offset
        if self.starts is not None and (not self.starts or self.starts[-1] < at):  # else the one before was empty
            self.starts.append(at)

    def write(self, tokens, mask=None):
        """Appends `tokens` (ids, each < 2**(8 * width)) and, to the mask, `mask` (one 0/1 byte a token)."""
        if not (isinstance(tokens, array) and tokens.typecode == "I"):
            tokens = array("I", tokens)
        if self.width == 2:
            tokens = array("H", tokens)  # every id fits: width came from the vocabulary size
        if sys.byteorder == "big":
            tokens.byteswap()
        self.out.write(tokens.tobytes())
        if self.mask is not None:
            self.mask.write(mask)
        self.count += len(tokens)
        if self.count > INT32_MAX:
            raise InputError(f"more than {INT32_MAX} tokens do not fit llm.c's int32 header count; "
                             f"split the inputs over several token files")

    def commit(self):
        for f, header in ((self.out, llmc_header(self.count, self.width)), (self.mask, mask_header(self.count))):
            if f is not None:
                f.seek(0)
                f.write(header)
                f.close()
        if self.starts is not None:
            while self.starts and self.starts[-1] >= self.count:  # an empty last document starts nothing
                self.starts.pop()
            with open(self.docs_tmp, "wb") as f:
                f.write(docs_bytes(self.count, self.starts))
            if os.path.lexists(self.path):
                os.remove(self.path)  # the old tokens never pair with the new boundaries
            os.replace(self.docs_tmp, self.docs_path)
        elif os.path.lexists(self.docs_path):
            os.remove(self.docs_path)  # boundaries of an earlier packed run never pair with the new tokens
        if self.mask is not None:
            if os.path.lexists(self.path):
                os.remove(self.path)  # the old tokens never pair with the new mask
            os.replace(self.mask_tmp, self.mask_path)
        elif os.path.lexists(self.mask_path):
            os.remove(self.mask_path)  # a mask of an earlier --chat run never pairs with the new tokens
        os.replace(self.tmp, self.path)

    def discard(self):
        for f, path in ((self.out, self.tmp), (self.mask, self.mask_tmp)):
            if f is not None:
                f.close()
                if os.path.exists(path):
                    os.remove(path)
        if os.path.exists(self.docs_tmp):
            os.remove(self.docs_tmp)


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


def _text_blocks(path):
    """A text file's text, PIECE_CHARS bytes at a time, so that a large file is never held whole. Decoded
    as open(path, encoding="utf-8") reads it ("\\r\\n" and "\\r" are "\\n"), but a byte that is not UTF-8 is
    named by its offset in the file, not in the block."""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    decoder = io.IncrementalNewlineDecoder(utf8, translate=True)
    offset = 0  # bytes of the file given to the decoder so far
    try:
        with open(path, "rb") as f:
            while True:
                data = f.read(PIECE_CHARS)
                held = len(utf8.getstate()[0])  # the start of a character split by the last block
                try:
                    block = decoder.decode(data, final=not data)
                except UnicodeDecodeError as e:  # e.object is the held bytes and data
                    raise InputError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                                     f"{offset - held + e.start}: {e.reason})")
                offset += len(data)
                if block:
                    yield block
                if not data:
                    return
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})")


def jsonl_objects(path, hint=""):
    """Yields (where, obj) for every non-blank line of a JSONL file, where = "path:line"; InputError naming
    where for a line that is not JSON (`hint` follows the message), a file that is not UTF-8 or cannot be
    read. Reads one line at a time."""
    try:
        with open(path, encoding="utf-8") as f:
            lineno = 0
            for line in f:  # not enumerate(f): its tuple would keep the line alive until the next one
                lineno += 1
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise InputError(f"{where}: not valid JSON ({e}){hint}")
                del line  # a long line's text is held once, in obj, while it is encoded
                yield where, obj
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e})")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})")


def documents(paths, field):
    """Yields (path, where, blocks) for every document of every input, in order: blocks iterates over the
    document's text in pieces (a text file's, read as it goes; a JSONL line's, decoded whole). Reads one
    line at a time; each `blocks` must be used up before the next document is asked for."""
    for path in paths:
        if not path.endswith(".jsonl"):
            yield path, path, _text_blocks(path)
            continue
        for where, obj in jsonl_objects(path):
            if not isinstance(obj, dict) or field not in obj:
                raise InputError(f"{where}: no {field!r} field (set the field with --jsonl-field)")
            text = obj[field]
            del obj
            if not isinstance(text, str):
                raise InputError(f"{where}: the {field!r} field is a {type(text).__name__}, not a string")
            bad = SURROGATE.search(text)
            if bad:
                raise InputError(f"{where}: the {field!r} field is not encodable as UTF-8: it holds a "
                                 f"lone surrogate \\u{ord(bad.group()):04x} at character {bad.start()} "
                                 f"(a JSON \\u escape of half a UTF-16 pair); fix or drop that line")
            yield path, where, (text,)


# Part of a document, encoded as one text of a batch: the tokens of context + text with the first `skip`
# (the context's own) dropped. first / last: whether BOS goes before it / EOS after it.
Piece = collections.namedtuple("Piece", "text context skip first last")


class Cutter:
    """Cuts documents into pieces of at most piece_chars characters, at places where the tokenizer splits
    (Note [Long documents]). ids(text) -> the token ids of text, without special tokens."""

    def __init__(self, ids, piece_chars=PIECE_CHARS, context_chars=CONTEXT_CHARS, tries=CUT_TRIES):
        self.ids, self.piece_chars, self.context_chars, self.tries = ids, piece_chars, context_chars, tries

    def pieces(self, where, blocks):
        """Yields the document whose text comes in `blocks` (strings, in order) as Pieces, the first one
        first=True and the last one last=True; none for a document with no text."""
        buf, pos = "", 0  # the text not yet yielded is buf[pos:]; before pos, up to context_chars of context
        context, skip, first, warned = "", 0, True, False
        for block in blocks:
            keep = max(0, pos - self.context_chars)
            buf, pos = buf[keep:] + block, pos - keep  # "" + block is block: a JSONL text is not copied
            while len(buf) - pos > self.piece_chars:
                cut, next_skip = self._cut(buf, pos)
                if next_skip is None and not warned:
                    warned = True
                    print(f"tokenize: warning: {where}: {self.piece_chars} characters with no space or line "
                          f"break between words (where the tokenizer splits) to end a piece of this long "
                          f"document at; it is cut inside them, and the tokens at the cut may differ from those "
                          f"of encoding the document whole (said once per document)", file=sys.stderr)
                yield Piece(buf[pos:cut], context, skip, first, False)
                # A cut inside a pre-token has no context that would help: the next piece starts afresh.
                context = buf[max(0, cut - self.context_chars):cut] if next_skip is not None else ""
                pos, skip, first = cut, next_skip or 0, False
        if first and pos == len(buf):
            return  # no text: no document
        yield Piece(buf[pos:], context, skip, first, True)

    def _cut(self, text, pos):
        """Where the piece starting at text[pos] ends, and the count of context tokens to drop from the next
        piece: the last place of CUT_PLACE within piece_chars that the tokenizer splits at; else
        (pos + piece_chars, None)."""
        limit = pos + self.piece_chars  # text is longer than this
        tries, hi = 0, limit
        while hi > pos and tries < self.tries:
            lo = max(pos + 1, hi - 4096)  # search backwards, a window at a time
            # Places at lo..hi; the pattern looks one character behind lo and two past hi.
            places = [m.start() for m in CUT_PLACE.finditer(text, lo, min(len(text), hi + 2))
                      if m.start() <= hi]
            for place in reversed(places):
                skip = self._splits_at(text, place)
                if skip is not None:
                    return place, skip
                tries += 1
                if tries == self.tries:
                    break
            hi = lo - 1
        return limit, None

    def _splits_at(self, text, place):
        """The count of tokens of the context_chars before `place`, when those are the first tokens of the
        context and the context_chars after it encoded together (the tokenizer splits there); else None."""
        context = text[max(0, place - self.context_chars):place]
        alone = self.ids(context)
        together = self.ids(context + text[place:place + self.context_chars])
        return len(alone) if together[:len(alone)] == alone else None


def check_paths(args, tokenizer_files):
    """The inputs exist, and no file this run writes or removes (OUT, OUT.tmp, OUT.mask, OUT.mask.tmp,
    OUT.docs, OUT.docs.tmp) is one it reads: an input or one of tokenizer_files."""
    for path in args.inputs:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such input file")
    read = [(p, "the input") for p in args.inputs] + [(p, "the tokenizer's") for p in tokenizer_files]
    for path, what in read:
        for target in (args.out, args.out + ".tmp", args.out + ".mask", args.out + ".mask.tmp", args.out + ".docs",
                       args.out + ".docs.tmp"):
            if os.path.exists(target) and os.path.samefile(target, path):
                as_tmp = "" if target == args.out else f" (written or removed as {target})"
                raise InputError(f"--out {args.out}{as_tmp} is {what} {path}; writing it would overwrite "
                                 f"that file: choose another --out")


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
    check_paths(args, [tok_path])
    try:
        tok = tokenizers.Tokenizer.from_file(tok_path)
    except Exception as e:  # the library raises plain Exception for a malformed file
        raise InputError(f"{tok_path}: not a tokenizer.json the tokenizers library can load ({e})")
    tok.no_truncation()  # a tokenizer.json may carry a max_length; documents are never truncated
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
    cutter = Cutter(lambda text: tok.encode(text, add_special_tokens=False).ids)
    docs = 0
    held = collections.Counter()  # input path -> the documents it held
    out = Output(args.out, width, masks=False, docs=args.docs)
    try:
        def flush(batch):
            if not batch:
                return
            tokens = array("I")
            encodings = encode([piece.context + piece.text for piece in batch], add_special_tokens=False)
            for piece, enc in zip(batch, encodings):
                if piece.first:
                    out.start_document(len(tokens))
                    tokens.extend(prefix)
                tokens.extend(enc.ids[piece.skip:])
                if piece.last:
                    tokens.extend(suffix)
            out.write(tokens)

        batch, chars = [], 0
        for path, where, blocks in documents(args.inputs, args.jsonl_field):
            for piece in cutter.pieces(where, blocks):  # one piece unless the document is long
                if piece.first:
                    docs += 1
                    held[path] += 1
                batch.append(piece)
                chars += len(piece.context) + len(piece.text)
                if chars >= BATCH_CHARS or len(batch) >= BATCH_DOCS:
                    flush(batch)
                    batch, chars = [], 0
        flush(batch)
        # An input with no text adds no document (as a blank JSONL line adds none): said, not an error,
        # unless no input held any.
        empty = [path for path in dict.fromkeys(args.inputs) if not held[path]]
        if out.count == 0:
            why = f"; no text in {', '.join(empty)}" if empty else ""
            raise InputError(f"the inputs hold no tokens ({docs} documents{why}); {args.out} was not written")
        for path in empty:
            kind = f"no line with a non-empty {args.jsonl_field!r}" if path.endswith(".jsonl") else "empty"
            print(f"tokenize: {path}: no text ({kind}); it adds no document", file=sys.stderr)
        out.commit()
    except BaseException:
        out.discard()
        raise
    count = out.count

    def said(s, other_shared=False):
        if s.id is None:
            return f"no {s.role.upper()}"
        if not s.add:
            return f"{s.role.upper()} {s.content}={s.id} not added"
        if other_shared:
            return f"{s.role.upper()} is the same token, added once"
        return f"{s.role.upper()} {s.content}={s.id} per document"

    print(f"tokenize: {docs} documents, {count} tokens, uint{8 * width} (vocabulary {vocab_size}) -> "
          f"{args.out}; {said(bos)}, {said(eos, shared)}" +
          (f"; {len(out.starts)} document starts -> {out.docs_path}" if out.starts is not None else ""))


def examples(paths):
    """Yields (where, Example) for every line of every input (JSONL, one example a line), in order."""
    for path in paths:
        for where, obj in jsonl_objects(path, f"; --chat reads one of {chat_data.FORMATS} a line"):
            yield where, chat_data.read_example(where, obj)


def load_chat_tokenizer(model_dir):
    """transformers' tokenizer of model_dir; InputError when transformers or the tokenizer is missing."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found": not needed
    try:
        import jinja2  # noqa: F401  (transformers renders templates with it, importing it only then)
        import transformers
    except ImportError as e:
        raise InputError(f"--chat needs the Python packages `transformers` and `jinja2`, not importable by "
                         f"{sys.executable} ({e}); run `bash scripts/install-deps.sh --python` and use "
                         f"deps/pyenv/bin/python3 (or pip install transformers jinja2)")
    # Its warnings (a conversation longer than model_max_length, ...) do not apply: nothing is truncated.
    transformers.logging.set_verbosity_error()
    try:
        return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # whatever the loader raises for a directory it cannot read
        raise InputError(f"{model_dir}: transformers cannot load its tokenizer ({type(e).__name__}: {e})")


def read_template(path):
    """The text of a --chat-template FILE."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--chat-template {path}: cannot read it as UTF-8 text ({e})")
    if not text.strip():
        raise InputError(f"--chat-template {path}: the file is empty; it holds a Jinja chat template")
    return text


def pad_token(tok, model_dir):
    """(content, id, which) of the token --pad-rows pads with: pad_token, else eos_token."""
    for which in ("pad_token", "eos_token"):
        content, token_id = getattr(tok, which, None), getattr(tok, which + "_id", None)
        if content is not None and token_id is not None:
            return content, token_id, which
    raise InputError(f"--pad-rows: the tokenizer in {model_dir} has no pad_token and no eos_token to pad rows "
                     f"with; set \"pad_token\" in {model_dir}/tokenizer_config.json")


def tokenize_chat(args):
    model_dir = args.tokenizer
    files = [os.path.join(model_dir, name) for name in ("tokenizer.json", "tokenizer_config.json",
                                                        "chat_template.jinja", "special_tokens_map.json")]
    if not os.path.isdir(model_dir) or not os.path.isfile(files[0]):
        raise InputError(f"--tokenizer {model_dir}: --chat takes a model directory holding tokenizer.json (and "
                         f"its chat template: tokenizer_config.json's \"chat_template\", or chat_template.jinja), "
                         f"as transformers reads it")
    if args.chat_template is not None:
        files.append(args.chat_template)
    check_paths(args, [f for f in files if os.path.exists(f)])
    override = read_template(args.chat_template) if args.chat_template is not None else None
    tok = load_chat_tokenizer(model_dir)
    renderer = chat_data.Renderer(tok, override, model_dir)
    vocab_size = max(len(tok), max(tok.get_vocab().values(), default=-1) + 1)
    width = token_width(vocab_size)
    T = args.seq_len
    pad = pad_token(tok, model_dir) if args.pad_rows else None

    # examples; counted: tokens that count; longer: than T (cut with --pad-rows); no_target: examples; kinds
    n, kinds = collections.Counter(), collections.Counter()
    out = Output(args.out, width, masks=True, docs=args.docs and not args.pad_rows)
    try:
        for where, example in examples(args.inputs):
            ids, mask = renderer.encode(where, example, args.train_on_prompt)
            if ids and max(ids) >= vocab_size:  # never, for a consistent tokenizer; the file could not hold it
                raise InputError(f"{where}: token id {max(ids)} is outside the vocabulary of {vocab_size} ids")
            n["examples"] += 1
            kinds[example.kind] += 1
            if not args.train_on_prompt and renderer.uses_generation_blocks(where, example):
                n["generation"] += 1
            if T is not None and len(ids) > T:
                n["longer"] += 1
                if args.pad_rows:
                    ids, mask = ids[:T], mask[:T]
            if args.pad_rows and len(ids) < T:
                mask += bytes(T - len(ids))  # a pad never counts, --train-on-prompt or not
                ids += [pad[1]] * (T - len(ids))
            counted = mask.count(1)
            n["counted"] += counted
            n["no_target"] += counted == 0
            out.start_document()
            out.write(ids, mask)
        if n["examples"] == 0:
            raise InputError(f"the inputs hold no examples (only blank lines); {args.out} was not written")
        if n["counted"] == 0:
            after = f" within its first {T} tokens (--pad-rows cut the rest)" if args.pad_rows else ""
            raise InputError(f"no token of the output counts as a target: none of the {n['examples']} examples has "
                             f"an assistant or completion token{after}; {args.out} was not written "
                             f"(--train-on-prompt counts every token)")
        out.commit()
    except chat_data.ChatDataError as e:
        out.discard()
        raise InputError(str(e))
    except BaseException:
        out.discard()
        raise

    if kinds["prompt-completion"] and not tok.eos_token:
        print(f"tokenize: the tokenizer in {model_dir} has no eos_token: prompt-completion examples end without "
              f"one", file=sys.stderr)
    if args.pad_rows:
        print(f"tokenize: {n['longer']} examples were cut to --seq-len {T} tokens (their tails dropped); "
              f"shorter ones padded with {pad[2]} {pad[0]}={pad[1]}, whose mask is 0", file=sys.stderr)
    elif T is not None:
        print(f"tokenize: {n['longer']} examples are longer than --seq-len {T} tokens (packed, they run "
              f"across training windows)", file=sys.stderr)
    if n["no_target"]:
        within = f" within their {T} tokens" if args.pad_rows else ""
        print(f"tokenize: {n['no_target']} examples have no token that counts (no assistant or completion "
              f"token{within}); their mask is all 0", file=sys.stderr)
    if args.train_on_prompt:
        how = "--train-on-prompt: every token but padding"
    else:
        conversations = kinds["messages"] + kinds["sharegpt"]
        how = ", ".join(x for x in (
            f"{n['generation']} conversations' assistant turns from the template's {{% generation %}} blocks"
            if n["generation"] else "",
            f"{conversations - n['generation']} conversations' assistant turns found by rendering prefixes"
            if conversations > n["generation"] else "",
            f"{kinds['prompt-completion'] + kinds['chat prompt-completion']} completions"
            if kinds["prompt-completion"] + kinds["chat prompt-completion"] else "") if x)
    formats = ", ".join(f"{kind} {count}" for kind, count in sorted(kinds.items()))
    print(f"tokenize: {n['examples']} examples ({formats}), {out.count} tokens, {n['counted']} tokens that count "
          f"({how}); uint{8 * width} (vocabulary {vocab_size}) -> {args.out} and {out.mask_path}" +
          (f"; {len(out.starts)} example starts -> {out.docs_path}" if out.starts is not None else ""), file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="scripts/tokenize_text.py",
        description="Text (.txt: one document per file; .jsonl: one per line) to an llm.c token file, "
                    "with a model's own tokenizer.json; with --chat, conversations and prompt-completion "
                    "examples (JSONL) to a token file and its loss mask OUT.mask, with the model's own chat "
                    "template. See docs/train.md and docs/model.md.")
    p.add_argument("--tokenizer", required=True, metavar="MODEL_DIR|tokenizer.json",
                   help="a model directory holding tokenizer.json (and tokenizer_config.json), or the file; "
                        "with --chat, the model directory, holding a chat template")
    p.add_argument("--out", required=True, help="the token file to write (llm.c .bin); with --chat, its loss "
                                                "mask goes to OUT.mask (without, a stale OUT.mask is removed)")
    p.add_argument("--jsonl-field", default=None, help="the field of a .jsonl line holding the text "
                                                       "(default: text; not with --chat)")
    p.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None,
                   help="put the model's BOS before each document (default: as tokenizer_config.json's "
                        "add_bos_token says; yes when it does not say; not with --chat)")
    p.add_argument("--eos", action=argparse.BooleanOptionalAction, default=None,
                   help="put the model's EOS after each document (default: as add_eos_token says; yes when "
                        "it does not say; not with --chat)")
    chat = p.add_argument_group("chat data (supervised fine-tuning)")
    chat.add_argument("--chat", action="store_true",
                      help='inputs are JSONL, one example a line: {"messages": [...]}, ShareGPT\'s '
                           '{"conversations": [...]}, or {"prompt": ..., "completion": ...}, tokenized with the '
                           "model's chat template (transformers' apply_chat_template); writes OUT.mask: 1 for "
                           "an assistant turn's or a completion's tokens, 0 for the rest")
    chat.add_argument("--chat-template", metavar="FILE", default=None,
                      help="a Jinja chat template file used instead of the model directory's own (one with "
                           "{%% generation %%} blocks marks the tokens that count itself)")
    chat.add_argument("--train-on-prompt", action="store_true",
                      help="every token counts (mask 1), prompts included; padding still does not")
    chat.add_argument("--seq-len", type=int, default=None, metavar="T",
                      help="the training sequence length: reports the examples longer than T tokens; "
                           "with --pad-rows, the row length")
    p.add_argument("--docs", action=argparse.BooleanOptionalAction, default=True,
                   help="write OUT.docs, where each packed document (with --chat, each example) starts, so that "
                        "training keeps them apart (default: yes; not with --pad-rows, whose rows hold one "
                        "example each)")
    chat.add_argument("--pad-rows", action="store_true",
                      help="each example fills one row of exactly T (--seq-len) tokens: cut after T, "
                           "else padded with the pad token (pad_token, else eos_token), mask 0 "
                           "(default: examples are packed one after another)")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files and .jsonl files, in order "
                                                              "(with --chat, JSONL files)")
    args = p.parse_args(argv)
    if args.chat:
        given = [name for name, value in (("--jsonl-field", args.jsonl_field), ("--bos/--no-bos", args.bos),
                                          ("--eos/--no-eos", args.eos)) if value is not None]
        if given:
            p.error(f"{', '.join(given)}: not with --chat (the chat template, or TRL's prompt-completion rule, "
                    f"decides the special tokens, and each line's format its fields)")
        if args.pad_rows and args.seq_len is None:
            p.error("--pad-rows needs --seq-len T, the row length")
        if args.seq_len is not None and args.seq_len < 1:
            p.error(f"--seq-len {args.seq_len}: must be at least 1")
    else:
        given = [name for name, value in (("--train-on-prompt", args.train_on_prompt),
                                          ("--seq-len", args.seq_len is not None), ("--pad-rows", args.pad_rows),
                                          ("--chat-template", args.chat_template is not None)) if value]
        if given:
            p.error(f"{', '.join(given)}: only with --chat")
        args.jsonl_field = args.jsonl_field or "text"
    try:
        (tokenize_chat if args.chat else tokenize)(args)
    except (InputError, chat_data.ChatDataError) as e:
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

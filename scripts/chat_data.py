"""Chat data for supervised fine-tuning, for scripts/tokenize_text.py --chat: the line formats it reads
(read_example), and one example's tokens with their loss mask (Renderer.encode), rendered by transformers'
own apply_chat_template (no template engine of ours). Imports transformers only through the tokenizer it
is given.

Example:
  tok = transformers.AutoTokenizer.from_pretrained(model_dir)
  renderer = Renderer(tok, override=None)           # or the text of a --chat-template FILE
  example = read_example("chat.jsonl:3", json.loads(line))
  ids, mask = renderer.encode("chat.jsonl:3", example, train_on_prompt=False)   # mask: 1 = counts

The formats (one JSON object a line; the first of these keys that the object has decides):
  "messages"       [{"role": ..., "content": ...}, ...], as transformers and TRL read it; every key of a
                   message goes to the template. Counts: the assistant messages (Note [Assistant spans]).
  "conversations"  ShareGPT: [{"from": ..., "value": ...}, ...], "from" mapped to a role by SHAREGPT_ROLES
                   (human -> user, gpt -> assistant, system -> system; user, assistant as they are), any
                   other "from" refused; a top-level "system" string (LlamaFactory's column) becomes a
                   first system message; then as "messages".
  "prompt" and "completion", both strings (TRL's standard prompt-completion): TRL's SFTTrainer rule. The
                   completion gets the tokenizer's eos_token appended (unless it ends with it); the tokens
                   are tokenizer(prompt + completion) with the tokenizer's own special tokens (its BOS,
                   where its post-processor adds one); the first len(tokenizer(prompt)) count 0, the rest 1.
                   No chat template is used. Those prompt tokens must begin the whole's (TRL only warns).
  "prompt" and "completion", both lists of messages (TRL's conversational prompt-completion): the tokens
                   of prompt + completion rendered with the chat template; what follows the prompt rendered
                   with the generation prompt counts (TRL's completion_mask), which must begin the whole.
Other keys: "tools" (a list, or a JSON string of one) and "chat_template_kwargs" (an object, e.g.
{"enable_thinking": false}) go to every rendering of the line, as TRL passes them.

A message's content is a string or a list of content parts [{"type": "text", "text": ...}, ...] (a part
of another type is refused: the models are text-only). Lists are passed to the template as they are when
the template handles them, else each becomes its parts' texts joined by one space, as transformers' own
server (transformers serve) joins them for a text-only model. A template handles them when a probe
conversation (system, user, assistant; without the system message when the template refuses that) whose
contents are two-part lists of marker texts renders, holding every marker in order and no part's
representation ('type' or "type"): Gemma 3's and other multimodal-style templates pass; Qwen's (which
render a non-string content as "" or fail on it) and Llama 3's (which print the list's repr) do not.
"""

import json
import re
from collections import namedtuple

# How transformers decides that a template marks its assistant tokens itself (Note [Assistant spans]).
GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")
# A UTF-16 surrogate: JSON's "\ud800" decodes to one when it is not half of a pair; UTF-8 cannot hold it.
SURROGATE = re.compile("[\ud800-\udfff]")

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system"}
FORMATS = ('{"messages": [{"role", "content"}, ...]}, {"conversations": [{"from", "value"}, ...]} (ShareGPT), '
           'or {"prompt": ..., "completion": ...} (two strings, or two lists of messages)')
# apply_chat_template's own arguments and the template's `messages`: not settable by chat_template_kwargs.
RESERVED_KWARGS = {"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                   "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
                   "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
                   "tokenizer_kwargs"}

# kind: "messages", "sharegpt", "prompt-completion" (strings) or "chat prompt-completion" (messages).
# messages for the first two; prompt and completion for the others; tools and kwargs for the template.
Example = namedtuple("Example", "kind messages prompt completion tools kwargs")


class ChatDataError(Exception):
    """A line that cannot be used, or a template that cannot be used on it; the message names the line."""


def _utf8(where, what, text):
    bad = SURROGATE.search(text)
    if bad:
        raise ChatDataError(f"{where}: {what} is not encodable as UTF-8: it holds a lone surrogate "
                            f"\\u{ord(bad.group()):04x} at character {bad.start()}; fix or drop that line")


def _content(where, what, value):
    """A message's content, checked: a string, or a list of {"type": "text", "text": str} parts."""
    if isinstance(value, str):
        _utf8(where, what, value)
        return value
    if not isinstance(value, list):
        raise ChatDataError(f"{where}: {what} is {json.dumps(value)[:40]}, not a string or a list of "
                            f'{{"type": "text", "text": ...}} parts')
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            said = f"of type {kind!r}" if isinstance(kind, str) else json.dumps(part)[:40]
            raise ChatDataError(f'{where}: {what}\'s part {j} is {said}, not {{"type": "text", "text": '
                                f'"..."}} (the models Strata trains read text only)')
        _utf8(where, f"{what}'s part {j}", part["text"])
    return value


def _messages(where, key, messages):
    """obj[key], checked: a non-empty list of objects with a string role and a content (_content)."""
    if not isinstance(messages, list) or not messages:
        what = "an empty list" if isinstance(messages, list) else f"a {type(messages).__name__}"
        raise ChatDataError(f'{where}: "{key}" is {what}, not a list of {{"role", "content"}} objects')
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatDataError(f'{where}: message {i} is a {type(m).__name__}, not an object with string "role" '
                                f'and "content"')
        for k, what in (("role", "a string"), ("content", "a string or a list of text parts")):
            if k not in m:
                raise ChatDataError(f"{where}: message {i} has no {k!r} ({what})")
        if not isinstance(m["role"], str):
            raise ChatDataError(f"{where}: message {i}'s 'role' is {json.dumps(m['role'])[:40]}, not a string")
        _content(where, f"message {i}'s 'content'", m["content"])
    return messages


def _sharegpt(where, turns):
    """ShareGPT's turns as messages: "from" mapped by SHAREGPT_ROLES, "value" as the content, other keys kept."""
    if not isinstance(turns, list) or not turns:
        what = "an empty list" if isinstance(turns, list) else f"a {type(turns).__name__}"
        raise ChatDataError(f'{where}: "conversations" is {what}, not a list of {{"from", "value"}} objects')
    messages = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or "from" not in t or "value" not in t:
            raise ChatDataError(f'{where}: "conversations" turn {i} is not an object with "from" and "value" '
                                f'(ShareGPT; a list of {{"role", "content"}} goes in "messages")')
        role = SHAREGPT_ROLES.get(t["from"]) if isinstance(t["from"], str) else None
        if role is None:
            raise ChatDataError(f'{where}: "conversations" turn {i} is "from" {json.dumps(t["from"])[:40]}, '
                                f'which maps to no role; known: {", ".join(SHAREGPT_ROLES)} (write other roles '
                                f'as "messages")')
        rest = {k: v for k, v in t.items() if k not in ("from", "value")}
        messages.append({**rest, "role": role, "content": _content(where, f"turn {i}'s 'value'", t["value"])})
    return messages


def read_example(where, obj):
    """The Example of one JSONL line's object; ChatDataError naming `where` when it is none of FORMATS."""
    if not isinstance(obj, dict):
        raise ChatDataError(f"{where}: a {type(obj).__name__}, not an object; --chat reads one of {FORMATS} a line")
    tools = obj.get("tools")
    if isinstance(tools, str):  # TRL's datasets store them as a JSON string
        try:
            tools = json.loads(tools)
        except ValueError as e:
            raise ChatDataError(f'{where}: "tools" is a string that is not JSON ({e})')
    if tools is not None and not isinstance(tools, list):
        raise ChatDataError(f'{where}: "tools" is a {type(tools).__name__}, not a list of tool schemas')
    kwargs = obj.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise ChatDataError(f'{where}: "chat_template_kwargs" is a {type(kwargs).__name__}, not an object')
    taken = sorted(RESERVED_KWARGS & kwargs.keys())
    if taken:
        raise ChatDataError(f'{where}: "chat_template_kwargs" sets {", ".join(taken)}, which the script sets itself')
    if "messages" in obj:
        return Example("messages", _messages(where, "messages", obj["messages"]), None, None, tools, kwargs)
    if "conversations" in obj:
        messages = _sharegpt(where, obj["conversations"])
        system = obj.get("system")  # LlamaFactory's ShareGPT column: the system prompt beside the turns
        if system is not None:
            if not isinstance(system, str):
                raise ChatDataError(f'{where}: "system" is a {type(system).__name__}, not the system prompt\'s text')
            if messages[0]["role"] == "system":
                raise ChatDataError(f'{where}: a "system" prompt and a first turn "from" system; keep one')
            messages.insert(0, {"role": "system", "content": _content(where, '"system"', system)})
        return Example("sharegpt", messages, None, None, tools, kwargs)
    if "prompt" in obj or "completion" in obj:
        if "prompt" not in obj or "completion" not in obj:
            lacks = "completion" if "prompt" in obj else "prompt"
            raise ChatDataError(f'{where}: "prompt" and "completion" go together; this line has no "{lacks}" '
                                f'(prompt-only data is for generation, not fine-tuning)')
        prompt, completion = obj["prompt"], obj["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            _utf8(where, '"prompt"', prompt)
            _utf8(where, '"completion"', completion)
            return Example("prompt-completion", None, prompt, completion, tools, kwargs)
        if isinstance(prompt, list) and isinstance(completion, list):
            return Example("chat prompt-completion", None, _messages(where, "prompt", prompt),
                           _messages(where, "completion", completion), tools, kwargs)
        raise ChatDataError(f'{where}: "prompt" and "completion" are a {type(prompt).__name__} and a '
                            f'{type(completion).__name__}: both strings, or both lists of messages')
    raise ChatDataError(f"{where}: none of the keys of {FORMATS}; --chat reads one of them a line (plain "
                        f'{{"text": ...}} lines are tokenized without --chat)')


def _mask(offsets, spans):
    """One byte a token: 1 where the token's characters overlap one of `spans` (sorted (start, end) character
    ranges), as transformers' return_assistant_tokens_mask marks the tokens of its generation blocks."""
    mask, s = bytearray(len(offsets)), 0
    for i, (start, end) in enumerate(offsets):
        while s < len(spans) and start >= spans[s][1]:
            s += 1
        if s == len(spans):
            break
        if end > spans[s][0]:
            mask[i] = 1
    return mask


# Note [Assistant spans]
# ~~~~~~~~~~~~~~~~~~~~~~
# Which tokens of a conversation ("messages", ShareGPT) count: those of its assistant messages. The tokens
# are always those of T, the whole conversation rendered by apply_chat_template (its text tokenized with
# add_special_tokens=False, as apply_chat_template does).
#
# A template with {% generation %} ... {% endgeneration %} blocks says so itself: apply_chat_template(...,
# return_assistant_tokens_mask=True) returns "assistant_masks", 1 for every token overlapping the text a
# block rendered; that mask is used as it is.
#
# A template without them (most models') is probed by rendering parts of the conversation as text, R(...),
# the same way (tools, chat_template_kwargs), and each assistant message k gets a character span [s, e) of
# T; a token counts when it overlaps a span, the rule transformers applies to its generation blocks.
#   s: G = R(messages[:k], add_generation_prompt=True), the prompt up to where the model starts answering,
#      must begin T; s = len(G).
#   e: len(T) when k is the last message. Else, the prefix rule: Q = R(messages[:k+1]); when Q begins T
#      and len(Q) >= s, e = len(Q) (the answer and the template's end of turn). Else, the suffix rule:
#      W = R(messages[k+1:]), the rest of the conversation on its own; when it renders, ends T and
#      len(T) - len(W) >= s, e = len(T) - len(W).
#   The spans must follow one another (s at or after the previous e).
# The prefix rule holds for a template that renders every message the same whatever follows it (ChatML,
# Llama 3, Mistral, ...). The suffix rule is for templates that render earlier turns differently once
# later messages follow — Qwen3's drops an assistant message's <think> block once a later user message
# follows, and renders the last one with it — and so render Q differently from T's start. Their messages
# after k render on their own as they do in T when the template adds nothing before the first message
# (Qwen3 adds a system block only for a system message), so T = G + (message k as T renders it) + W, and
# the span is message k as T renders it: for Qwen3, "A1<|im_end|>\n" for an earlier turn and
# "<think>\n...\n</think>\n\nA2<|im_end|>\n" for the last, the same as a Qwen3 template with generation
# blocks around each assistant message after its "<|im_start|>assistant\n" marks (tested).
#
# No exact rule exists when G does not begin T (a generation prompt that the rendered turn does not start
# with, such as one opening an empty <think> block under enable_thinking false, for an earlier turn), or
# when neither rule holds (a template that renders earlier turns differently and puts something before the
# first message, such as a BOS or a default system prompt); an assistant message that opens the
# conversation has no G. The line is refused, naming it and k: give a template with {% generation %}
# blocks (--chat-template FILE), which marks the tokens itself. The prefix rule and generation blocks give
# the same mask when the blocks hold what follows the generation prompt up to the end of the turn (tested).


class Renderer:
    """Renders examples with the tokenizer `tok` (transformers') and its chat template, or `override` (the
    text of a Jinja template used instead); encode() gives an example's tokens and loss mask."""

    def __init__(self, tok, override=None, model_dir=""):
        self.tok, self.override, self.model_dir = tok, override, model_dir
        self._lists = {}  # template text -> whether it handles content lists (the module docstring's probe)

    def template(self, where, tools=None):
        """The template text a rendering with `tools` uses (transformers picks "tool_use" from a set of
        templates when tools are given); ChatDataError naming `where` when there is none."""
        if self.override is not None:
            return self.override
        try:
            template = self.tok.get_chat_template(None, tools)
        except ValueError:  # none, or several with no "default"
            template = None
        if not isinstance(template, str) or not template:
            d = self.model_dir
            raise ChatDataError(f"{where}: a conversation is rendered with a chat template and {d} has no chat "
                                f"template (a base model's directory has none): give one with --chat-template "
                                f"FILE, or add it as {d}/chat_template.jinja or as \"chat_template\" in "
                                f"{d}/tokenizer_config.json (an instruct model's directory has one)")
        return template

    def _render(self, where, messages, example, **kwargs):
        """The text of `messages` rendered; ChatDataError naming `where` when the template fails on them."""
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, chat_template=self.override,
                                                tools=example.tools, **example.kwargs, **kwargs)
        except Exception as e:  # jinja2's TemplateError, a template's raise_exception("..."), ...
            raise ChatDataError(f"{where}: the chat template fails on this conversation ({type(e).__name__}: {e})")

    def _handles_lists(self, template, tools):
        if template not in self._lists:
            self._lists[template] = self._probe_lists(tools)
        return self._lists[template]

    def _probe_lists(self, tools):
        """Whether the template (the one rendering with `tools` uses) handles content lists."""
        plain = Example("messages", None, None, None, tools, {})
        for roles in (("system", "user", "assistant"), ("user", "assistant")):
            markers = [[f"strata-probe-{i}a", f"strata-probe-{i}b"] for i in range(len(roles))]
            messages = [{"role": r, "content": [{"type": "text", "text": t} for t in m]}
                        for r, m in zip(roles, markers)]
            try:
                text = self._render("probe", messages, plain)
            except ChatDataError:
                continue  # a template that refuses the system role, say: try without it
            where = [text.find(t) for m in markers for t in m]
            return min(where) >= 0 and where == sorted(where) and "'type'" not in text and '"type"' not in text
        return False

    def _prepare(self, where, messages, example):
        """`messages` as the template gets them: content lists kept when it handles them, else joined."""
        if not any(isinstance(m["content"], list) for m in messages):
            return messages
        if self._handles_lists(self.template(where, example.tools), example.tools):
            return messages
        return [dict(m, content=" ".join(p["text"] for p in m["content"])) if isinstance(m["content"], list)
                else m for m in messages]

    def _tokens(self, text):
        """(ids, offsets) of a rendered text, tokenized as apply_chat_template tokenizes it."""
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), enc["offset_mapping"]

    def encode(self, where, example, train_on_prompt):
        """(ids, mask) of one example: its tokens, and one byte a token, 1 where it counts (the module
        docstring says which, per format; all 1 with train_on_prompt)."""
        if example.kind == "prompt-completion":
            return self._encode_plain(where, example, train_on_prompt)
        if example.kind == "chat prompt-completion":
            prompt = self._prepare(where, example.prompt, example)
            whole = prompt + self._prepare(where, example.completion, example)
            g = self._render(where, prompt, example, add_generation_prompt=True)
            t = self._render(where, whole, example)
            if not t.startswith(g):
                raise ChatDataError(f"{where}: the prompt rendered with the generation prompt does not begin the "
                                    f"rendering of prompt + completion, so the completion's tokens cannot be found "
                                    f"(the chat template renders the prompt's messages differently once the "
                                    f"completion follows); use a --chat-template FILE that does not")
            ids, offsets = self._tokens(t)
            return ids, (bytearray(b"\x01") * len(ids) if train_on_prompt else _mask(offsets, [(len(g), len(t))]))
        messages = self._prepare(where, example.messages, example)
        if train_on_prompt:
            ids, _ = self._tokens(self._render(where, messages, example))
            return ids, bytearray(b"\x01") * len(ids)
        if GENERATION_BLOCK.search(self.template(where, example.tools)):
            try:
                enc = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True, chat_template=self.override,
                                                   tools=example.tools, **example.kwargs)
            except Exception as e:
                raise ChatDataError(f"{where}: the chat template fails on this conversation "
                                    f"({type(e).__name__}: {e})")
            return list(enc["input_ids"]), bytearray(enc["assistant_masks"])
        t = self._render(where, messages, example)
        ids, offsets = self._tokens(t)
        return ids, _mask(offsets, self._spans(where, messages, example, t))

    def uses_generation_blocks(self, where, example):
        """Whether encode() takes the assistant mask from the template's {% generation %} blocks."""
        return (example.kind in ("messages", "sharegpt") and
                GENERATION_BLOCK.search(self.template(where, example.tools)) is not None)

    def _spans(self, where, messages, example, t):
        """The character spans of T = t that count (Note [Assistant spans])."""
        def refuse(k, what):
            raise ChatDataError(f"{where}: assistant message {k}'s tokens cannot be found: {what} (Note [Assistant "
                                f"spans] in scripts/chat_data.py); use a chat template that marks assistant turns "
                                f"with {{% generation %}} ... {{% endgeneration %}} blocks (--chat-template FILE)")
        spans, n = [], len(messages)
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            if k == 0:
                refuse(k, "it opens the conversation, and its start is found by rendering the messages before it; "
                          "start the conversation with a system or user message")
            g = self._render(where, messages[:k], example, add_generation_prompt=True)
            if not t.startswith(g):
                refuse(k, "the messages before it, rendered with the generation prompt, do not begin the "
                          "conversation's rendering")
            s = len(g)
            if spans and s < spans[-1][1]:
                refuse(k, "its start lies inside the previous assistant message's span")
            if k == n - 1:
                spans.append((s, len(t)))
                continue
            q = self._render(where, messages[:k + 1], example)
            if t.startswith(q) and len(q) >= s:
                spans.append((s, len(q)))
                continue
            try:
                w = self._render(where, messages[k + 1:], example)
            except ChatDataError:
                w = None
            if w is not None and t.endswith(w) and len(t) - len(w) >= s:
                spans.append((s, len(t) - len(w)))
                continue
            refuse(k, "the template renders it differently once later messages follow (messages[:k+1] do not "
                      "begin the conversation's rendering), and the messages after it, rendered on their own, "
                      "do not end it")
        return spans

    def _encode_plain(self, where, example, train_on_prompt):
        """TRL's SFTTrainer on a standard prompt-completion: EOS appended, the tokenizer's own special tokens."""
        eos = self.tok.eos_token
        completion = example.completion
        if eos and not completion.endswith(eos):
            completion += eos
        prompt_ids = list(self.tok(example.prompt)["input_ids"])
        ids = list(self.tok(example.prompt + completion)["input_ids"])
        if ids[:len(prompt_ids)] != prompt_ids:
            raise ChatDataError(f"{where}: the prompt's tokens do not begin those of prompt + completion (the "
                                f"tokenizer merges across the place where the prompt ends), so the completion's "
                                f"tokens cannot be told apart; end the prompt or start the completion with a "
                                f"space or line break")
        n = 0 if train_on_prompt else len(prompt_ids)
        return ids, bytearray(n) + bytearray(b"\x01") * (len(ids) - n)

#!/usr/bin/env python3
"""Reference dumps from an independent implementation (Hugging Face transformers on PyTorch, fp32, CPU),
llm.c-style: tests/model/reference_test.cpp checks Strata's Llama against them in CI. Run by hand, never in
CI (it needs torch and transformers); the dumps it writes are committed.

    python3 tests/reference/make_reference.py [OUT_DIR [NAME...]]   (default: tests/reference/data, all)

For each configuration below it writes OUT_DIR/<name>/:
  config.json, model.safetensors   transformers' own save_pretrained of a randomly initialised
                                   LlamaForCausalLM (fp32), exactly what `strata train --init-from` reads
  reference.safetensors            input_ids (B, T+1) stored as F32 (exact below 2^24), logits (B, T, V) of
                                   the first forward, and grad.<tensor name> for every parameter (F32)
  reference.json                   the batch shape, the first loss, the AdamW hyperparameters and the losses
                                   of STEPS AdamW steps on that same batch, the versions used

The configurations cover what the Hugging Face path must get right: grouped-query attention with an
explicit head_dim wider than hidden_size / heads and untied embeddings, tied embeddings, rope_theta 5e5, and
Llama 3.1's rope scaling; then one directory per other family (docs/model.md, "Model families"): Mistral
with a sliding window no shorter than the sequence, Qwen2 (q, k, v biases, tied), Qwen3 (per-head q/k norm,
head_dim wider than hidden_size / heads, attention_bias true so that o_proj's bias is covered too), Phi-3
(fused qkv_proj and gate_up_proj; and with longrope, its long factors and its short ones) and Gemma (norms scaling by 1 + w, embeddings times sqrt(hidden), GELU-tanh,
tied). For those, every 1-D parameter (norm weights, biases) is also drawn at random, so that a wrong norm
offset or a missing bias shows. The loss is cross-entropy on inputs shifted by one.

Sliding windows (model/config.h, Note [Sliding windows]): mistral_window, qwen2_window and phi3_window run a
window of 16 at T = 64, so that most queries see a quarter of the keys before them: Mistral and Phi-3 on
every layer, Qwen2 with use_sliding_window and max_window_layers 1 (layer 0 full, layer 1 windowed). They
are narrower than the others (hidden 32, vocabulary 128) to keep the dumps small.

Packed documents (model/packed_docs.h, Note [Packed documents]): llama_packed and mistral_window_packed
(window 16) hold rows of T + 1 = 65 tokens packed from documents of fixed lengths, run by transformers with
per-document position_ids (its padding-free packing: masking_utils' find_packed_sequence_indices) and
labels as DataCollatorWithFlattening makes them (-100 at every document's first token). They store
input_ids, position_ids and labels (B, T + 1, F32) in reference.safetensors, and in reference.json
"packed_loss" (that forward's loss) and "document_losses": [row, first token, tokens, loss] of each
document run alone (no position_ids, no other document), each document's loss in the packed row being its
loss alone (checked here within 1e-6 relative, and by tests/model/packed_documents_test.cpp for Strata).

Each family's reference.json also holds "masked_loss": transformers' own loss, model(input_ids=inputs,
labels=labels), with labels (B, T) = inputs where a fixed random draw keeps them and -100 elsewhere (stored
as "labels", F32): transformers shifts them inside the model, so position t is scored against labels[t + 1].
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file

B, T, STEPS = 2, 24, 10
WINDOW_T = 64  # the windowed dumps' sequence length (window 16)
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5,
              rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)

CONFIGS = {
    "gqa_head_dim_untied": dict(num_key_value_heads=2, head_dim=32),
    "tied": dict(tie_word_embeddings=True),
    "rope_theta_5e5": dict(rope_theta=500000.0, num_key_value_heads=2),
    "llama3_scaling": dict(rope_theta=500000.0, num_key_value_heads=2,
                           rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
}

# name: (config class, model class, overrides); the keys a family's config does not take are dropped.
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=32)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=32, attention_bias=True)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, pad_token_id=0)),
    # Phi-3's longrope (the 128k models' scaling): past the original length the long factors (T = 24 > 16),
    # within it the short ones (24 <= 32); cos and sin times the attention factor in both.
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", dict(
        num_key_value_heads=2, pad_token_id=0, original_max_position_embeddings=16,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                      "long_factor": [1.2, 1.5, 2.1, 2.9, 4.0, 5.5, 7.4, 9.9]})),
    "phi3_longrope_short": ("Phi3Config", "Phi3ForCausalLM", dict(
        num_key_value_heads=2, pad_token_id=0, original_max_position_embeddings=32,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                      "long_factor": [1.2, 1.5, 2.1, 2.9, 4.0, 5.5, 7.4, 9.9]})),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=2, head_dim=16,
                                                      tie_word_embeddings=True)),
}
SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_key_value_heads=2)
WINDOWED = {
    "mistral_window": ("MistralConfig", "MistralForCausalLM", dict(SMALL, sliding_window=16)),
    "qwen2_window": ("Qwen2Config", "Qwen2ForCausalLM", dict(SMALL, tie_word_embeddings=True,
                                                             use_sliding_window=True, sliding_window=16,
                                                             max_window_layers=1)),
    "phi3_window": ("Phi3Config", "Phi3ForCausalLM", dict(SMALL, pad_token_id=0, sliding_window=16)),
}
# Packed rows: each row's documents, by length, over T + 1 = 65 tokens (one of a single token).
PACKED = {
    "llama_packed": (None, dict(SMALL)),
    "mistral_window_packed": (("MistralConfig", "MistralForCausalLM"), dict(SMALL, sliding_window=16)),
}
PACKED_DOCS = [[20, 1, 30, 14], [40, 25]]
NOT_TAKEN = {"mistral": ("attention_bias", "mlp_bias"), "qwen2": ("attention_bias", "mlp_bias"),
             "qwen3": ("mlp_bias",), "phi3": ("attention_bias", "mlp_bias"), "gemma": ("mlp_bias",),
             "phi3_longrope": ("attention_bias", "mlp_bias"), "phi3_longrope_short": ("attention_bias", "mlp_bias"),
             "mistral_window": ("attention_bias", "mlp_bias"), "qwen2_window": ("attention_bias", "mlp_bias"),
             "phi3_window": ("attention_bias", "mlp_bias"), "mistral_window_packed": ("attention_bias", "mlp_bias")}


def make(name, overrides, out, family=None, T=T):
    kw = dict(COMMON)
    kw.update(overrides)
    torch.manual_seed(1234)
    if family is None:
        cfg = transformers.LlamaConfig(**kw)
        model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
    else:
        for k in NOT_TAKEN[name]:
            kw.pop(k, None)
        cfg = getattr(transformers, family[0])(**kw)
        model = getattr(transformers, family[1])(cfg).to(torch.float32)
    # Larger than the default 0.02 init, so that the logits and gradients are far from zero.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
            elif family is not None:  # norms around their init (1, or 0 for Gemma's 1 + w), biases around 0
                p.add_(torch.randn_like(p) * 0.1)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))

    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, kw["vocab_size"], (B, T + 1), generator=g)
    inputs, targets = ids[:, :T], ids[:, 1:]
    model.train()
    out_ = model(input_ids=inputs)
    logits = out_.logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    tensors = {"input_ids": ids.to(torch.float32).contiguous(), "logits": logits.detach().contiguous()}
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.detach().clone().contiguous()
    first = float(loss)
    masked = None
    if family is not None:
        keep = torch.rand((B, T), generator=g) < 0.5
        labels = torch.where(keep, inputs, torch.full_like(inputs, -100))
        with torch.no_grad():
            masked = float(model(input_ids=inputs, labels=labels).loss)
        tensors["labels"] = labels.to(torch.float32).contiguous()

    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    model.zero_grad()
    for _ in range(STEPS):
        opt.zero_grad()
        lg = model(input_ids=inputs).logits.float()
        l = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1))
        losses.append(float(l))
        l.backward()
        opt.step()
    save_file(tensors, os.path.join(d, "reference.safetensors"))
    meta = {"batch": B, "seq_len": T, "loss": first, "step_losses": losses,
            "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1],
                      "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"]},
            "torch": torch.__version__, "transformers": transformers.__version__}
    if masked is not None:
        meta["masked_loss"] = masked
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: loss {first:.6f}, after {STEPS} steps {losses[-1]:.6f} -> {d}")


def make_packed(name, family, overrides, out):
    kw = dict(COMMON)
    kw.update(overrides)
    torch.manual_seed(1234)
    if family is None:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).to(torch.float32)
    else:
        for k in NOT_TAKEN[name]:
            kw.pop(k, None)
        model = getattr(transformers, family[1])(getattr(transformers, family[0])(**kw)).to(torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    if os.path.exists(os.path.join(d, "generation_config.json")):
        os.remove(os.path.join(d, "generation_config.json"))
    rows, width = len(PACKED_DOCS), WINDOW_T + 1
    assert all(sum(docs) == width for docs in PACKED_DOCS)
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, kw["vocab_size"], (rows, width), generator=g)
    # DataCollatorWithFlattening: position_ids restart at 0 per document; labels are the tokens with -100 at
    # each document's first token (so no document is scored on the one before it).
    pos = torch.tensor([[p for n in docs for p in range(n)] for docs in PACKED_DOCS])
    labels = torch.where(pos == 0, torch.full_like(ids, -100), ids)
    model.eval()
    with torch.no_grad():
        # use_cache=False: transformers looks for packed sequences only without a cache (masking_utils'
        # _preprocess_mask_arguments), and an eval forward would make one.
        packed = float(model(input_ids=ids, position_ids=pos, labels=labels, use_cache=False).loss)
        per_doc, total, count = [], 0.0, 0
        for r, docs in enumerate(PACKED_DOCS):
            start = 0
            for n in docs:
                if n >= 2:  # a document of one token has no target
                    doc = ids[r:r + 1, start:start + n]
                    loss = float(model(input_ids=doc, labels=doc, use_cache=False).loss)
                    per_doc.append([r, start, n, loss])
                    total += loss * (n - 1)
                    count += n - 1
                start += n
    mean = total / count
    assert abs(packed - mean) <= 1e-6 * abs(mean), (packed, mean)  # transformers keeps them apart too
    tensors = {"input_ids": ids.to(torch.float32).contiguous(), "position_ids": pos.to(torch.float32).contiguous(),
               "labels": labels.to(torch.float32).contiguous()}
    save_file(tensors, os.path.join(d, "reference.safetensors"))
    meta = {"batch": rows, "seq_len": WINDOW_T, "packed_loss": packed, "document_losses": per_doc,
            "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: packed loss {packed:.6f} over {len(per_doc)} documents -> {d}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    only = set(sys.argv[2:])
    torch.set_num_threads(1)
    for name, ov in CONFIGS.items():
        if not only or name in only:
            make(name, ov, out)
    for name, (cfg_cls, model_cls, ov) in FAMILIES.items():
        if not only or name in only:
            make(name, ov, out, (cfg_cls, model_cls))
    for name, (cfg_cls, model_cls, ov) in WINDOWED.items():
        if not only or name in only:
            make(name, ov, out, (cfg_cls, model_cls), T=WINDOW_T)
    for name, (family, ov) in PACKED.items():
        if not only or name in only:
            make_packed(name, family, ov, out)


if __name__ == "__main__":
    main()

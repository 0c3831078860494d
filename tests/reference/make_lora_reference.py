#!/usr/bin/env python3
"""LoRA reference dumps from an independent implementation (Hugging Face transformers + PEFT on PyTorch, fp32,
CPU), llm.c-style, for the C++ test that checks Strata's LoRA against them. Run by hand, never in CI (it needs
torch, transformers and peft); the dumps it writes are committed.

    python3 tests/reference/make_lora_reference.py [OUT_DIR]      (default: tests/reference/data)

For each configuration below it writes OUT_DIR/lora_<name>/:
  base/                        transformers' own save_pretrained of a randomly initialised model (fp32,
                               safetensors), the same tiny model as make_reference.py's, family overrides
                               included, its 1-D parameters (norm weights, biases) also drawn at random
  adapter/                     PEFT's own save_pretrained of the LoRA model: adapter_config.json and
                               adapter_model.safetensors. lora_A keeps PEFT's init; every lora_B is drawn as
                               randn * 0.02 (seeded) before saving, so that the output moves and A's gradients
                               are nonzero. A modules_to_save copy is saved as PEFT saves it.
  reference.safetensors        input_ids (B, T+1) stored as F32 (exact below 2^24), logits (B, T, V) of the
                               first forward of the PEFT model, and grad.<key> (F32) for every trainable
                               parameter, <key> exactly its key in adapter_model.safetensors
  reference.json               the batch shape, the first loss, the AdamW hyperparameters and the losses of
                               STEPS AdamW steps (trainable parameters only) on that same batch, each recorded
                               before its step; the LoRA settings as given and the target_modules PEFT wrote;
                               the sorted adapter keys; PEFT's scaling (the same for every adapted module
                               here); "merged_loss", the loss of merge_and_unload() of a fresh
                               PeftModel.from_pretrained(base/, adapter/); the versions used

The configurations (all r = 8, no dropout, bias "none") cover what the PEFT path must get right: "all-linear"
with a modules_to_save lm_head on untied Llama; an explicit list with rsLoRA's alpha / sqrt(r) on Qwen2 (q, k,
v biases, tied embeddings); "all-linear" on Phi-3's fused qkv_proj and gate_up_proj; and on Mistral, target
modules given as full module paths next to a bare name, so that each layer adapts a different set. The loss is
cross-entropy on inputs shifted by one, as in make_reference.py.
"""
import json
import math
import os
import shutil
import sys

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

B, T, STEPS = 2, 24, 10
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
R, LORA_B_STD = 8, 0.02

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5,
              rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False)

# name: (config class, model class, overrides, keys its config does not take, LoRA settings, the module paths
# PEFT must adapt, or None for every linear layer but lm_head).
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2), (),
              dict(target_modules="all-linear", modules_to_save=["lm_head"], lora_alpha=16, use_rslora=False),
              None),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True),
              ("attention_bias", "mlp_bias"),
              dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                   modules_to_save=None, lora_alpha=32, use_rslora=True),
              None),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2, pad_token_id=0),
             ("attention_bias", "mlp_bias"),
             dict(target_modules="all-linear", modules_to_save=None, lora_alpha=16, use_rslora=False),
             None),
    # A full path matches only itself, a bare name every module it ends: layer 0 gets q and down, layer 1 q and k.
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=32),
                ("attention_bias", "mlp_bias"),
                dict(target_modules=["model.layers.1.self_attn.k_proj", "model.layers.0.mlp.down_proj", "q_proj"],
                     modules_to_save=None, lora_alpha=8, use_rslora=False),
                ["model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj",
                 "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.q_proj"]),
}


def shifted_loss(model, inputs, targets):
    logits = model(input_ids=inputs).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), logits


def make(name, spec, out):
    cfg_cls, model_cls, overrides, not_taken, lora, want_modules = spec
    kw = dict(COMMON)
    kw.update(overrides)
    for k in not_taken:
        kw.pop(k, None)
    torch.manual_seed(1234)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).to(torch.float32)
    # Larger than the default 0.02 init, so that the logits and gradients are far from zero; norms around 1,
    # biases around 0.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    d = os.path.join(out, "lora_" + name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    base_dir, adapter_dir = os.path.join(d, "base"), os.path.join(d, "adapter")
    model.save_pretrained(base_dir, safe_serialization=True)  # before get_peft_model, which wraps in place
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(base_dir, extra)):
            os.remove(os.path.join(base_dir, extra))

    if want_modules is None:
        want_modules = sorted(n for n, m in model.named_modules()
                              if isinstance(m, torch.nn.Linear) and n.startswith("model.layers."))

    torch.manual_seed(4321)  # lora_A's own (Kaiming-uniform) init draws from the global generator
    pcfg = LoraConfig(r=R, lora_alpha=lora["lora_alpha"], use_rslora=lora["use_rslora"],
                      target_modules=lora["target_modules"], modules_to_save=lora["modules_to_save"],
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    pm = get_peft_model(model, pcfg)
    gb = torch.Generator().manual_seed(77)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=gb) * LORA_B_STD)
    adapted = {n: m.scaling["default"] for n, m in pm.base_model.model.named_modules() if isinstance(m, LoraLayer)}
    assert sorted(adapted) == want_modules, (name, sorted(adapted))
    scalings = set(adapted.values())
    assert len(scalings) == 1, (name, adapted)
    scaling = scalings.pop()
    want_scaling = lora["lora_alpha"] / (math.sqrt(R) if lora["use_rslora"] else R)
    assert abs(scaling - want_scaling) < 1e-12, (name, scaling, want_scaling)

    pm.save_pretrained(adapter_dir, safe_serialization=True)
    if os.path.exists(os.path.join(adapter_dir, "README.md")):  # PEFT's model card, nothing to test
        os.remove(os.path.join(adapter_dir, "README.md"))
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        written = json.load(f)
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    adapter_keys = sorted(saved)

    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, kw["vocab_size"], (B, T + 1), generator=g)
    inputs, targets = ids[:, :T], ids[:, 1:]
    pm.train()
    loss, logits = shifted_loss(pm, inputs, targets)
    loss.backward()
    tensors = {"input_ids": ids.to(torch.float32).contiguous(), "logits": logits.detach().contiguous()}
    # PEFT's own renaming (adapter name dropped, modules_to_save unwrapped) maps each trainable parameter to
    # its key in adapter_model.safetensors: hand it the gradients in place of the values.
    sd = {k: v.detach() for k, v in pm.state_dict().items()}
    trainable = [(n, p) for n, p in pm.named_parameters() if p.requires_grad]
    for n, p in trainable:
        sd[n] = p.grad.detach().clone()
    grads = get_peft_model_state_dict(pm, state_dict=sd)
    assert sorted(grads) == adapter_keys, (name, sorted(grads), adapter_keys)
    assert len(grads) == len(trainable), (name, len(grads), len(trainable))
    for k, gr in grads.items():
        assert gr.shape == saved[k].shape, (name, k)
        norm = float(gr.norm())
        assert math.isfinite(norm) and norm > 0.0, (name, k, norm)
        tensors["grad." + k] = gr.to(torch.float32).contiguous()
    first = float(loss.detach())

    opt = torch.optim.AdamW([p for _, p in trainable], **ADAMW)
    losses = []
    pm.zero_grad()
    for _ in range(STEPS):
        opt.zero_grad()
        l, _ = shifted_loss(pm, inputs, targets)
        losses.append(float(l))
        l.backward()
        opt.step()
    assert losses[0] == first, (name, losses[0], first)

    # What was saved reproduces the first loss, as an adapter and merged into the base weights.
    def reload():
        base = getattr(transformers, model_cls).from_pretrained(base_dir, dtype=torch.float32)
        return PeftModel.from_pretrained(base, adapter_dir).eval()

    with torch.no_grad():
        reloaded = float(shifted_loss(reload(), inputs, targets)[0])
        merged = float(shifted_loss(reload().merge_and_unload(), inputs, targets)[0])
    assert abs(reloaded - first) <= 1e-5 * abs(first), (name, reloaded, first)
    assert abs(merged - first) <= 1e-5 * abs(first), (name, merged, first)

    save_file(tensors, os.path.join(d, "reference.safetensors"))
    meta = {"batch": B, "seq_len": T, "loss": first, "step_losses": losses,
            "adamw": {"lr": ADAMW["lr"], "beta1": ADAMW["betas"][0], "beta2": ADAMW["betas"][1],
                      "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"]},
            "lora": {"r": R, "lora_alpha": lora["lora_alpha"], "use_rslora": lora["use_rslora"],
                     "lora_dropout": 0.0, "bias": "none", "target_modules": lora["target_modules"],
                     "modules_to_save": lora["modules_to_save"]},
            "adapter_config_target_modules": written["target_modules"],
            "adapted_modules": sorted(adapted),
            "scaling": scaling,
            "adapter_keys": adapter_keys,
            "merged_loss": merged,
            "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"lora_{name}: loss {first:.6f} (merged {merged:.6f}), after {STEPS} steps {losses[-1]:.6f} -> {d}")


def main():
    # PEFT keeps target_modules as a set and writes it to adapter_config.json in set order, which follows
    # Python's per-run string hashing: fix the hash seed so that a rerun writes the same files.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    torch.set_num_threads(1)
    for name, spec in CONFIGS.items():
        make(name, spec, out)


if __name__ == "__main__":
    main()

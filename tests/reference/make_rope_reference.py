#!/usr/bin/env python3
"""Reference dumps for the rope scalings "linear" and "yarn" (transformers' modeling_rope_utils), made as
make_reference.py makes its own. Run by hand, never in CI (it needs torch and transformers); what it writes is
committed.

    python3 tests/reference/make_rope_reference.py [OUT_DIR]      (default: tests/reference/data)

It writes:
  OUT_DIR/rope_linear/, OUT_DIR/rope_yarn/   tiny random models in make_reference.py's layout (config.json,
                                             model.safetensors, reference.safetensors, reference.json with
                                             the masked loss), checked by tests/model/reference_test.cpp:
      rope_linear  Llama (one layer), linear factor 2
      rope_yarn    Qwen2 (one layer, head_dim 32), yarn factor 4 from an original context of 16 tokens, run at T = 24
                   past it; rope_theta 1000 so that the ramp between scaled and unscaled frequencies has
                   fractional steps at this width (dimensions 0..3); cos and sin times the attention factor
  OUT_DIR/rope_inv_freq.json                 for each case: a config.json's keys (as given, before
                                             transformers fills in defaults), transformers' inv_freq (fp32
                                             values) and attention factor (a python float), and the
                                             frequencies at which torch's fp32 pow of theta is not the
                                             correctly rounded one (Note [Rope arithmetic] in model/rope.cpp),
                                             checked by tests/model/rope_test.cpp
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_reference  # noqa: E402

MODELS = {
    "rope_linear": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_hidden_layers=1, num_key_value_heads=2, rope_scaling={"rope_type": "linear", "factor": 2.0}), ()),
    "rope_yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, rope_theta=1000.0,
        max_position_embeddings=64,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
        ("attention_bias", "mlp_bias")),
}

SIZES = dict(vocab_size=256, num_hidden_layers=1, intermediate_size=64)

# name: (config class, model_type, keys). Realistic widths and bases, and every yarn key.
CASES = {
    "linear_llama_factor2": ("LlamaConfig", "llama", dict(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=128, rope_theta=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "linear_llama_hd128_int_factor8": ("LlamaConfig", "llama", dict(
        hidden_size=512, num_attention_heads=4, max_position_embeddings=32768, rope_theta=10000.0,
        rope_scaling={"type": "linear", "factor": 8})),
    "linear_mistral_hd80_theta1e6": ("MistralConfig", "mistral", dict(
        hidden_size=320, num_attention_heads=4, head_dim=80, max_position_embeddings=65536,
        rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 1000000.0})),
    "yarn_qwen2_hd128_factor4": ("Qwen2Config", "qwen2", dict(
        hidden_size=512, num_attention_heads=4, max_position_embeddings=131072, rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})),
    "yarn_llama_mscale": ("LlamaConfig", "llama", dict(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=163840, rope_theta=10000.0,
        rope_parameters={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8,
                         "rope_theta": 10000.0})),
    "yarn_llama_untruncated": ("LlamaConfig", "llama", dict(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=131072, rope_theta=150000.0,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False})),
    "yarn_qwen3_factor_null_attention_factor": ("Qwen3Config", "qwen3", dict(
        hidden_size=256, num_attention_heads=4, head_dim=96, max_position_embeddings=8192,
        rope_parameters={"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 2048,
                         "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0,
                         "rope_theta": 500000.0})),
    "yarn_llama_original_from_max_position": ("LlamaConfig", "llama", dict(
        hidden_size=128, num_attention_heads=4, max_position_embeddings=4096, rope_theta=10000.0,
        rope_scaling={"rope_type": "yarn", "factor": 2.0})),
    "yarn_llama_top_level_original": ("LlamaConfig", "llama", dict(
        hidden_size=128, num_attention_heads=4, max_position_embeddings=8192, rope_theta=10000.0,
        original_max_position_embeddings=2048, rope_scaling={"rope_type": "yarn", "factor": 4.0})),
    "yarn_gemma_beta_zero_means_default": ("GemmaConfig", "gemma", dict(
        hidden_size=128, num_attention_heads=4, head_dim=32, max_position_embeddings=3072,
        rope_parameters={"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 1024,
                         "beta_fast": 0, "beta_slow": 0, "rope_theta": 10000.0})),
    "yarn_model_dir": ("Qwen2Config", "qwen2", dict(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        rope_theta=1000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16})),
}


def pow_not_correctly_rounded(theta, dim):
    """The indices where torch's fp32 theta ** (fp32(2i) / dim) is not the exact power rounded to fp32."""
    torch_pos = (theta ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)).numpy()
    e = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    exact = np.array([np.float32(math.pow(float(np.float32(theta)), float(x))) for x in e], dtype=np.float32)
    return [int(i) for i in np.nonzero(torch_pos != exact)[0]]


def inv_freq_cases():
    out = []
    for name, (cls, model_type, keys) in CASES.items():
        hf = dict(SIZES, model_type=model_type, **json.loads(json.dumps(keys)))
        cfg = getattr(transformers, cls)(**json.loads(json.dumps(keys)), **SIZES)
        rope_type = cfg.rope_parameters["rope_type"]
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](cfg)
        dim = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
        assert inv_freq.dtype == torch.float32 and inv_freq.numel() == dim // 2
        out.append({"name": name, "config": hf,
                    "inv_freq": [float(v) for v in inv_freq.tolist()],
                    "attention_factor": float(attention_factor),
                    "pow_not_correctly_rounded": pow_not_correctly_rounded(cfg.rope_parameters["rope_theta"], dim)})
        print(f"{name}: {rope_type}, attention factor {attention_factor!r}, "
              f"pow off at {out[-1]['pow_not_correctly_rounded']}")
    return out


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    torch.set_num_threads(1)
    for name, (cfg_cls, model_cls, ov, not_taken) in MODELS.items():
        make_reference.NOT_TAKEN[name] = not_taken
        make_reference.make(name, ov, out, (cfg_cls, model_cls))
    meta = {"cases": inv_freq_cases(), "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(out, "rope_inv_freq.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()

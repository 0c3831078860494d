#!/usr/bin/env python3
"""DeepSpeed ZeRO-Infinity on the CPU beside `strata train`: peak resident memory and seconds a step.

The model is transformers' LlamaForCausalLM with the dims of a Strata model JSON (configs/models/3b.json by
default), built under deepspeed.zero.Init with the parameters' home on NVMe, so that the whole model is never
in memory at once (as ZeRO-Infinity users build a model larger than memory; weights are transformers' random
init: this measures memory and time, not losses against Strata). The DeepSpeed config is Strata's config
document with its "strata" section left out, gradient accumulation 1 and nvme_path pointed at --nvme-path:
by default configs/zero3_nvme.json, the stock file `strata train` runs in bench/RESULTS.md (offload_param and
offload_optimizer on nvme, buffer_count 5 / 4, buffer_size 1e8, max_in_cpu 1e9, sub_group_size 1e8, aio 1 MiB
blocks at depth 32). DeepSpeed runs with DS_ACCELERATOR=cpu and the gloo backend, DeepSpeedCPUAdam, bf16.
Sizes the file writes as strings ("50M", "1MiB"), which Strata reads and DeepSpeed's schema refuses, are
given to DeepSpeed as the integers they stand for. The file's offload_optimizer.pipeline_read/pipeline_write
true stop DeepSpeed 0.19.8 at its first optimizer step (`assert new_alloc_buffers is not None` in its
pipelined optimizer swapper, with buffer_count 4); they are set false, DeepSpeed's default, unless
--keep-pipeline is given.

Each step runs forward, the fp32 cross-entropy of the logits against the next byte of --text (bytes as
tokens, as `strata train --text` does), backward and step; its wall time is printed. At the end: the mean
seconds a step after the first, and the process's peak resident set (getrusage ru_maxrss), as one JSON line.

Set up once (bench/train/deepspeed/setup.sh; DeepSpeed JIT-builds its CPU Adam and async I/O ops on first
use, which needs libaio-dev), then, e.g.:
  build-deepspeed/venv/bin/python bench/train/deepspeed/infinity.py --nvme-path /local_nvme --steps 3 \
      --seq-len 32 --text README.md
"""
import argparse
import json
import os
import re
import resource
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def sizes_as_integers(node):
    """Strata's size strings ("50M" elements, "1MiB" bytes) as the integers DeepSpeed's schema wants."""
    if isinstance(node, dict):
        return {k: sizes_as_integers(v) for k, v in node.items()}
    if isinstance(node, list):
        return [sizes_as_integers(v) for v in node]
    m = re.fullmatch(r"([0-9.]+)\s*(K|M|G|T|KB|MB|GB|TB|KiB|MiB|GiB|TiB|Ki|Mi|Gi|Ti)", node) if isinstance(node, str) else None
    if not m:
        return node
    unit = m.group(2)
    base = 1024 if "i" in unit else 1000
    return int(float(m.group(1)) * base ** ("KMGT".index(unit[0]) + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(REPO, "configs/models/3b.json"), help="Strata model JSON")
    ap.add_argument("--config", default=os.path.join(REPO, "configs/zero3_nvme.json"), help="DeepSpeed config")
    ap.add_argument("--nvme-path", required=True, help="directory for DeepSpeed's swap files (a real disk)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--text", default=os.path.join(REPO, "README.md"), help="text whose bytes are the tokens")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--keep-pipeline", action="store_true",
                    help="keep the config's offload_optimizer.pipeline_read/pipeline_write")
    a = ap.parse_args()

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    import torch
    import torch.nn.functional as F
    import transformers
    import deepspeed

    with open(a.model) as f:
        m = json.load(f)
    with open(a.config) as f:
        cfg = json.load(f)
    cfg = sizes_as_integers(cfg)
    cfg.pop("strata", None)
    cfg.pop("scheduler", None)  # a constant rate: the steps measured do not depend on it
    cfg["gradient_accumulation_steps"] = 1
    cfg["train_micro_batch_size_per_gpu"] = a.micro_batch
    cfg.pop("train_batch_size", None)
    for sec in ("offload_param", "offload_optimizer"):
        if sec in cfg.get("zero_optimization", {}):
            cfg["zero_optimization"][sec]["nvme_path"] = a.nvme_path
    if not a.keep_pipeline and "offload_optimizer" in cfg.get("zero_optimization", {}):
        cfg["zero_optimization"]["offload_optimizer"].update(pipeline_read=False, pipeline_write=False)

    torch.set_num_threads(a.threads)
    deepspeed.init_distributed(dist_backend="gloo")
    lc = transformers.LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["d_model"],
                                  num_hidden_layers=m["n_layers"], num_attention_heads=m["n_heads"],
                                  num_key_value_heads=m["n_kv_heads"], intermediate_size=m["ffn_dim"],
                                  max_position_embeddings=m["max_seq_len"], rope_theta=m.get("rope_theta", 10000.0),
                                  rms_norm_eps=m.get("norm_eps", 1e-5), tie_word_embeddings=m["tie_embeddings"],
                                  use_cache=False)
    # Imported before zero.Init patches tensor creation: torch._dynamo (which transformers' modeling code
    # imports lazily) checks Tensor.__new__'s signature when it loads, and refuses the patched one.
    import torch._dynamo  # noqa: F401
    model_class = transformers.LlamaForCausalLM
    t_init = time.perf_counter()
    with deepspeed.zero.Init(config_dict_or_path=cfg, remote_device="nvme", pin_memory=True, dtype=torch.bfloat16):
        model = model_class(lc)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    engine.train()
    init_s = time.perf_counter() - t_init
    print(f"infinity: {sum(p.ds_numel for p in model.parameters())} parameters, set up in {init_s:.1f} s", flush=True)

    data = open(a.text, "rb").read()
    b, t = a.micro_batch, a.seq_len
    losses, times = [], []
    for step in range(a.steps):
        off = (step * b * (t + 1)) % max(1, len(data) - b * (t + 1))
        w = torch.tensor(list(data[off:off + b * (t + 1)]), dtype=torch.int64).reshape(b, t + 1)
        t0 = time.perf_counter()
        logits = engine(input_ids=w[:, :t]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, lc.vocab_size), w[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"infinity: step {step + 1}/{a.steps} loss {losses[-1]:.4f} time {times[-1]:.1f} s, "
              f"peak resident {rss / 2**30:.2f} GiB", flush=True)
    later = times[1:] or times
    print(json.dumps({
        "bench": "deepspeed_infinity", "model": m["name"], "steps": a.steps, "seq_len": t, "micro_batch": b,
        "setup_s": init_s, "step_times": times, "mean_step_s_after_first": sum(later) / len(later),
        "losses": losses, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch": torch.__version__, "deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The command-line round trip against transformers (run by hand, like make_reference.py; needs torch and
transformers): for each reference directory,

  1. `strata eval` of the directory transformers saved equals transformers' own loss over the same
     consecutive sequences (fp32); and `strata train --init-from DIR`'s first step, on a token file that
     holds exactly one micro-batch (two sequences, in the order the sampler picks: the mean does not
     depend on it), prints transformers' loss on that batch;
  2. `strata train --init-from DIR` (fp32 config, AdamW) for a few steps, `--export OUT`: transformers'
     from_pretrained(OUT) loads the export unchanged, and its loss over those sequences equals what
     `strata eval --model OUT` prints (bf16 weights, both sides computing in fp32).

    python3 tests/reference/check_strata_cli.py STRATA_BINARY [DATA_DIR]

(1 also runs the first step with bf16 working params, bound 1e-2.) Prints one line per check with both figures and the relative difference; exits 1 if any is over its bound
(1e-4 relative for 1, 1e-3 for 2 — the bf16 export is what both sides read, so it is the fp32 bound in
effect, loosened for the different summation order over a trained model).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy
import torch
import transformers

T = 24


def token_file(path, ids):
    with open(path, "wb") as f:
        header = [20240520, 1, len(ids)] + [0] * 253
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def hf_logits(model_dir, ids, b):
    m = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    x = torch.tensor(ids[: b * T]).reshape(b, T)
    with torch.no_grad():
        return m(input_ids=x).logits.float().numpy()


def hf_loss(model_dir, ids):
    m = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    n = (len(ids) - 1) // T
    x = torch.tensor(ids[: n * T + 1])
    inputs = torch.stack([x[s * T:(s + 1) * T] for s in range(n)])
    targets = torch.stack([x[s * T + 1:(s + 1) * T + 1] for s in range(n)])
    with torch.no_grad():
        lg = m(input_ids=inputs).logits.float()
    return float(torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1))), n * T


def first_step(strata, config, model_dir, data):
    out = subprocess.run([strata, "train", "--config", config, "--init-from", model_dir, "--data", data,
                          "--seq-len", str(T), "--steps", "1", "--no-progress"],
                         capture_output=True, text=True, check=True).stdout
    return float(next(l for l in out.splitlines() if l.startswith("step 1/1")).split()[3])


def strata_eval(strata, model, data):
    out = subprocess.run([strata, "eval", "--model", model, "--data", data, "--seq-len", str(T)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[out.index("loss") + 1]), int(out[out.index("tokens") + 1])


def main():
    strata = os.path.abspath(sys.argv[1])
    data_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "data")
    torch.manual_seed(7)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ids = torch.randint(0, 256, (T * 8 + 1,)).tolist()
        data = os.path.join(tmp, "tokens.bin")
        token_file(data, ids)
        cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
               "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                     "offload_optimizer": {"device": "cpu"}},
               "strata": {"backend": "host", "seed": 1}}
        with open(os.path.join(tmp, "fp32.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(tmp, "bf16.json"), "w") as f:
            json.dump(dict(cfg, bf16={"enabled": True}), f)
        for name in sorted(os.listdir(data_dir)):
            d = os.path.join(data_dir, name)
            theirs, n = hf_loss(d, ids)
            ours, n2 = strata_eval(strata, d, data)
            rel = abs(ours - theirs) / theirs
            ok &= n == n2 and rel <= 1e-4
            print(f"{name}: eval of the saved directory: strata {ours:.9g} transformers {theirs:.9g} "
                  f"({n2} / {n} tokens) rel {rel:.2e}")
            one = os.path.join(tmp, "one-batch.bin")
            token_file(one, ids[: 2 * T + 1])
            theirs1, _ = hf_loss(d, ids[: 2 * T + 1])
            for dtype, bound in (("fp32", 1e-4), ("bf16", 1e-2)):
                first = first_step(strata, os.path.join(tmp, dtype + ".json"), d, one)
                rel = abs(first - theirs1) / theirs1
                ok &= rel <= bound
                print(f"{name}: first training step from the directory, {dtype}: strata {first:.6g} "
                      f"transformers {theirs1:.9g} rel {rel:.2e} (bound {bound:g})")
            out = os.path.join(tmp, name + "-tuned")
            subprocess.run([strata, "train", "--config", os.path.join(tmp, "fp32.json"), "--init-from", d,
                            "--data", data, "--seq-len", str(T), "--steps", "3", "--export", out,
                            "--no-progress"], capture_output=True, text=True, check=True)
            theirs, n = hf_loss(out, ids)
            ours, n2 = strata_eval(strata, out, data)
            rel = abs(ours - theirs) / theirs
            ok &= n == n2 and rel <= 1e-3
            print(f"{name}: after 3 steps, --export loaded by transformers: strata {ours:.9g} "
                  f"transformers {theirs:.9g} rel {rel:.2e}")
            lg = os.path.join(tmp, "logits.bin")
            subprocess.run([strata, "eval", "--model", out, "--data", data, "--seq-len", str(T), "--batch-size",
                            "2", "--logits", lg], capture_output=True, text=True, check=True)
            theirs_lg = hf_logits(out, ids, 2)
            ours_lg = numpy.fromfile(lg, dtype="<f4").reshape(theirs_lg.shape)
            err = float(numpy.abs(ours_lg - theirs_lg).max() / numpy.abs(theirs_lg).max())
            ok &= err <= 1e-2
            print(f"{name}: logits of the export, strata against transformers: max |diff| / max |logit| {err:.2e} "
                  f"(bf16 bound 1e-2)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

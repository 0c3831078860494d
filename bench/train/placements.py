#!/usr/bin/env python3
"""The step-time model against measured steps, and offload "auto" against the fastest measured placement.

For a model, a sequence length and each device cap given, runs `strata train` (host backend) once with every
placement (offload_param.device x offload_optimizer.device) and once with both "auto", 10 steps each, and
reads the summary's line `step time  predicted X s, measured Y s` (measured: the median of steps 3-10). A
placement that does not fit is refused before its first step and listed so. Prints a markdown table: the
prediction's error on each placement that ran, the fastest measured placement, what "auto" chose and how
much slower that one measured than the fastest (the issue asks within 10%).

  python3 bench/train/placements.py --strata build/tools/strata --model 125m --seq-len 256 \\
      --caps 1GiB 8GiB --nvme-dir /tmp/strata-placements

Standard library only. Each run's log is kept under --work (default /tmp/strata-placements/runs).
"""
import argparse
import json
import os
import re
import subprocess
import sys

DEVICES = ["none", "cpu", "nvme"]
PRED = re.compile(r"step time\s+predicted ([0-9.]+)s, measured ([0-9.]+)s")
TRAIN = re.compile(r"offload param (\w+) / optimizer (\w+)")


def config(param, optimizer, nvme_dir, micro_batch):
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": param, "pin_memory": True, "nvme_path": nvme_dir},
            "offload_optimizer": {"device": optimizer, "pin_memory": True, "nvme_path": nvme_dir},
            "sub_group_size": 1e9,
        },
        "strata": {"backend": "host"},
    }


def run(args, name, cfg, cap):
    os.makedirs(args.work, exist_ok=True)
    path = os.path.join(args.work, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    cmd = [args.strata, "train", "--config", path, "--model", args.model, "--text", args.text, "--seq-len",
           str(args.seq_len), "--steps", str(args.steps), "--device-memory-cap", cap, "--no-progress"]
    p = subprocess.run(cmd, cwd=args.work, capture_output=True, text=True)
    log = p.stdout + p.stderr
    with open(os.path.join(args.work, f"{name}.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + log)
    m = PRED.search(log)
    t = TRAIN.search(log)
    if p.returncode != 0 or not m:
        why = next((l for l in log.splitlines() if "error" in l), "exit %d" % p.returncode)
        return {"ran": False, "why": why.strip()[:140]}
    return {"ran": True, "predicted": float(m.group(1)), "measured": float(m.group(2)),
            "placement": f"{t.group(1)}/{t.group(2)}" if t else "?"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", default="build/tools/strata")
    ap.add_argument("--model", default="125m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--caps", nargs="+", default=["1GiB", "8GiB"])
    ap.add_argument("--nvme-dir", default="/tmp/strata-placements/nvme")
    ap.add_argument("--text", default=os.path.join(os.path.dirname(__file__), "..", "..", "README.md"))
    ap.add_argument("--work", default="/tmp/strata-placements/runs")
    ap.add_argument("--placements", nargs="*", default=None, help="param/optimizer pairs (default: all 9)")
    args = ap.parse_args()
    args.strata = os.path.abspath(args.strata)
    args.text = os.path.abspath(args.text)
    os.makedirs(args.nvme_dir, exist_ok=True)
    pairs = [tuple(p.split("/")) for p in args.placements] if args.placements else \
        [(a, b) for a in DEVICES for b in DEVICES]
    print(f"| model | cap | placement | predicted s | measured s | error |")
    print(f"|---|---|---|---|---|---|")
    worst = 0.0
    summary = []
    for cap in args.caps:
        results = {}
        for a, b in pairs:
            r = run(args, f"{args.model}-{cap}-{a}-{b}", config(a, b, args.nvme_dir, args.micro_batch), cap)
            results[(a, b)] = r
            if r["ran"]:
                err = r["predicted"] / r["measured"] - 1
                worst = max(worst, abs(err))
                print(f"| {args.model} | {cap} | {a} / {b} | {r['predicted']:.2f} | {r['measured']:.2f} | "
                      f"{err * 100:+.0f}% |", flush=True)
            else:
                print(f"| {args.model} | {cap} | {a} / {b} | refused | | {r['why']} |", flush=True)
        auto = run(args, f"{args.model}-{cap}-auto", config("auto", "auto", args.nvme_dir, args.micro_batch), cap)
        ran = {k: v for k, v in results.items() if v["ran"]}
        if not ran:
            summary.append(f"{args.model} at {cap}: no placement ran; auto: {auto.get('why', auto)}")
            continue
        fastest = min(ran, key=lambda k: ran[k]["measured"])
        if auto["ran"]:
            chosen = tuple(auto["placement"].split("/"))
            chosen_measured = ran[chosen]["measured"] if chosen in ran else auto["measured"]
            slower = chosen_measured / ran[fastest]["measured"] - 1
            summary.append(f"{args.model} at {cap}: fastest measured {fastest[0]} / {fastest[1]} "
                           f"({ran[fastest]['measured']:.2f} s); auto chose {chosen[0]} / {chosen[1]} "
                           f"(measured {chosen_measured:.2f} s in its own run's placement row, "
                           f"{slower * 100:+.0f}% against the fastest; auto's own run {auto['measured']:.2f} s, "
                           f"predicted {auto['predicted']:.2f} s)")
        else:
            summary.append(f"{args.model} at {cap}: auto refused: {auto['why']}")
    print()
    for line in summary:
        print("- " + line)
    print(f"- largest prediction error: {worst * 100:.0f}%")


if __name__ == "__main__":
    sys.exit(main())

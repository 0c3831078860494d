#!/usr/bin/env python3
"""Head-to-head: Strata's cpu_optim AdamW against DeepSpeed's CPU Adam on this machine.

The case is DeepSpeed's: AdamW over one shard with fp32 params, gradients and states and no
low-precision output, 28 bytes per parameter (read params, grads, exp_avg, exp_avg_sq; write params,
exp_avg, exp_avg_sq). Strata is timed by bench/cpu_adam (update "adamw gf32 sf32 o-", the SIMD target
cpu_optim picks), which also measures the read-modify-write ceiling for that traffic on the same
threads. DeepSpeed is timed through DeepSpeedCPUAdam.step() on one parameter of the same size; its op
is compiled from DeepSpeed's source by DeepSpeed's own builder (-O3 -march=native -fopenmp) on first
use, and its OpenMP thread count is set with OMP_NUM_THREADS.

The two run alternately in separate processes, --rounds times per thread count, so that drift in the
machine's memory bandwidth falls on both alike. Every figure is a median: of --reps timed steps within
a run, then over the rounds. The ratio Strata / DeepSpeed is the median of the per-round ratios.

Set up once with bench/cpu_adam/deepspeed/setup.sh, then run with that environment's python:
  build-deepspeed/venv/bin/python bench/cpu_adam/deepspeed/compare.py --bench build/bench/cpu_adam/cpu_adam
Prints a table and one JSON line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def deepspeed_worker(n, reps):
    """Times DeepSpeedCPUAdam.step() on one fp32 parameter of n elements; prints one JSON line."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.op_builder import CPUAdamBuilder

    torch.manual_seed(0)
    # The same values as bench/cpu_adam: params around 1, small gradients.
    x = (torch.arange(n, dtype=torch.int64) % 2001 - 1000).to(torch.float32) * 1e-3
    p = torch.nn.Parameter(1.0 + x)
    p.grad = 0.01 * x + 1e-4
    opt = DeepSpeedCPUAdam([p], lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adamw_mode=True,
                           fp32_optimizer_states=True)
    opt.step()  # warm-up: creates the states and touches every page
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    assert torch.isfinite(p.data).all(), "DeepSpeed's update produced non-finite params"
    builder = CPUAdamBuilder()
    print(json.dumps({
        "gparams_per_s": n / statistics.median(times) / 1e9,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
        "simd": builder.simd_width(),
        "march": builder.cpu_arch(),
        "torch": torch.__version__,
    }))


def last_json_line(text, what):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"compare: no JSON line in the output of {what}:\n{text}")


def run(cmd, env=None):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="build/bench/cpu_adam/cpu_adam", help="Strata's bench/cpu_adam binary")
    ap.add_argument("--params", type=int, default=64 << 20, help="elements per shard (default 64Mi)")
    ap.add_argument("--threads", type=int, nargs="+", default=None, help="thread counts (default: 1 and all)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating runs of each (default 5)")
    ap.add_argument("--reps", type=int, default=9, help="timed steps per run (default 9)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        deepspeed_worker(a.params, a.reps)
        return
    if not os.access(a.bench, os.X_OK):
        sys.exit(f"compare: {a.bench} is not an executable; build the project (scripts/build.sh) and pass "
                 "--bench BUILD_DIR/bench/cpu_adam/cpu_adam")
    cpus = os.cpu_count() or 1
    threads = a.threads or ([1, cpus] if cpus > 1 else [1])
    n = (a.params + 4095) // 4096 * 4096  # bench/cpu_adam rounds the same way
    env = dict(os.environ)
    env["THP_MEM_ALLOC_ENABLE"] = "1"  # torch asks for transparent huge pages, as bench/cpu_adam does

    print(f"compare: AdamW fp32 params/grads/states, no output (28 B/param), {n} params, {a.rounds} rounds "
          f"x {a.reps} reps, threads {threads}", flush=True)
    runs = {t: [] for t in threads}
    info = None
    for r in range(a.rounds):
        for t in threads:
            ds = last_json_line(
                run([sys.executable, __file__, "--worker", "--params", str(n), "--reps", str(a.reps)],
                    env=dict(env, OMP_NUM_THREADS=str(t))), "the DeepSpeed worker")
            info = info or ds
            st = last_json_line(
                run([a.bench, "--targets", "auto", "--threads", str(t), "--only", "adamw gf32 sf32 o-",
                     "--no-unfused", "--params", str(n), "--reps", str(a.reps)]), a.bench)
            row = st["results"][0]
            runs[t].append({"deepspeed": ds["gparams_per_s"], "strata": row["gparams_per_s"],
                            "ceiling": row["ceiling_gparams_per_s"], "target": row["target"]})
            print(f"  round {r + 1} threads {t}: strata {row['gparams_per_s']:.3f}  deepspeed "
                  f"{ds['gparams_per_s']:.3f}  ceiling {row['ceiling_gparams_per_s']:.3f} Gparam/s", flush=True)

    print(f"\ndeepspeed: {info['simd']} {info['march']}, torch {info['torch']}; strata target "
          f"{runs[threads[0]][0]['target']}")
    print(f"{'thr':>3} {'strata Gp/s':>12} {'frac':>6} {'deepspeed Gp/s':>15} {'frac':>6} {'ceil Gp/s':>10} "
          f"{'strata/ds':>10}")
    out = {"bench": "cpu_adam_vs_deepspeed", "params": n, "rounds": a.rounds, "reps": a.reps,
           "bytes_per_param": 28, "deepspeed_simd": info["simd"], "torch": info["torch"], "results": []}
    for t in threads:
        med = lambda k: statistics.median(x[k] for x in runs[t])
        ratio = statistics.median(x["strata"] / x["deepspeed"] for x in runs[t])
        fs = statistics.median(x["strata"] / x["ceiling"] for x in runs[t])
        fd = statistics.median(x["deepspeed"] / x["ceiling"] for x in runs[t])
        print(f"{t:>3} {med('strata'):>12.3f} {100 * fs:>5.1f}% {med('deepspeed'):>15.3f} {100 * fd:>5.1f}% "
              f"{med('ceiling'):>10.3f} {ratio:>9.3f}x")
        out["results"].append({"threads": t, "strata_gparams_per_s": med("strata"),
                               "deepspeed_gparams_per_s": med("deepspeed"), "ceiling_gparams_per_s": med("ceiling"),
                               "strata_fraction_of_ceiling": fs, "deepspeed_fraction_of_ceiling": fd,
                               "strata_over_deepspeed": ratio, "runs": runs[t]})
    print("\n" + json.dumps(out))


if __name__ == "__main__":
    main()

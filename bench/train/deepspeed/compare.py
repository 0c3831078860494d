#!/usr/bin/env python3
"""Side by side: `strata train` against DeepSpeed ZeRO-3 training the same model on the same batches.

The model is transformers' LlamaForCausalLM with the dims of a Strata preset (10m, 125m, ...), both sides
started from the same weights: Strata's seeded step-0 init, exported once per preset with
`strata train --model PRESET --steps 0 --export DIR`. DeepSpeed loads DIR with from_pretrained (fp32,
which holds the exported bf16 values exactly); `strata train` starts from it with `--init-from DIR`, so
both sides' fp32 master weights are the same numbers. The optimizer is AdamW at a constant rate (no
scheduler) with gradient clipping, bf16 on both sides.

One DeepSpeed config document drives both: ZeRO stage 3, `offload_param` and `offload_optimizer` both on
`cpu` or both on `nvme` (swap files under --workdir, which must be a real disk), bf16, the optimizer,
clipping and micro-batch. Strata reads it as it is (it reads ds_config.json); its own "strata" section
(backend, seed, threads, checkpoint_activations) and csv_monitor are added for the Strata run and left
out of DeepSpeed's. DeepSpeed runs in one process with DS_ACCELERATOR=cpu and the gloo backend (--backend
host), its optimizer DeepSpeedCPUAdam (JIT-built on first use, as are its async I/O and shared-memory ops).

The batches are `strata train`'s own: windows of seq_len + 1 tokens from strata.TokenLoader (the loader
strata train runs, seeded by strata.seed) over a byte-tokenized text. A helper process with the strata
Python package writes them to a file that the DeepSpeed worker reads; the package is not imported next to
torch (its extension loads the system's NCCL first and torch's libtorch_cuda then fails to load). Each
step, DeepSpeed runs input_ids = w[:, :T] and the loss is the fp32 cross-entropy of the logits against
w[:, 1:], which is the loss strata train computes over the same T positions.

Activation checkpointing `on` is strata.checkpoint_activations true and, on the DeepSpeed side,
transformers' activation checkpointing of every decoder layer (torch.utils.checkpoint, use_reentrant
False); `off` is false and no checkpointing.

For every (preset, offload, ckpt) cell the two run alternately in separate processes, --repeats times
each, so drift in the machine falls on both alike. tokens/s of a run is the steady state: B * T tokens per
step over the summed step times after the first --warmup steps (Strata: the per-step time_total of its
csv_monitor files; DeepSpeed: time.perf_counter around forward, loss, backward and step). The table shows
each side's median over the repeats and the median of the per-repeat ratios Strata / DeepSpeed. Then the
per-step losses of each cell's first pair side by side, and one JSON line. Logs of every run are kept
under WORKDIR/logs.

Set up once with bench/train/deepspeed/setup.sh, then run with that environment's python:
  build-deepspeed/venv/bin/python bench/train/deepspeed/compare.py --strata build/tools/strata
--backend cuda (strata train --backend cuda, DeepSpeed's CUDA accelerator with NCCL) is written but has
not been run.

--profile: where the time goes, instead of the tokens/s table. For every (preset, offload, ckpt) cell, once
(--repeats and --steps are not used):
  - Strata, model compute: build/bench/model/model_bench --preset P -B B -T T --threads N --steps 2 --bf16
    [--checkpoint] (--model-bench; default: next to --strata in its build tree). Its per-op table (op,
    phase, calls, ms/step, %step, GFLOP/s against plain sgemm of the same sizes) and its `step:` line. It
    times the model's forward and backward ops only, on weights held in memory: no offload engine, no
    optimizer.
  - Strata, whole step: `strata train` for --warmup + 1 steps; its `step time` summary line (a mean over
    all the steps, warm-up included) and the last step's forward / backward / optimizer / wait split from
    its csv_monitor files, which covers the engine's side (gathers, offload, the optimizer).
  - DeepSpeed: the worker runs --warmup + 1 steps, the last inside torch.profiler.profile (CPU activities,
    no shapes); prints key_averages() sorted by self CPU time (top 25 rows), that step's wall time split
    into forward + loss, engine.backward and engine.step, and the last (unprofiled) warm-up step's time.
    The three parts are record_function ranges ("## forward + loss ##", ...): a range's self time is the
    time in it outside torch ops, i.e. Python (module hooks, ZeRO-3's gather / release bookkeeping). C++
    that is not a torch op shows as the self time of the range around it: DeepSpeedCPUAdam's update is
    that of torch's own "Optimizer.step#DeepSpeedCPUAdam.step".
  Then one JSON line ("bench": "train_vs_deepspeed_profile"). Logs under WORKDIR/logs as usual, e.g.
  build-deepspeed/venv/bin/python bench/train/deepspeed/compare.py --strata build/tools/strata --profile \
      --presets 10m --offload cpu --ckpt off
"""
import argparse
import csv
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


# ---- the configs ----

def offload_section(device, nvme_path, what):
    """DeepSpeed's offload_param / offload_optimizer for `device` (cpu or nvme); the same keys Strata reads."""
    if device == "cpu":
        return {"device": "cpu", "pin_memory": True}
    sec = {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True}
    if what == "param":
        sec.update(buffer_count=5, buffer_size=100_000_000, max_in_cpu=1_000_000_000)
    else:
        sec.update(buffer_count=4, pipeline_read=False, pipeline_write=False)
    return sec


def ds_config(a, offload, nvme_path):
    """The document both sides read (DeepSpeed's keys only)."""
    cfg = {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": a.grad_clip,
        "steps_per_print": 10,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": a.weight_decay}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": offload_section(offload, nvme_path, "param"),
            "offload_optimizer": offload_section(offload, nvme_path, "optimizer"),
        },
    }
    if offload == "nvme":
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 2, "single_submit": False,
                      "overlap_events": True}
    return cfg


def strata_config(a, offload, nvme_path, ckpt, csv_dir=None):
    cfg = ds_config(a, offload, nvme_path)
    cfg["strata"] = {"backend": a.backend, "seed": a.seed, "threads": a.threads,
                     "checkpoint_activations": ckpt == "on"}
    if csv_dir:
        cfg["csv_monitor"] = {"enabled": True, "output_path": csv_dir, "job_name": "run"}
    return cfg


# ---- helpers ----

def run(cmd, log, env=None):
    """Runs cmd, writes its output to log; exits with the output's tail when it fails."""
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n{r.stdout}\n--- stderr ---\n{r.stderr}")
    if r.returncode != 0:
        tail = "\n".join((r.stdout + "\n" + r.stderr).splitlines()[-40:])
        sys.exit(f"compare: {' '.join(cmd)} failed ({r.returncode}); log {log}:\n{tail}")
    return r.stdout


def last_json_line(text, what):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"compare: no JSON line in the output of {what}")


def write_json(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def fs_type(path):
    """The file system type /proc/mounts gives for the mount holding path (None if unknown)."""
    path, best, kind = os.path.realpath(path), "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                mnt = fields[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, fields[2]
    except OSError:
        pass
    return kind


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steady_tokens_per_s(times, tokens_per_step, warmup):
    timed = times[warmup:]
    return tokens_per_step * len(timed) / sum(timed)


def read_csv_column(path):
    with open(path) as f:
        return [float(row[1]) for row in list(csv.reader(f))[1:]]


def default_text(out):
    """The repository's Markdown and C++ sources, one after another, as the training text."""
    files = sorted(glob.glob(os.path.join(REPO, "*.md")) + glob.glob(os.path.join(REPO, "docs", "*.md")))
    for module in ("core", "config", "nvme", "cpu_optim", "kernels", "comm", "tiering", "prefetch", "model",
                   "zero3", "tools"):
        files += sorted(glob.glob(os.path.join(REPO, module, "**", "*.[ch]*"), recursive=True))
    with open(out, "wb") as w:
        for p in files:
            with open(p, "rb") as f:
                w.write(f.read())
    return out


# ---- the strata package, in a process of its own (never beside torch) ----

HELPER = r"""
import sys, strata
op = sys.argv[1]
if op == "tokens":
    print(strata.text_to_tokens(sys.argv[2], sys.argv[3]))
else:  # batches PATH B T SEED VOCAB COUNT OUT: strata train's first COUNT (B, T + 1) int32 windows
    path, b, t, seed, vocab, count, out = sys.argv[2], *map(int, sys.argv[3:8]), sys.argv[8]
    loader = strata.TokenLoader(path, batch_size=b, seq_len=t, rank=0, world=1, seed=seed, shuffle=True,
                                drop_last_batch=True, vocab_size=vocab)
    with open(out, "wb") as f:
        for _ in range(count):
            f.write(memoryview(next(loader)))
"""


def strata_python(pythonpath):
    """A python that imports the strata package from pythonpath: this one, else Debian's."""
    env = dict(os.environ, PYTHONPATH=pythonpath + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for py in (sys.executable, "/usr/bin/python3", "python3"):
        if shutil.which(py) and subprocess.run([py, "-c", "import strata"], env=env,
                                               capture_output=True).returncode == 0:
            return py, env
    sys.exit(f"compare: no python here imports the strata package from {pythonpath}; build the project "
             "(its Python package is build/python) and pass --python-path BUILD_DIR/python")


# ---- the DeepSpeed side ----

def deepspeed_worker(spec_path):
    """One DeepSpeed run as the spec says; prints one JSON line (per-step losses and times)."""
    with open(spec_path) as f:
        spec = json.load(f)
    cuda = spec["backend"] == "cuda"
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(spec["port"]), "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ[k] = v
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers
    import deepspeed

    torch.set_num_threads(spec["threads"])
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    b, t, steps = spec["micro_batch"], spec["seq_len"], spec["steps"]
    windows = np.fromfile(spec["batches"], dtype=np.int32).reshape(-1, b, t + 1)[:steps]
    model = transformers.LlamaForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    model.config.use_cache = False
    if spec["ckpt"] == "on":
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=spec["config"])
    engine.train()
    layer = engine.module.model.layers[0]
    vocab = model.config.vocab_size
    losses, times = [], []
    profiled = spec.get("profile", False)  # --profile: the last step runs under torch.profiler
    for w in (windows[:-1] if profiled else windows):
        w = torch.from_numpy(w).to(torch.int64).to(engine.device)
        t0 = time.perf_counter()
        logits = engine(input_ids=w[:, :t]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), w[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        value = loss.item()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(value)
    extra = {}
    if profiled:
        from torch.profiler import ProfilerActivity, profile, record_function
        w = torch.from_numpy(windows[-1]).to(torch.int64).to(engine.device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, record_shapes=False) as prof:
            t0 = time.perf_counter()
            with record_function("## forward + loss ##"):
                logits = engine(input_ids=w[:, :t]).logits
                loss = F.cross_entropy(logits.float().reshape(-1, vocab), w[:, 1:].reshape(-1))
            t1 = time.perf_counter()
            with record_function("## engine.backward ##"):
                engine.backward(loss)
            t2 = time.perf_counter()
            with record_function("## engine.step ##"):
                engine.step()
            value = loss.item()
            if cuda:
                torch.cuda.synchronize()
            t3 = time.perf_counter()
        split = {"forward_loss": t1 - t0, "backward": t2 - t1, "step": t3 - t2}
        times.append(t3 - t0)
        losses.append(value)
        averages = prof.key_averages()
        top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
        extra = {"profile_table": averages.table(sort_by="self_cpu_time_total", row_limit=25),
                 "profile_split": split,
                 "profile_self_cpu_total_ms": sum(e.self_cpu_time_total for e in averages) / 1e3,
                 "profile_top": [{"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3,
                                  "total_ms": e.cpu_time_total / 1e3} for e in top]}
    print(json.dumps({
        "losses": losses, "step_times": times,
        "checkpointing": bool(getattr(layer, "gradient_checkpointing", False)),
        "param_dtype": str(next(engine.module.parameters()).dtype).replace("torch.", ""),
        "optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
        "attention": getattr(model.config, "_attn_implementation", None),
        "torch": torch.__version__, "deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        **extra,
    }))


# ---- the driver ----

def parse_steps(text, presets):
    """--steps: one count for every preset, or PRESET=N,... (presets not named get the first count)."""
    if "=" not in text:
        return {p: int(text) for p in presets}
    named = dict((k.strip(), int(v)) for k, v in (item.split("=") for item in text.split(",")))
    first = next(iter(named.values()))
    return {p: named.get(p, first) for p in presets}


def text_section(text, first, last, also=()):
    """The lines of text from the first one starting with `first` through the next starting with `last`, then
    the lines starting with any of `also`."""
    lines, inside, out = text.splitlines(), False, []
    for line in lines:
        if not inside and line.startswith(first):
            inside = True
        if inside:
            out.append(line)
            if line.startswith(last):
                break
    return out + [line for line in lines if line.startswith(tuple(also))]


def ms(x):
    return "-" if x is None else f"{x:.1f}"


def profile_cell(a, preset, offload, ckpt, n_steps, strata, model_bench, step0, tokens, batches, run_dir, logs,
                 name, env):
    """--profile of one cell: model_bench's per-op table, strata train's step split, DeepSpeed's profiled step."""
    print(f"\n==== {preset} {offload} ckpt {ckpt}: where the time goes ====", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    nvme = os.path.join(run_dir, "nvme")
    os.makedirs(nvme)

    # Strata, the model's compute per op (no engine)
    cmd = [model_bench, "--preset", preset, "-B", str(a.micro_batch), "-T", str(a.seq_len), "--threads",
           str(a.threads), "--steps", "2", "--bf16"] + (["--checkpoint"] if ckpt == "on" else [])
    out = run(cmd, os.path.join(logs, f"{name}-profile-model_bench.log"), env=env)
    mb = last_json_line(out, "model_bench")
    print(f"\n-- Strata, model compute per op (host CPU ops, no offload engine, no optimizer): {' '.join(cmd)}")
    print("\n".join(text_section(out, "model ", "(* attention", also=("step:",))), flush=True)

    # Strata, the whole step (engine included)
    cfg = os.path.join(run_dir, "strata.json")
    write_json(cfg, strata_config(a, offload, nvme, ckpt, csv_dir=run_dir))
    out = run([strata, "train", "--config", cfg, "--init-from", step0, "--data", tokens, "--seq-len", str(a.seq_len),
               "--steps", str(n_steps), "--backend", a.backend, "--no-progress"],
              os.path.join(logs, f"{name}-profile-strata.log"), env=env)
    if f"(checkpointing {ckpt}," not in out:
        sys.exit(f"compare: strata train's device plan does not show checkpointing {ckpt}:\n{out}")
    split = {k: read_csv_column(os.path.join(run_dir, "run", f"Train_Samples_time_{k}.csv"))[-1] * 1e3
             for k in ("total", "forward", "backward", "optimizer", "wait")}
    shutil.rmtree(nvme)
    os.makedirs(nvme)
    print(f"\n-- Strata, strata train {n_steps} steps ({offload} offload, checkpointing {ckpt}); log "
          f"{os.path.join(logs, name + '-profile-strata.log')}")
    print("\n".join(line for line in out.splitlines() if line.startswith(("  step time", "  prefetch"))))
    print(f"  step {n_steps}: {split['total']:.1f} ms: forward {split['forward']:.1f}, backward "
          f"{split['backward']:.1f}, optimizer {split['optimizer']:.1f}; waiting on transfers {split['wait']:.1f} "
          "(csv_monitor)", flush=True)

    # DeepSpeed, the last step under torch.profiler
    spec = os.path.join(run_dir, "deepspeed.json")
    write_json(spec, {"backend": a.backend, "port": free_port(), "threads": a.threads, "micro_batch": a.micro_batch,
                      "seq_len": a.seq_len, "steps": n_steps, "batches": batches, "model": step0, "ckpt": ckpt,
                      "config": ds_config(a, offload, nvme), "profile": True})
    ds = last_json_line(run([sys.executable, os.path.abspath(__file__), "--worker", spec],
                            os.path.join(logs, f"{name}-profile-deepspeed.log"), env=env), "the DeepSpeed worker")
    shutil.rmtree(nvme)
    if ds["checkpointing"] != (ckpt == "on"):
        sys.exit(f"compare: the DeepSpeed model's checkpointing is {ds['checkpointing']}, asked for {ckpt}")
    t, d = ds["step_times"], ds["profile_split"]
    before = t[-2] * 1e3 if len(t) > 1 else None
    print(f"\n-- DeepSpeed ZeRO-3, step {n_steps} under torch.profiler ({offload} offload, checkpointing {ckpt}, "
          f"{ds['optimizer']}); top 25 by self CPU time")
    print(ds["profile_table"].rstrip("\n"))
    print(f"step {n_steps}: {t[-1] * 1e3:.1f} ms under the profiler: forward + loss {d['forward_loss'] * 1e3:.1f}, "
          f"engine.backward {d['backward'] * 1e3:.1f}, engine.step {d['step'] * 1e3:.1f}; step {n_steps - 1} "
          f"(warm-up, not profiled) {ms(before)} ms", flush=True)
    return {"preset": preset, "offload": offload, "ckpt": ckpt, "steps": n_steps,
            "strata_model_step_ms": mb["forward_ms"] + mb["backward_ms"], "strata_model_forward_ms": mb["forward_ms"],
            "strata_model_backward_ms": mb["backward_ms"], "strata_model_ops": mb["ops"],
            "strata_step_ms": split["total"], "strata_step_split_ms": split,
            "deepspeed_warmup_step_ms": before, "deepspeed_profiled_step_ms": t[-1] * 1e3,
            "deepspeed_profiled_split_ms": {k: v * 1e3 for k, v in d.items()},
            "deepspeed_profile_self_cpu_total_ms": ds["profile_self_cpu_total_ms"],
            "deepspeed_top_ops": ds["profile_top"], "deepspeed": ds}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", default="build/tools/strata", help="the strata command line (default %(default)s)")
    ap.add_argument("--python-path", default="build/python", help="where the strata package is (default %(default)s)")
    ap.add_argument("--presets", default="10m,125m", help="Strata model presets (default %(default)s)")
    ap.add_argument("--offload", default="cpu,nvme", help="offload devices, cpu and/or nvme (default %(default)s)")
    ap.add_argument("--ckpt", default="on,off", help="activation checkpointing, on and/or off (default %(default)s)")
    ap.add_argument("--steps", default="10m=10,125m=6",
                    help="optimizer steps per run: N, or PRESET=N,... (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of tokens/s (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs of each per cell (default %(default)s)")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per row (default %(default)s)")
    ap.add_argument("--micro-batch", type=int, default=4, help="rows per step (default %(default)s)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="strata.threads and torch / OpenMP threads (default: all cores, %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-4, help="constant AdamW learning rate (default %(default)s)")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay (default %(default)s)")
    ap.add_argument("--grad-clip", type=float, default=1.0, help="gradient_clipping (default %(default)s)")
    ap.add_argument("--seed", type=int, default=1234,
                    help="strata.seed: the init and the batches (default %(default)s)")
    ap.add_argument("--text", default=None,
                    help="training text, tokenized as bytes (default: this repository's Markdown and sources)")
    ap.add_argument("--backend", choices=("host", "cuda"), default="host",
                    help="host: strata's host backend against DeepSpeed's CPU accelerator (default); cuda: both "
                         "on the GPU (not yet run)")
    ap.add_argument("--workdir", default="build/bench-train",
                    help="token file, exports, batches, logs and NVMe swap files (a real disk; default %(default)s)")
    ap.add_argument("--profile", action="store_true",
                    help="per-op profile of one steady-state step on each side instead of the tokens/s table "
                         "(see the module docstring)")
    ap.add_argument("--model-bench", default=None,
                    help="--profile: Strata's per-op profiler (default: bench/model/model_bench in --strata's "
                         "build tree)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        deepspeed_worker(a.worker)
        return

    presets = [p for p in a.presets.split(",") if p]
    offloads = [o for o in a.offload.split(",") if o]
    ckpts = [c for c in a.ckpt.split(",") if c]
    if any(o not in ("cpu", "nvme") for o in offloads):
        sys.exit(f"compare: --offload {a.offload}: each must be cpu or nvme")
    if any(c not in ("on", "off") for c in ckpts):
        sys.exit(f"compare: --ckpt {a.ckpt}: each must be on or off")
    if not (presets and offloads and ckpts and a.repeats >= 1):
        sys.exit("compare: --presets, --offload and --ckpt need at least one value each, --repeats at least 1")
    steps = parse_steps(a.steps, presets)
    if a.profile:  # warm-up steps, then the one profiled
        steps = {p: a.warmup + 1 for p in presets}
    for p, n in steps.items():
        if n <= a.warmup:
            sys.exit(f"compare: {p} runs {n} steps; tokens/s needs more than --warmup {a.warmup}")
    if not os.access(a.strata, os.X_OK):
        sys.exit(f"compare: {a.strata} is not an executable; build the project (scripts/build.sh) and pass "
                 "--strata BUILD_DIR/tools/strata")
    strata = os.path.abspath(a.strata)
    model_bench = None
    if a.profile:
        model_bench = os.path.abspath(a.model_bench or os.path.join(os.path.dirname(os.path.dirname(strata)),
                                                                    "bench", "model", "model_bench"))
        if not os.access(model_bench, os.X_OK):
            sys.exit(f"compare: --profile needs Strata's model_bench; {model_bench} is not an executable (build "
                     "the project's benchmarks, or pass --model-bench PATH)")
    work = os.path.abspath(a.workdir)
    if "nvme" in offloads and fs_type(work) in ("tmpfs", "ramfs"):
        sys.exit(f"compare: --workdir {a.workdir} is on {fs_type(work)}; NVMe offload needs a directory on a "
                 "real disk (O_DIRECT swap files)")
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    helper_py, helper_env = strata_python(os.path.abspath(a.python_path))
    logs = os.path.join(work, "logs")

    text = os.path.abspath(a.text) if a.text else default_text(os.path.join(work, "corpus.txt"))
    tokens = os.path.join(work, "tokens.bin")
    n_tokens = int(run([helper_py, "-c", HELPER, "tokens", text, tokens], os.path.join(logs, "tokens.log"),
                       env=helper_env).split()[-1])
    tokens_per_step = a.micro_batch * a.seq_len
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    if a.profile:
        print(f"compare --profile: strata train vs DeepSpeed ZeRO-3, backend {a.backend}, bf16, {a.micro_batch} x "
              f"{a.seq_len} tokens per step, {a.threads} threads; one step after {a.warmup} warm-up per side; "
              f"text {text} ({n_tokens} byte tokens)", flush=True)
    else:
        print(f"compare: strata train vs DeepSpeed ZeRO-3, backend {a.backend}, bf16, {a.micro_batch} x {a.seq_len} "
              f"tokens per step, steps {steps} (tokens/s after {a.warmup} warm-up), {a.repeats} alternating "
              f"repeats, {a.threads} threads, AdamW lr {a.lr} constant; text {text} ({n_tokens} byte tokens)",
              flush=True)

    cells, info, profiles = [], None, []
    for preset in presets:
        pdir = os.path.join(work, preset)
        os.makedirs(pdir, exist_ok=True)
        step0 = os.path.join(pdir, "step0")
        cfg0 = os.path.join(pdir, "export.json")
        write_json(cfg0, strata_config(a, "cpu", None, "on"))
        run([strata, "train", "--config", cfg0, "--model", preset, "--data", tokens, "--seq-len", str(a.seq_len),
             "--steps", "0", "--backend", a.backend, "--no-progress", "--export", step0],
            os.path.join(logs, f"{preset}-export.log"))
        with open(os.path.join(step0, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        batches = os.path.join(pdir, "batches.i32")
        run([helper_py, "-c", HELPER, "batches", tokens, str(a.micro_batch), str(a.seq_len), str(a.seed), str(vocab),
             str(steps[preset]), batches], os.path.join(logs, f"{preset}-batches.log"), env=helper_env)

        for offload in offloads:
            for ckpt in ckpts:
                cell = {"preset": preset, "offload": offload, "ckpt": ckpt, "steps": steps[preset], "runs": []}
                name = f"{preset}-{offload}-ckpt_{ckpt}"
                if a.profile:
                    profiles.append(profile_cell(a, preset, offload, ckpt, steps[preset], strata, model_bench,
                                                 step0, tokens, batches,
                                                 os.path.join(pdir, f"{offload}-ckpt_{ckpt}-profile"), logs, name,
                                                 env))
                    continue
                for r in range(a.repeats):
                    run_dir = os.path.join(pdir, f"{offload}-ckpt_{ckpt}-r{r + 1}")
                    shutil.rmtree(run_dir, ignore_errors=True)
                    nvme = os.path.join(run_dir, "nvme")
                    os.makedirs(nvme)
                    # Strata
                    cfg = os.path.join(run_dir, "strata.json")
                    write_json(cfg, strata_config(a, offload, nvme, ckpt, csv_dir=run_dir))
                    out = run([strata, "train", "--config", cfg, "--init-from", step0, "--data", tokens,
                               "--seq-len", str(a.seq_len), "--steps", str(steps[preset]), "--backend", a.backend,
                               "--no-progress"], os.path.join(logs, f"{name}-r{r + 1}-strata.log"), env=env)
                    if f"(checkpointing {ckpt}," not in out:
                        sys.exit(f"compare: strata train's device plan does not show checkpointing {ckpt}:\n{out}")
                    st_loss = read_csv_column(os.path.join(run_dir, "run", "Train_Samples_train_loss.csv"))
                    st_time = read_csv_column(os.path.join(run_dir, "run", "Train_Samples_time_total.csv"))
                    shutil.rmtree(nvme)
                    os.makedirs(nvme)
                    # DeepSpeed
                    spec = os.path.join(run_dir, "deepspeed.json")
                    write_json(spec, {"backend": a.backend, "port": free_port(), "threads": a.threads,
                                      "micro_batch": a.micro_batch, "seq_len": a.seq_len, "steps": steps[preset],
                                      "batches": batches, "model": step0, "ckpt": ckpt,
                                      "config": ds_config(a, offload, nvme)})
                    ds = last_json_line(run([sys.executable, os.path.abspath(__file__), "--worker", spec],
                                            os.path.join(logs, f"{name}-r{r + 1}-deepspeed.log"), env=env),
                                        "the DeepSpeed worker")
                    shutil.rmtree(nvme)
                    if ds["checkpointing"] != (ckpt == "on"):
                        sys.exit(f"compare: the DeepSpeed model's checkpointing is {ds['checkpointing']}, "
                                 f"asked for {ckpt}")
                    if len(st_loss) != steps[preset] or len(ds["losses"]) != steps[preset]:
                        sys.exit(f"compare: {name} run {r + 1}: {len(st_loss)} Strata and {len(ds['losses'])} "
                                 f"DeepSpeed steps, asked for {steps[preset]}")
                    info = info or ds
                    one = {"strata_tokens_per_s": steady_tokens_per_s(st_time, tokens_per_step, a.warmup),
                           "deepspeed_tokens_per_s": steady_tokens_per_s(ds["step_times"], tokens_per_step, a.warmup),
                           "strata_losses": st_loss, "deepspeed_losses": ds["losses"],
                           "strata_step_times": st_time, "deepspeed_step_times": ds["step_times"]}
                    cell["runs"].append(one)
                    print(f"  {preset} {offload} ckpt {ckpt} run {r + 1}: strata {one['strata_tokens_per_s']:.0f}  "
                          f"deepspeed {one['deepspeed_tokens_per_s']:.0f} tokens/s", flush=True)
                cells.append(cell)

    if a.profile:
        ds = profiles[0]["deepspeed"]
        print(f"\ndeepspeed {ds['deepspeed']} (optimizer {ds['optimizer']}, params {ds['param_dtype']}, attention "
              f"{ds['attention']}), transformers {ds['transformers']}, torch {ds['torch']} ({ds['threads']} threads)")
        print(f"last step, ms: strata model = model_bench's forward + backward ops; strata step = strata train's "
              f"step {a.warmup + 1}; deepspeed step = step {a.warmup + 1} under the profiler")
        print(f"{'preset':>6} {'offload':>7} {'ckpt':>4} {'strata model':>13} {'strata step':>12} "
              f"{'deepspeed step':>15}")
        for c in profiles:
            print(f"{c['preset']:>6} {c['offload']:>7} {c['ckpt']:>4} {c['strata_model_step_ms']:>13.1f} "
                  f"{c['strata_step_ms']:>12.1f} {c['deepspeed_profiled_step_ms']:>15.1f}")
        for c in profiles:
            del c["deepspeed"]
        print("\n" + json.dumps({"bench": "train_vs_deepspeed_profile", "backend": a.backend,
                                  "micro_batch": a.micro_batch, "seq_len": a.seq_len, "warmup": a.warmup,
                                  "threads": a.threads, "torch": ds["torch"], "deepspeed": ds["deepspeed"],
                                  "transformers": ds["transformers"], "results": profiles}))
        return

    print(f"\ndeepspeed {info['deepspeed']} (optimizer {info['optimizer']}, params {info['param_dtype']}, attention "
          f"{info['attention']}), transformers {info['transformers']}, torch {info['torch']} "
          f"({info['threads']} threads)")
    print(f"{'preset':>6} {'offload':>7} {'ckpt':>4} {'strata tok/s':>13} {'deepspeed tok/s':>16} {'strata/ds':>10}")
    out = {"bench": "train_vs_deepspeed", "backend": a.backend, "micro_batch": a.micro_batch, "seq_len": a.seq_len,
           "warmup": a.warmup, "repeats": a.repeats, "threads": a.threads, "lr": a.lr, "seed": a.seed,
           "torch": info["torch"], "deepspeed": info["deepspeed"], "transformers": info["transformers"],
           "results": []}
    for c in cells:
        st = statistics.median(x["strata_tokens_per_s"] for x in c["runs"])
        ds = statistics.median(x["deepspeed_tokens_per_s"] for x in c["runs"])
        ratio = statistics.median(x["strata_tokens_per_s"] / x["deepspeed_tokens_per_s"] for x in c["runs"])
        first = c["runs"][0]
        diff = max(abs(s - d) for s, d in zip(first["strata_losses"], first["deepspeed_losses"]))
        c.update(strata_tokens_per_s=st, deepspeed_tokens_per_s=ds, strata_over_deepspeed=ratio,
                 max_abs_loss_diff=diff)
        print(f"{c['preset']:>6} {c['offload']:>7} {c['ckpt']:>4} {st:>13.0f} {ds:>16.0f} {ratio:>9.3f}x")
        out["results"].append(c)

    for c in cells:
        first = c["runs"][0]
        print(f"\nlosses, {c['preset']} {c['offload']} ckpt {c['ckpt']} (first run of each)")
        print(f"{'step':>4} {'strata':>10} {'deepspeed':>10} {'|diff|':>9}")
        for i, (s, d) in enumerate(zip(first["strata_losses"], first["deepspeed_losses"])):
            print(f"{i + 1:>4} {s:>10.5f} {d:>10.5f} {abs(s - d):>9.2e}")
        print(f"max |diff| {c['max_abs_loss_diff']:.2e}")
    print("\n" + json.dumps(out))


if __name__ == "__main__":
    main()

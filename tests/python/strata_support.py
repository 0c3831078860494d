"""Helpers shared by the tests of the `strata` Python package (docs/python.md).

The tests train the "tiny" preset (vocab 256, width 32, 2 blocks) on windows of SEQ_LEN + 1 byte tokens,
with configs/demo_cpu.json (bf16, AdamW, WarmupCosineLR, ZeRO-3 with CPU offload, host backend), so every
run takes well under a second. `strata train` runs are driven through its csv_monitor, whose CSV files
carry every step's figures at full double precision (session/csv_monitor.h).
"""

import array
import copy
import csv
import dataclasses
import json
import os
import pathlib
import subprocess

import strata

MODEL = "tiny"
SEQ_LEN = 16  # tokens the model runs over; token windows are SEQ_LEN + 1 long
LLMC_MAGIC_U16, LLMC_VERSION_U16 = 20240520, 1  # model/token_file.h

SOURCE_DIR = pathlib.Path(os.environ.get("STRATA_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2])).resolve()


def demo_config():
    """A fresh copy of configs/demo_cpu.json: the stock config `scripts/demo.sh` trains with, its schedule
    over demo.sh's 60 steps (the file leaves the length to the run: "auto")."""
    with open(SOURCE_DIR / "configs" / "demo_cpu.json") as f:
        config = json.load(f)
    config["scheduler"]["params"]["total_num_steps"] = 60
    return config


def accumulating(config, steps):
    """`config` with gradient_accumulation_steps = steps (train_batch_size follows)."""
    c = copy.deepcopy(config)
    c["gradient_accumulation_steps"] = steps
    c.pop("train_batch_size", None)
    return c


def write_llmc_tokens(path, tokens):
    """Writes `tokens` (ints < 65536) as an llm.c .bin: 256 int32 of header, then uint16 tokens."""
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = LLMC_MAGIC_U16, LLMC_VERSION_U16, len(tokens)
    body = array.array("H", tokens)
    assert header.itemsize == 4 and body.itemsize == 2
    with open(path, "wb") as f:
        header.tofile(f)
        body.tofile(f)


def window(corpus, sample, seq_len=SEQ_LEN):
    """Sample `sample` of a token file: its window of seq_len + 1 tokens (model/data_loader.h)."""
    return list(corpus[sample * seq_len: sample * seq_len + seq_len + 1])


def new_engine(config, **kwargs):
    """The engine alone of strata.initialize(config, "tiny", seq_len=SEQ_LEN, ...)."""
    kwargs.setdefault("seq_len", SEQ_LEN)
    engine, _, _, _ = strata.initialize(config, MODEL, **kwargs)
    return engine


@dataclasses.dataclass(frozen=True)
class Step:
    """One optimizer step's figures, as engine.last_step and strata train's csv_monitor report them."""
    samples: int  # global_samples after the step (csv_monitor's step column)
    loss: float
    lr: float
    grad_norm: float


def run_steps(engine, loader, steps, between=None):
    """`steps` optimizer steps of the documented loop; `between(engine)` (if given) runs after every
    micro-batch's step(). Returns each step's figures."""
    out = []
    for _ in range(steps):
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(next(loader))
            engine.backward(loss)
            engine.step()
            if between is not None:
                between(engine)
        s = engine.last_step
        out.append(Step(engine.global_samples, s.loss, s.lr, s.grad_norm))
    return out


def train_python(config, tokens, steps, **kwargs):
    """A fresh engine trained `steps` optimizer steps over token_loader(tokens)."""
    engine = new_engine(config, **kwargs)
    return run_steps(engine, engine.token_loader(str(tokens)), steps)


def read_csv_series(path):
    """A csv_monitor file: its header's value name and the (step, value) rows."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows and rows[0][0] == "step", f"{path}: header {rows[:1]}"
    return rows[0][1], [(int(step), float(value)) for step, value in rows[1:]]


@dataclasses.dataclass
class CliRun:
    steps: list  # of Step
    stdout: str


def run_cli_train(strata_bin, config, tokens, workdir, steps, *extra):
    """`strata train --model tiny --data TOKENS --seq-len SEQ_LEN --steps N --backend host` with
    csv_monitor writing under workdir; returns each step's figures read back from the CSV files."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(config)
    cfg["csv_monitor"] = {"enabled": True, "output_path": str(workdir / "csv"), "job_name": "job"}
    cfg_path = workdir / "ds_config.json"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    cmd = [str(strata_bin), "train", "--config", str(cfg_path), "--model", MODEL, "--data", str(tokens),
           "--seq-len", str(SEQ_LEN), "--steps", str(steps), "--no-progress", "--backend", "host", *extra]
    p = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    series = {}
    for name in ("train_loss", "lr", "grad_norm"):
        header, rows = read_csv_series(workdir / "csv" / "job" / f"Train_Samples_{name}.csv")
        assert header == name
        series[name] = rows
    samples = [s for s, _ in series["train_loss"]]
    for name in ("lr", "grad_norm"):
        assert [s for s, _ in series[name]] == samples
    out = [Step(samples[i], series["train_loss"][i][1], series["lr"][i][1], series["grad_norm"][i][1])
           for i in range(len(samples))]
    return CliRun(out, p.stdout)


def field(steps, name):
    """One field of a list of Step, as a list (pytest then shows the first differing step)."""
    return [getattr(s, name) for s in steps]


def child_env(**extra):
    """The environment for a child Python process: this one's, with the strata package the tests import
    first on PYTHONPATH as an absolute path (a relative one would not survive the child's other cwd)."""
    import strata

    pkg_root = str(pathlib.Path(strata.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=pkg_root + (os.pathsep + path if path else ""), **extra)

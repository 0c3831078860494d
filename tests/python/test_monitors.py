"""DeepSpeed's csv_monitor and tensorboard from the Python engine (docs/python.md, "Metrics"): the config
that makes `strata train` write its metrics makes engine.step() write the same files, with the same
event names, steps and values (session::Monitors, Note [Monitors] in session/monitors.cpp), rank 0,
after every optimizer step; a resumed run keeps the rows up to the loaded step, as `strata train --load`."""
import copy
import json
import re
import subprocess
import sys
import textwrap

import pytest

import strata_support as sup

STEPS = 3
# Steps whose values depend on the run alone (not on the machine's timing or memory): the same in both.
SAME_VALUES = ("train_loss", "lr", "grad_norm")


def monitored(config, folder, job="job"):
    """`config` with csv_monitor and tensorboard writing into folder/job."""
    c = copy.deepcopy(config)
    for key in ("csv_monitor", "tensorboard"):
        c[key] = {"enabled": True, "output_path": str(folder), "job_name": job}
    return c


def csv_files(job_dir):
    """{metric: (header's value name, [(step, value text)])} for each Train_Samples_<metric>.csv."""
    out = {}
    for path in sorted(job_dir.glob("Train_Samples_*.csv")):
        lines = path.read_text().splitlines()
        assert lines and lines[0].startswith("step,"), f"{path}: {lines[:1]}"
        rows = [tuple(line.split(",")) for line in lines[1:]]
        out[path.stem[len("Train_Samples_"):]] = (lines[0][len("step,"):], rows)
    return out


def train_loss_events(job_dir):
    """How many train_loss scalars the job's event files hold, per file."""
    return [p.read_bytes().count(b"Train/Samples/train_loss") for p in sorted(job_dir.glob("events.out.tfevents.*"))]


@pytest.fixture(scope="module")
def both_runs(strata_bin, token_file, tmp_path_factory):
    """(Python's job folder, strata train's job folder, Python's steps) over the demo config, STEPS steps."""
    base = tmp_path_factory.mktemp("monitors")
    py_dir = base / "py"
    engine = sup.new_engine(monitored(sup.demo_config(), py_dir))
    steps = sup.run_steps(engine, engine.token_loader(str(token_file)), STEPS)
    engine.close()
    # strata train with the same config (its csv_monitor lands in cli/csv/job, its tensorboard in cli-tb/job).
    sup.run_cli_train(strata_bin, monitored(sup.demo_config(), base / "cli-tb"), token_file, base / "cli", STEPS)
    return py_dir / "job", base / "cli" / "csv" / "job", steps


def test_the_csv_files_are_strata_trains(both_runs):
    """The same files with the same headers and step columns as strata train's; the loss, lr and grad norm
    the same to the last digit (%.17g), step by step."""
    py_dir, cli_dir, _ = both_runs
    py, cli = csv_files(py_dir), csv_files(cli_dir)
    assert sorted(py) == sorted(cli)
    assert "train_loss" in py and "bytes_device_peak" in py and "loss_scale" not in py  # bf16: no loss scale
    for metric in py:
        assert py[metric][0] == cli[metric][0] == metric
        assert [s for s, _ in py[metric][1]] == [s for s, _ in cli[metric][1]] == ["4", "8", "12"], metric
    for metric in SAME_VALUES:
        assert py[metric][1] == cli[metric][1], metric


def test_the_rows_are_the_steps_figures(both_runs):
    """Each train_loss / lr / grad_norm row is engine.last_step's, at the step's global_samples."""
    py_dir, _, steps = both_runs
    py = csv_files(py_dir)
    for metric, name in (("train_loss", "loss"), ("lr", "lr"), ("grad_norm", "grad_norm")):
        assert [(int(s), float(v)) for s, v in py[metric][1]] == [(s.samples, getattr(s, name)) for s in steps]


def test_tensorboard_holds_every_step(both_runs):
    """One event file in the job's folder, as strata train's, with one train_loss scalar per step."""
    py_dir, _, _ = both_runs
    assert train_loss_events(py_dir) == [STEPS]


def test_every_step_is_on_disk_when_step_returns(config, token_file, tmp_path):
    """After each optimizer step, the CSV row and the tensorboard scalar of that step are already in the
    files (flushed), so a plot or `tail -f` of a running loop sees them."""
    engine = sup.new_engine(monitored(config, tmp_path))
    job = tmp_path / "job"
    seen = []

    def look(e):
        seen.append((len(csv_files(job)["train_loss"][1]), train_loss_events(job)))

    sup.run_steps(engine, engine.token_loader(str(token_file)), STEPS, between=look)
    assert seen == [(n, [n]) for n in range(1, STEPS + 1)]


def test_the_log_names_where_the_metrics_go(config, token_file, tmp_path, capfd):
    """At the first optimizer step the log names the files, as strata train's summary does."""
    engine = sup.new_engine(monitored(config, tmp_path))
    sup.run_steps(engine, engine.token_loader(str(token_file)), 1)
    err = capfd.readouterr().err
    job = tmp_path / "job"
    assert f"metrics: {job}/Train_Samples_*.csv (csv_monitor)" in err, err
    (events,) = job.glob("events.out.tfevents.*")
    assert f"metrics: {events} (tensorboard)" in err, err


def test_a_resumed_run_keeps_the_rows_up_to_the_loaded_step(config, token_file, tmp_path):
    """A run saved at step 2 and trained on to step 3; a new engine loading the step-2 checkpoint keeps the
    rows up to step 2 (samples 8), drops step 3's and writes its own step 3 under the one header; its
    tensorboard events go to a file of its own."""
    cfg = monitored(config, tmp_path)
    first = sup.new_engine(cfg)
    loader = first.token_loader(str(token_file))
    sup.run_steps(first, loader, 2)
    first.save_checkpoint(tmp_path / "ckpt", data_loader=loader)
    sup.run_steps(first, loader, 1)
    first.close()
    job = tmp_path / "job"
    before = csv_files(job)["train_loss"][1]

    second = sup.new_engine(cfg)
    loader = second.token_loader(str(token_file))
    second.load_checkpoint(tmp_path / "ckpt", data_loader=loader)
    (step3,) = sup.run_steps(second, loader, 1)
    second.close()
    header, rows = csv_files(job)["train_loss"]
    assert (job / "Train_Samples_train_loss.csv").read_text().count("step,") == 1
    assert rows[:2] == before[:2]
    assert [(int(s), float(v)) for s, v in rows[2:]] == [(12, step3.loss)]
    assert train_loss_events(job) == [STEPS, 1]


def test_an_unwritable_folder_is_refused_by_initialize_as_by_strata_train(strata_bin, token_file, tmp_path):
    """A csv_monitor folder that cannot be created (/proc takes no new entries): strata.initialize refuses
    it before the engine exists, with strata train's message (session::check_outputs)."""
    cfg = monitored(sup.demo_config(), "/proc/strata-csv")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    c = subprocess.run([str(strata_bin), "train", "--config", str(path), "--model", sup.MODEL, "--data",
                        str(token_file), "--seq-len", str(sup.SEQ_LEN), "--steps", "1", "--no-progress"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=sup.child_env())
    assert c.returncode != 0
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import strata
        try:
            strata.initialize({str(path)!r}, {sup.MODEL!r}, seq_len={sup.SEQ_LEN})
        except strata.ConfigError as e:
            print("refused:", e)
        """))
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=sup.child_env())
    assert p.returncode == 0, p.stderr
    said = re.search(r"csv_monitor\.output_path/job_name: /proc/strata-csv/job: cannot create[^\n]*", c.stderr)
    assert said, c.stderr
    assert "refused: " + said.group(0) in p.stdout, p.stdout
    assert "zero3:" not in p.stderr  # refused before the engine

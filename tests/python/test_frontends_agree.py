"""`strata train` and `strata.initialize` set up a run through the same code (session/session.h): for the
same config and model they resolve the same values (the "config: KEY = VALUE: why" lines of Note [Loud auto],
hidden_size from the model in both), and they refuse the same bad input at the same point, before any
weight is read, with the same message but for the argument's name."""
import json
import re
import subprocess
import sys
import textwrap

import strata_support as sup

HF_TEMPLATE = sup.SOURCE_DIR / "tests" / "config" / "fixtures" / "hf_zero3_auto.json"


def cli(strata_bin, tmp_path, *args):
    return subprocess.run([str(strata_bin), "train", *map(str, args), "--no-progress", "--backend", "host"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=sup.child_env())


def python(tmp_path, code):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env=sup.child_env())


def config_lines(text):
    return [line[line.index("config: "):] for line in text.splitlines() if "] config: " in line]


def test_both_resolve_the_same_auto_values(strata_bin, token_file, tmp_path):
    """Hugging Face's all-"auto" ZeRO-3 template on the tiny model: the same chosen values and reasons,
    the bucket sizes from the model's hidden size in both."""
    c = cli(strata_bin, tmp_path, "--config", HF_TEMPLATE, "--model", sup.MODEL, "--data", token_file,
            "--seq-len", sup.SEQ_LEN, "--steps", 1)
    assert c.returncode == 0, c.stdout + c.stderr
    p = python(tmp_path, f"""
        import strata
        strata.initialize({str(HF_TEMPLATE)!r}, {sup.MODEL!r}, seq_len={sup.SEQ_LEN}, backend="host")
        """)
    assert p.returncode == 0, p.stderr
    ours, theirs = config_lines(c.stderr), config_lines(p.stderr)
    assert any(line.startswith("config: zero_optimization.reduce_bucket_size = ") and "hidden_size" in line
               for line in ours), ours
    assert ours == theirs


def test_both_refuse_a_sequence_past_max_seq_len_before_loading(strata_bin, token_file, tmp_path):
    """A sequence longer than the model's max_seq_len: the same refusal from both, naming the argument, before
    the engine exists (no device, no weights). (A sliding window shorter than the sequence is computed, not
    refused: the model carries one here to show it.)"""
    model = json.loads((sup.SOURCE_DIR / "configs" / "models" / "tiny-mistral.json").read_text())
    model["max_seq_len"] = 12
    model["sliding_window"] = 8
    path = tmp_path / "short.json"
    path.write_text(json.dumps(model))
    c = cli(strata_bin, tmp_path, "--config", sup.SOURCE_DIR / "configs" / "demo_cpu.json", "--model", path,
            "--data", token_file, "--seq-len", 16, "--steps", 1)
    assert c.returncode != 0
    p = python(tmp_path, f"""
        import json, strata
        cfg = json.load(open({str(sup.SOURCE_DIR / "configs" / "demo_cpu.json")!r}))
        try:
            strata.initialize(cfg, {str(path)!r}, seq_len=16, total_steps=10)
        except (strata.ConfigError, ValueError) as e:
            print("refused:", e)
        """)
    assert p.returncode == 0, p.stderr
    said = re.search(r"16 is longer than model '[^']*''s max_seq_len 12", c.stderr)
    assert said, c.stderr
    assert "--seq-len " + said.group(0) in c.stderr
    assert "initialize: seq_len " + said.group(0) in p.stdout, p.stdout
    assert "zero3:" not in c.stderr and "zero3:" not in p.stderr  # refused before the engine


def test_both_refuse_an_output_directory_they_cannot_create_before_the_engine(strata_bin, token_file, tmp_path):
    """strata.memprof.path in a directory that cannot be created (/proc takes no new entries): the same
    refusal from both, naming the key, before the engine exists (session::check_outputs, Note [Outputs up
    front] in session/session.cpp)."""
    cfg = json.loads((sup.SOURCE_DIR / "configs" / "demo_cpu.json").read_text())
    cfg["strata"]["memprof"] = {"path": "/proc/strata-trace/run.memprof.jsonl"}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    c = cli(strata_bin, tmp_path, "--config", path, "--model", sup.MODEL, "--data", token_file,
            "--seq-len", sup.SEQ_LEN, "--steps", 1)
    assert c.returncode != 0
    p = python(tmp_path, f"""
        import strata
        try:
            strata.initialize({str(path)!r}, {sup.MODEL!r}, seq_len={sup.SEQ_LEN}, total_steps=1)
        except strata.ConfigError as e:
            print("refused:", e)
        """)
    assert p.returncode == 0, p.stderr
    said = re.search(r"strata\.memprof\.path's directory /proc/strata-trace: cannot create the directory[^\n]*",
                     c.stderr)
    assert said, c.stderr
    assert "refused: " + said.group(0) in p.stdout, p.stdout
    assert "zero3:" not in c.stderr and "zero3:" not in p.stderr  # refused before the engine
    assert not re.search(r"(^|\n)step ", c.stdout)


def test_both_refuse_a_checkpoint_directory_they_cannot_create_the_same_way(strata_bin, token_file, tmp_path):
    """--save DIR and engine.save_checkpoint(DIR) where DIR cannot be created: the same message but for the
    argument's name; strata train before its first step, Python when it is called (the first time it knows
    the directory), before anything is written."""
    bad = "/proc/strata-ckpt"
    c = cli(strata_bin, tmp_path, "--config", sup.SOURCE_DIR / "configs" / "demo_cpu.json", "--model", sup.MODEL,
            "--data", token_file, "--seq-len", sup.SEQ_LEN, "--steps", 1, "--save", bad)
    assert c.returncode != 0
    assert not re.search(r"(^|\n)step ", c.stdout)
    p = python(tmp_path, f"""
        import strata
        engine, _, _, _ = strata.initialize({str(sup.SOURCE_DIR / "configs" / "demo_cpu.json")!r}, {sup.MODEL!r},
                                            seq_len={sup.SEQ_LEN}, total_steps=1)
        try:
            engine.save_checkpoint({bad!r})
        except strata.ConfigError as e:
            print("refused:", e)
        """)
    assert p.returncode == 0, p.stderr
    said = re.search(re.escape(bad) + r": cannot create the directory[^\n]*", c.stderr)
    assert said, c.stderr
    assert "--save " + said.group(0) in c.stderr
    assert "refused: engine.save_checkpoint(save_dir) " + said.group(0) in p.stdout, p.stdout

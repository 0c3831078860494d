"""Errors (docs/python.md, "Errors"): the runtime's errors arrive as the documented Python exceptions with
the runtime's message, bad batches raise ValueError naming the argument, and the interpreter never aborts."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import strata
import strata_support as sup



def test_exception_classes_derive_from_the_builtins():
    """ConfigError is a ValueError, OutOfMemoryError a MemoryError, IoError an OSError, StrataError a
    RuntimeError."""
    assert issubclass(strata.ConfigError, ValueError)
    assert issubclass(strata.OutOfMemoryError, MemoryError)
    assert issubclass(strata.IoError, OSError)
    assert issubclass(strata.StrataError, RuntimeError)


# ---- initialize: config, model, sizes ----

def test_unknown_config_key_raises_configerror_naming_it(config):
    """A misspelt top-level key: ConfigError (a ValueError) with the config parser's message."""
    config["gradient_acumulation_steps"] = 1
    with pytest.raises(strata.ConfigError) as e:
        sup.new_engine(config)
    assert isinstance(e.value, ValueError)
    assert "gradient_acumulation_steps: unknown key; did you mean gradient_accumulation_steps?" in str(e.value)


def test_unknown_nested_config_key_names_its_path(config):
    """A misspelt key inside a section is named by its full path."""
    config["zero_optimization"]["stage3_prefetch_bucket"] = "5M"
    with pytest.raises(strata.ConfigError) as e:
        sup.new_engine(config)
    assert "zero_optimization.stage3_prefetch_bucket: unknown key" in str(e.value)


def test_a_config_file_error_names_the_file(config, tmp_path):
    """initialize(config=PATH): the message starts from the file's path, as strata train's does."""
    config["optimizer"]["params"]["lr"] = -1
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(strata.ConfigError) as e:
        strata.initialize(str(path), sup.MODEL, seq_len=sup.SEQ_LEN)
    assert str(path) in str(e.value)
    assert "optimizer.params.lr" in str(e.value)


def test_inconsistent_batch_sizes_show_the_arithmetic(config):
    """train_batch_size != micro x accumulation x world: ConfigError showing the product."""
    config["train_batch_size"] = 5
    with pytest.raises(strata.ConfigError) as e:
        sup.new_engine(config)
    assert "train_batch_size 5 != train_micro_batch_size_per_gpu 4" in str(e.value)


def test_unknown_model_preset_raises_valueerror(config):
    """model="nosuch": ValueError listing the presets."""
    with pytest.raises(ValueError) as e:
        strata.initialize(config, "nosuch", seq_len=sup.SEQ_LEN)
    assert "model preset 'nosuch' is not known" in str(e.value)
    assert "tiny" in str(e.value)


def test_seq_len_beyond_the_models_raises_valueerror(config):
    """seq_len above the model's max_seq_len (64 for tiny): ValueError at initialize."""
    with pytest.raises(ValueError) as e:
        strata.initialize(config, sup.MODEL, seq_len=65)
    assert "seq_len" in str(e.value)


def test_a_device_cap_far_too_small_raises_memoryerror(config):
    """device_memory_cap="1KiB": strata.OutOfMemoryError (a MemoryError) with the plan's message, which
    says the cap to set."""
    with pytest.raises(MemoryError) as e:
        strata.initialize(config, sup.MODEL, seq_len=sup.SEQ_LEN, device_memory_cap="1KiB")
    assert isinstance(e.value, strata.OutOfMemoryError)
    assert "the model does not fit the device" in str(e.value)
    assert "device_memory_cap" in str(e.value)


def test_a_device_cap_in_bytes_is_accepted(config):
    """device_memory_cap as an int of bytes overrides the config's, as the string form does."""
    with pytest.raises(strata.OutOfMemoryError):
        strata.initialize(config, sup.MODEL, seq_len=sup.SEQ_LEN, device_memory_cap=1024)
    assert sup.new_engine(config, device_memory_cap=64 << 20) is not None


def test_a_bad_device_cap_string_raises_valueerror(config):
    """device_memory_cap="64 potatoes": ValueError, before any allocation."""
    with pytest.raises(ValueError):
        strata.initialize(config, sup.MODEL, seq_len=sup.SEQ_LEN, device_memory_cap="64 potatoes")


def test_nvme_offload_to_a_missing_path_raises_configerror(config, tmp_path):
    """offload_optimizer to NVMe at a directory that does not exist: ConfigError naming the key and path."""
    missing = tmp_path / "no-such-dir"
    config["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": str(missing)}
    with pytest.raises(strata.ConfigError) as e:
        sup.new_engine(config)
    assert "zero_optimization.offload_optimizer.nvme_path" in str(e.value)
    assert f'"{missing}" does not exist' in str(e.value)


# ---- data ----

def test_a_missing_token_file_raises_oserror(engine, tmp_path):
    """token_loader of a path that does not exist: strata.IoError (an OSError) naming the path."""
    missing = tmp_path / "missing.bin"
    with pytest.raises(OSError) as e:
        engine.token_loader(str(missing))
    assert isinstance(e.value, strata.IoError)
    assert str(missing) in str(e.value)


def test_a_token_file_outside_the_vocabulary_raises_valueerror(engine, tmp_path):
    """A token file holding 300 (tiny's vocabulary is 256): ConfigError naming the file, at token_loader."""
    path = tmp_path / "big.bin"
    sup.write_llmc_tokens(path, [1, 2, 3] * 40 + [300] + [4] * 40)
    with pytest.raises(ValueError) as e:
        engine.token_loader(str(path))
    assert str(path) in str(e.value)


def test_a_damaged_token_file_raises_valueerror(engine, tmp_path):
    """An llm.c header whose count disagrees with the file: ConfigError naming the file."""
    path = tmp_path / "short.bin"
    sup.write_llmc_tokens(path, list(range(100)))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError) as e:
        engine.token_loader(str(path))
    assert str(path) in str(e.value)


# ---- batches ----

T1 = sup.SEQ_LEN + 1

BAD_INPUTS = {
    "too_many_rows": lambda: np.zeros((5, T1), np.int32),  # micro-batch 4
    "one_dimensional": lambda: np.zeros(T1, np.int32),
    "three_dimensional": lambda: np.zeros((1, 2, T1), np.int32),
    "float": lambda: np.zeros((2, T1), np.float32),
    "bool": lambda: np.zeros((2, T1), np.bool_),
    "token_at_vocab_size": lambda: np.full((2, T1), 256, np.int64),
    "negative_token": lambda: np.full((2, T1), -1, np.int64),
    "one_token_per_row": lambda: np.zeros((2, 1), np.int32),
    "longer_than_seq_len": lambda: np.zeros((2, T1 + 1), np.int32),
    "empty": lambda: np.zeros((0, T1), np.int32),
    "not_an_array": lambda: "tokens",
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_a_bad_batch_raises_valueerror_naming_input_ids(engine, case):
    """engine(bad): ValueError whose message names input_ids."""
    with pytest.raises(ValueError) as e:
        engine(BAD_INPUTS[case]())
    assert "input_ids" in str(e.value)


@pytest.mark.parametrize("case", ["too_many_rows", "float", "token_at_vocab_size", "one_dimensional"])
def test_eval_loss_checks_its_batch_too(engine, case):
    """eval_loss(bad): the same ValueError naming input_ids."""
    with pytest.raises(ValueError) as e:
        engine.eval_loss(BAD_INPUTS[case]())
    assert "input_ids" in str(e.value)


def test_a_token_at_vocab_size_names_the_vocabulary(engine):
    """The message of an out-of-vocabulary token says the vocabulary size (256)."""
    with pytest.raises(ValueError) as e:
        engine(BAD_INPUTS["token_at_vocab_size"]())
    assert "256" in str(e.value)


BAD_LABELS = {
    "other_shape": lambda: np.zeros((2, T1 - 1), np.int64),
    "at_vocab_size": lambda: np.full((2, T1), 256, np.int64),
    "float": lambda: np.zeros((2, T1), np.float64),
}


@pytest.mark.parametrize("case", sorted(BAD_LABELS))
def test_bad_labels_raise_valueerror_naming_labels(engine, case):
    """engine(ids, labels=bad): ValueError whose message names labels."""
    with pytest.raises(ValueError) as e:
        engine(np.zeros((2, T1), np.int64), labels=BAD_LABELS[case]())
    assert "labels" in str(e.value)


def test_a_rejected_batch_leaves_the_engine_as_it_was(config, token_file):
    """After a ValueError from engine(bad), a step gives the loss of an engine that never saw it."""
    def first_loss(try_bad):
        engine = sup.new_engine(config)
        if try_bad:
            with pytest.raises(ValueError):
                engine(BAD_INPUTS["token_at_vocab_size"]())
        return sup.run_steps(engine, engine.token_loader(str(token_file)), 1)

    assert first_loss(True) == first_loss(False)


# ---- the interpreter survives ----

def run_python(code, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=sup.child_env())


def test_the_interpreter_survives_runtime_errors(tmp_path):
    """A process that meets an out-of-memory plan, a bad batch and an out-of-order backward, each caught,
    goes on and exits 0."""
    p = run_python(f"""
        import array, json, strata
        cfg = json.load(open({str(sup.SOURCE_DIR / "configs" / "demo_cpu.json")!r}))
        try:
            strata.initialize(cfg, "tiny", seq_len=16, device_memory_cap="1KiB", total_steps=60)
        except MemoryError as e:
            print("caught", type(e).__name__)
        engine, _, _, _ = strata.initialize(cfg, "tiny", seq_len=16, total_steps=60)
        try:
            engine(b"a 1-D byte buffer")
        except ValueError as e:
            print("caught", type(e).__name__)
        ids = memoryview(array.array("i", [1] * 34)).cast("B").cast("i", [2, 17])
        loss = engine(ids)
        engine.backward(loss)
        try:
            engine.backward(loss)
        except RuntimeError as e:
            print("caught", type(e).__name__)
        print("alive")
        """, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("caught") == 3, p.stdout + p.stderr
    assert p.stdout.rstrip().endswith("alive")


def test_an_uncaught_error_is_a_python_traceback(tmp_path):
    """An uncaught runtime error ends the process as Python does (traceback, exit 1), not by abort."""
    p = run_python(f"""
        import json, strata
        cfg = json.load(open({str(sup.SOURCE_DIR / "configs" / "demo_cpu.json")!r}))
        strata.initialize(cfg, "tiny", seq_len=16, device_memory_cap="1KiB", total_steps=60)
        """, tmp_path)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "Traceback" in p.stderr
    assert "OutOfMemoryError" in p.stderr
    assert "the model does not fit the device" in p.stderr

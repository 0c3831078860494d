"""Checkpoints (docs/python.md, "Checkpoints"): the format of `strata train --save`, resumed either way
bit for bit, client_state round trips, and calls in the middle of an accumulation refused."""

import json
import math

import pytest

import strata
import strata_support as sup

# Saved after step 3: demo_cpu.json's warm-up gives steps 1 and 2 a rate of 0, so only from step 3 on do
# the weights differ from the seed's, and a resume that lost them would go unnoticed.
SAVED, MORE = 3, 2


@pytest.fixture(scope="module")
def reference(strata_bin, token_file, tmp_path_factory):
    """strata train's SAVED + MORE uninterrupted steps: what every resumed run must reproduce."""
    steps = sup.run_cli_train(strata_bin, sup.demo_config(), token_file, tmp_path_factory.mktemp("ref"),
                              SAVED + MORE).steps
    assert steps[SAVED - 1].lr > 0
    return steps


@pytest.fixture(scope="module")
def cli_checkpoint(strata_bin, token_file, tmp_path_factory):
    """A checkpoint directory written by `strata train --steps SAVED --save DIR`."""
    work = tmp_path_factory.mktemp("cli-save")
    sup.run_cli_train(strata_bin, sup.demo_config(), token_file, work, SAVED, "--save", str(work / "ckpt"))
    return work / "ckpt"


def python_checkpoint(config, token_file, save_dir, **save_kwargs):
    """Trains SAVED steps in Python and saves with the loader's position; returns save_checkpoint's path."""
    engine = sup.new_engine(config)
    loader = engine.token_loader(str(token_file))
    sup.run_steps(engine, loader, SAVED)
    return engine.save_checkpoint(str(save_dir), data_loader=loader, **save_kwargs)


def test_python_resumes_strata_trains_checkpoint_bit_for_bit(cli_checkpoint, reference, config, token_file):
    """load_checkpoint(strata train's checkpoint, data_loader=loader), then MORE steps: the losses, rates,
    norms and sample counts of the uninterrupted run's last steps."""
    engine = sup.new_engine(config)
    loader = engine.token_loader(str(token_file))
    engine.load_checkpoint(str(cli_checkpoint), data_loader=loader)
    assert engine.global_steps == SAVED
    assert sup.run_steps(engine, loader, MORE) == reference[SAVED:]


def test_strata_trains_client_state_names_its_source(cli_checkpoint, config):
    """load_checkpoint returns (DIR/global_step3, {"source": "strata train", ...})."""
    engine = sup.new_engine(config)
    path, client_state = engine.load_checkpoint(str(cli_checkpoint))
    assert path is not None and path.rstrip("/").endswith(f"global_step{SAVED}")
    assert client_state["source"] == "strata train"


def test_strata_train_resumes_pythons_checkpoint_bit_for_bit(strata_bin, reference, config, token_file, tmp_path):
    """`strata train --load DIR --steps 2` after the Python loop's save_checkpoint(DIR, data_loader=loader):
    the uninterrupted run's last steps, at the same sample counts."""
    python_checkpoint(config, token_file, tmp_path / "ckpt", client_state={"epoch": 0})
    resumed = sup.run_cli_train(strata_bin, config, token_file, tmp_path / "cli", MORE,
                                "--load", str(tmp_path / "ckpt"))
    assert resumed.steps == reference[SAVED:]


def test_python_resumes_pythons_checkpoint_bit_for_bit(reference, config, token_file, tmp_path):
    """save_checkpoint then load_checkpoint in a new engine, both with data_loader=: the uninterrupted run."""
    python_checkpoint(config, token_file, tmp_path / "ckpt")
    engine = sup.new_engine(config)
    loader = engine.token_loader(str(token_file))
    engine.load_checkpoint(str(tmp_path / "ckpt"), data_loader=loader)
    assert sup.run_steps(engine, loader, MORE) == reference[SAVED:]


def test_save_writes_global_step_tag_and_latest(config, token_file, tmp_path):
    """save_checkpoint(DIR) returns DIR/global_step3 and DIR/latest names that tag."""
    path = python_checkpoint(config, token_file, tmp_path / "ckpt")
    assert path.rstrip("/").endswith(f"global_step{SAVED}")
    assert (tmp_path / "ckpt" / f"global_step{SAVED}").is_dir()
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == f"global_step{SAVED}"


def test_save_with_a_tag_writes_that_tag(config, token_file, tmp_path):
    """save_checkpoint(DIR, tag="mine") writes DIR/mine, points latest at it, and load(DIR, tag=) reads it."""
    path = python_checkpoint(config, token_file, tmp_path / "ckpt", tag="mine")
    assert path.rstrip("/").endswith("mine")
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "mine"
    engine = sup.new_engine(config)
    loaded, _ = engine.load_checkpoint(str(tmp_path / "ckpt"), tag="mine")
    assert loaded.rstrip("/").endswith("mine")
    assert engine.global_steps == SAVED


def test_client_state_round_trips(config, token_file, tmp_path):
    """Any JSON-serialisable client_state (nested dicts and lists, float, int, str, bool, None) comes back
    from load_checkpoint equal."""
    state = {"epoch": 3, "lr": 0.1, "tiny": 1e-300, "name": "run é", "done": False, "ok": True, "none": None,
             "nested": {"list": [1, 2.5, "three", [None, {"deep": True}]], "empty": {}, "empty_list": []}}
    python_checkpoint(config, token_file, tmp_path / "ckpt", client_state=state)
    _, loaded = sup.new_engine(config).load_checkpoint(str(tmp_path / "ckpt"))
    assert loaded == state
    assert json.dumps(loaded, sort_keys=True) == json.dumps(state, sort_keys=True)


def test_non_finite_floats_in_client_state_round_trip(config, token_file, tmp_path):
    """best_loss = inf (a loop's usual start), -inf and NaN, at any depth, come back as those floats."""
    state = {"best_loss": float("inf"), "low": float("-inf"), "hist": [1.5, float("nan")],
             "nested": {"worst": float("inf")}}
    python_checkpoint(config, token_file, tmp_path / "ckpt", client_state=state)
    _, loaded = sup.new_engine(config).load_checkpoint(str(tmp_path / "ckpt"))
    assert loaded["best_loss"] == math.inf and loaded["low"] == -math.inf
    assert loaded["hist"][0] == 1.5 and math.isnan(loaded["hist"][1])
    assert loaded["nested"] == {"worst": math.inf}


def test_default_client_state_is_an_empty_dict(config, token_file, tmp_path):
    """save_checkpoint without client_state: load_checkpoint returns {}."""
    python_checkpoint(config, token_file, tmp_path / "ckpt")
    _, loaded = sup.new_engine(config).load_checkpoint(str(tmp_path / "ckpt"))
    assert loaded == {}


def test_load_without_latest_returns_none_none(engine, tmp_path):
    """load_checkpoint of a directory with no `latest` (and no tag) returns (None, None) with a warning,
    DeepSpeed's behaviour, and leaves the engine at step 0."""
    (tmp_path / "empty").mkdir()
    with pytest.warns(UserWarning, match="latest"):
        assert engine.load_checkpoint(str(tmp_path / "empty")) == (None, None)
    assert engine.global_steps == 0


def test_save_in_the_middle_of_an_accumulation_raises(config, token_file, tmp_path):
    """save_checkpoint after the first of 2 micro-batches raises RuntimeError (strata.StrataError)."""
    engine = sup.new_engine(sup.accumulating(config, 2))
    loss = engine(next(engine.token_loader(str(token_file))))
    engine.backward(loss)
    engine.step()
    with pytest.raises(RuntimeError) as e:
        engine.save_checkpoint(str(tmp_path / "ckpt"))
    assert isinstance(e.value, strata.StrataError)
    assert not (tmp_path / "ckpt" / "latest").exists()


def test_load_in_the_middle_of_an_accumulation_raises(config, token_file, tmp_path):
    """load_checkpoint after the first of 2 micro-batches raises RuntimeError (strata.StrataError)."""
    cfg = sup.accumulating(config, 2)
    python_checkpoint(cfg, token_file, tmp_path / "ckpt")
    engine = sup.new_engine(cfg)
    loss = engine(next(engine.token_loader(str(token_file))))
    engine.backward(loss)
    engine.step()
    with pytest.raises(RuntimeError) as e:
        engine.load_checkpoint(str(tmp_path / "ckpt"))
    assert isinstance(e.value, strata.StrataError)


def test_a_damaged_checkpoint_raises_oserror(config, token_file, tmp_path):
    """A flipped byte in a shard's tensor fails the load's checksum: strata.IoError (an OSError)."""
    python_checkpoint(config, token_file, tmp_path / "ckpt")
    shard = next(p for p in (tmp_path / "ckpt" / f"global_step{SAVED}").iterdir() if p.suffix == ".shard")
    data = bytearray(shard.read_bytes())
    data[4096] ^= 0xFF  # the first tensor's first byte (after the 4096-byte header; zero3/checkpoint.h)
    shard.write_bytes(bytes(data))
    with pytest.raises(OSError) as e:
        sup.new_engine(config).load_checkpoint(str(tmp_path / "ckpt"))
    assert isinstance(e.value, strata.IoError)
    assert f"global_step{SAVED}" in str(e.value)

"""strata.initialize and the engine's identity in one process (docs/python.md, "strata.initialize" and the
DeepSpeed table): what it returns, "auto" values, config as a path or a dict, ranks without a launcher."""

import json

import pytest

import strata
import strata_support as sup


def test_initialize_returns_engine_optimizer_none_scheduler(config):
    """initialize returns (engine, optimizer, None, lr_scheduler); the demo config has a scheduler."""
    engine, optimizer, third, scheduler = strata.initialize(config, sup.MODEL, seq_len=sup.SEQ_LEN)
    assert engine is not None and optimizer is not None
    assert third is None
    assert scheduler is not None


def test_lr_scheduler_is_none_without_a_scheduler(config):
    """A config without "scheduler": lr_scheduler is None and get_lr() is the optimizer's lr."""
    del config["scheduler"]
    engine, _, _, scheduler = strata.initialize(config, sup.MODEL, seq_len=sup.SEQ_LEN)
    assert scheduler is None
    assert engine.get_lr() == [config["optimizer"]["params"]["lr"]]


def test_auto_values_fill_auto_keys(config):
    """Keys set to "auto" take initialize's keyword values (docs/config.md's override names)."""
    del config["scheduler"]
    config["train_micro_batch_size_per_gpu"] = "auto"
    config["gradient_accumulation_steps"] = "auto"
    config["optimizer"]["params"]["lr"] = "auto"
    engine = sup.new_engine(config, micro_batch=2, grad_accum=3, lr=5e-4)
    assert engine.train_micro_batch_size_per_gpu() == 2
    assert engine.gradient_accumulation_steps() == 3
    assert engine.train_batch_size() == 6
    assert engine.get_lr() == [5e-4]


def test_a_config_path_trains_as_its_dict(config, token_file, tmp_path):
    """initialize(config=PATH) and initialize(config=dict of the same document) give the same steps."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    assert sup.train_python(str(path), token_file, 2) == sup.train_python(config, token_file, 2)


def test_the_seed_decides_the_weights(config, batch):
    """The same strata.seed gives the same initial loss, another seed another."""
    def first_loss(seed):
        c = json.loads(json.dumps(config))
        c["strata"]["seed"] = seed
        return float(sup.new_engine(c).eval_loss(batch))

    assert first_loss(1234) == first_loss(1234)
    assert first_loss(1234) != first_loss(99)


def test_backend_and_cap_arguments_override_the_config(config):
    """backend="host" and device_memory_cap="32MiB" override strata.backend / device_memory_cap: the config
    names cuda (which would fail on a machine without a GPU, and be the GPU on one) and 64 MiB."""
    config["strata"]["backend"] = "cuda"
    engine = sup.new_engine(config, backend="host", device_memory_cap="32MiB")
    assert engine.memory_snapshot()["backend"] == "host"
    assert engine._core.device_capacity == 32 << 20


def test_init_distributed_without_a_launcher_is_one_rank():
    """init_distributed() outside mpirun: DistInfo(rank 0, world 1, local 0 of 1, launched False)."""
    info = strata.init_distributed()
    assert (info.rank, info.world_size, info.local_rank, info.local_size, info.launched) == (0, 1, 0, 1, False)


def test_one_process_is_the_main_process(engine):
    """Without a launcher: rank 0 of 1, local rank 0, the main process."""
    assert (engine.rank, engine.world_size, engine.local_rank) == (0, 1, 0)
    assert engine.is_main_process is True


def test_engine_print_writes_like_print(engine, capfd):
    """engine.print(*args) on rank 0 writes the args separated by spaces, one line."""
    engine.print("step", 3, "loss", 1.5)
    out, _ = capfd.readouterr()
    assert out == "step 3 loss 1.5\n"


MODEL_FORMS = {
    "preset_name": lambda: "tiny",
    "model_json_file": lambda: str(sup.SOURCE_DIR / "configs" / "models" / "tiny.json"),
    "model_config_object": lambda: strata.ModelConfig.preset("tiny"),
}


@pytest.mark.parametrize("form", sorted(MODEL_FORMS))
def test_every_model_form_builds_the_same_model(config, batch, form):
    """model= as a preset name, a model JSON file or a strata.ModelConfig: the same fresh weights from
    strata.seed, so the same loss."""
    engine, _, _, _ = strata.initialize(config, MODEL_FORMS[form](), seq_len=sup.SEQ_LEN)
    assert float(engine.eval_loss(batch)) == float(sup.new_engine(config).eval_loss(batch))

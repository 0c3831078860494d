"""LoRA adapters from Python (docs/python.md): initialize(adapter=DIR) starts from a PEFT adapter directory
over its base, a config's strata.lora block starts new adapters, and engine.export(path, merged=...) writes
the PEFT adapter directory or the merged model, as strata train's --export / --export-merged do."""

import json
import struct

import pytest

import strata
import strata_support as sup

LORA = sup.SOURCE_DIR / "tests" / "reference" / "data" / "lora_llama"


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}


def adapter_engine(config, **kwargs):
    engine, _, _, _ = strata.initialize(config, str(LORA / "base"), seq_len=sup.SEQ_LEN, **kwargs)
    return engine


def test_an_adapter_directory_trains_and_exports_as_peft_wrote_it(config, token_file, tmp_path):
    """initialize(adapter=DIR): two steps, then export(DIR) writes PEFT's tensors (names, shapes, fp32) and
    its settings."""
    engine = adapter_engine(config, adapter=str(LORA / "adapter"))
    sup.run_steps(engine, engine.token_loader(str(token_file)), 2)
    engine.export(str(tmp_path / "out"))
    want = safetensors_header(LORA / "adapter" / "adapter_model.safetensors")
    got = safetensors_header(tmp_path / "out" / "adapter_model.safetensors")
    assert {k: (v["dtype"], v["shape"]) for k, v in got.items()} == \
           {k: (v["dtype"], v["shape"]) for k, v in want.items()}
    peft = json.loads((LORA / "adapter" / "adapter_config.json").read_text())
    ours = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert (ours["r"], ours["lora_alpha"], ours["peft_type"]) == (peft["r"], peft["lora_alpha"], "LORA")
    assert sorted(ours["target_modules"]) == sorted(peft["target_modules"])


def test_merged_export_is_a_model_directory_of_the_bases_tensors(config, tmp_path):
    """export(DIR, merged=True): config.json and model.safetensors with the base's tensor names."""
    engine = adapter_engine(config, adapter=str(LORA / "adapter"))
    engine.export(str(tmp_path / "merged"), merged=True)
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["num_hidden_layers"] == 2
    got = safetensors_header(tmp_path / "merged" / "model.safetensors")
    base = safetensors_header(LORA / "base" / "model.safetensors")
    assert sorted(got) == sorted(base)
    assert not any("lora" in k for k in got)


def test_merged_export_without_adapters_is_refused(engine, tmp_path):
    with pytest.raises(strata.ConfigError, match="merged=True"):
        engine.export(str(tmp_path / "m"), merged=True)


def test_a_lora_block_trains_new_adapters_over_the_frozen_base(config, token_file):
    """strata.lora in the config dict: the loss moves, and the plan keeps the base's working copy only."""
    config["strata"]["lora"] = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    engine = adapter_engine(config)
    steps = sup.run_steps(engine, engine.token_loader(str(token_file)), 3)
    assert steps[-1].loss != steps[0].loss


def test_a_bad_adapter_directory_is_refused_naming_the_argument(config, tmp_path):
    with pytest.raises(strata.ConfigError, match=r"initialize\(adapter=\.\.\.\)"):
        adapter_engine(config, adapter=str(tmp_path))


def test_an_nf4_base_trains_and_holds_less(config, token_file):
    """strata.lora.base_dtype "nf4" from Python: the adapters train over QLoRA's base, whose packed bytes
    make the plan's pinned state smaller than over the bf16 base."""
    config["strata"]["lora"] = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}
    bf16 = adapter_engine(config).memory_plan["pinned_state"]
    config["strata"]["lora"]["base_dtype"] = "nf4"
    engine = adapter_engine(config)
    assert engine.memory_plan["pinned_state"] < bf16
    steps = sup.run_steps(engine, engine.token_loader(str(token_file)), 3)
    assert steps[-1].loss != steps[0].loss

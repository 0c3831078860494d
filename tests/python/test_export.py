"""engine.export (docs/python.md, the DeepSpeed table): a Hugging Face directory, or one .safetensors
file, of the model's bf16 weights."""

import json
import struct

import strata
import strata_support as sup


def safetensors_header(path):
    """The JSON header of a .safetensors file (8-byte little-endian length, then the JSON)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def test_export_writes_a_hugging_face_directory(engine, tmp_path):
    """export(DIR): config.json with tiny's shape and safetensors weights in bf16."""
    engine.export(str(tmp_path / "model"))
    cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (32, 2, 256)
    weights = sorted((tmp_path / "model").glob("*.safetensors"))
    assert weights
    dtypes = {t["dtype"] for name, t in safetensors_header(weights[0]).items() if name != "__metadata__"}
    assert dtypes == {"BF16"}


def test_export_to_a_safetensors_name_writes_one_file(engine, tmp_path):
    """export("NAME.safetensors"): that one file, holding the embedding."""
    engine.export(str(tmp_path / "model.safetensors"))
    header = safetensors_header(tmp_path / "model.safetensors")
    assert any("embed" in name for name in header)
    assert list(tmp_path.iterdir()) == [tmp_path / "model.safetensors"]


def test_export_drops_a_pending_forward(config, token_file, tmp_path):
    """export after a forward without backward drops that forward: the next step trains as if it had
    never run, bit for bit."""
    def steps(export_between):
        engine = sup.new_engine(config)
        loader = engine.token_loader(str(token_file))
        if export_between:
            engine(next(engine.token_loader(str(token_file), shuffle=False)))
            engine.export(str(tmp_path / "mid.safetensors"))
        return sup.run_steps(engine, loader, 1)

    assert steps(True) == steps(False)


def trained_engine(config, token_file):
    """A tiny engine after 3 steps (the warm-up's rate is above 0 from step 3: the weights are not the
    seed's any more)."""
    engine = sup.new_engine(config)
    sup.run_steps(engine, engine.token_loader(str(token_file)), 3)
    return engine


def test_an_exported_directory_initializes_the_same_model(config, token_file, batch, tmp_path):
    """initialize(model=exported directory) starts from the exported weights: its eval_loss of a batch is
    the exporting engine's, bit for bit (the working params are bf16, as the export)."""
    engine = trained_engine(config, token_file)
    engine.export(str(tmp_path / "model"))
    loaded, _, _, _ = strata.initialize(config, str(tmp_path / "model"), seq_len=sup.SEQ_LEN)
    assert float(loaded.eval_loss(batch)) == float(engine.eval_loss(batch))


def test_an_exported_safetensors_file_initializes_the_same_model(config, token_file, batch, tmp_path):
    """initialize(model=NAME.safetensors) likewise starts from that file's weights."""
    engine = trained_engine(config, token_file)
    engine.export(str(tmp_path / "model.safetensors"))
    loaded, _, _, _ = strata.initialize(config, str(tmp_path / "model.safetensors"), seq_len=sup.SEQ_LEN)
    assert float(loaded.eval_loss(batch)) == float(engine.eval_loss(batch))


def test_every_family_directory_initializes_to_transformers_loss(config):
    """initialize(model=DIR) reads each family's Hugging Face directory (tests/reference/data: transformers'
    own save_pretrained, docs/model.md "Model families"), and its loss of the dumped batch is transformers'
    within bf16 rounding (the engine's working params are bf16)."""
    import numpy as np

    def read_f32(path, name):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            t = json.loads(f.read(n))[name]
            assert t["dtype"] == "F32"
            begin, end = t["data_offsets"]
            f.seek(8 + n + begin)
            return np.frombuffer(f.read(end - begin), dtype="<f4")

    for family in ("mistral", "qwen2", "qwen3", "phi3", "gemma"):
        d = sup.SOURCE_DIR / "tests" / "reference" / "data" / family
        meta = json.loads((d / "reference.json").read_text())
        engine, _, _, _ = strata.initialize(config, str(d), seq_len=meta["seq_len"])
        ids = read_f32(d / "reference.safetensors", "input_ids").astype(np.int32)
        ids = ids.reshape(meta["batch"], meta["seq_len"] + 1)
        loss = float(engine.eval_loss(ids))
        assert abs(loss - meta["loss"]) <= 1e-2 * meta["loss"], (family, loss, meta["loss"])

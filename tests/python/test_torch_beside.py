"""strata beside PyTorch and transformers in one process, in either import order (docs/python.md, "Beside
PyTorch"): each order, in a child interpreter, builds a tiny LlamaForCausalLM (random weights, no download)
and runs its forward, asks torch for its NCCL and cuDNN versions, and trains one step of a tiny Strata
engine; the CUDA libraries torch loads are the ones it loads alone.

The child runs with $STRATA_TORCH_PYTHON (scripts/torch-venv.sh makes one: /work/venv-torch/bin/python),
else this interpreter; without torch and transformers there, the tests skip.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import strata
import strata_support as sup

PYTHON = os.environ.get("STRATA_TORCH_PYTHON", sys.executable)
PACKAGE_DIR = pathlib.Path(strata.__file__).resolve().parent

CHILD = r"""
import json, os, sys
sys.path.insert(0, os.environ["CHILD_TESTS_DIR"])
order = sys.argv[1]


def use_torch():
    import torch, transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 8, 64) and torch.isfinite(out.loss), out.loss
    # Calls into torch's own NCCL and cuDNN: the toolkit's older copies would be found here.
    return {"nccl": list(torch.cuda.nccl.version()), "cudnn": torch.backends.cudnn.version(),
            "loss": float(out.loss)}


def use_strata():
    import strata_support as sup
    tokens = os.path.join(os.environ["CHILD_TMP"], "train.bin")
    sup.write_llmc_tokens(tokens, [i % 256 for i in range(4096)])
    engine = sup.new_engine(sup.demo_config())
    step, = sup.run_steps(engine, engine.token_loader(tokens), 1)
    assert step.loss == step.loss and step.loss > 0, step
    return {"loss": step.loss}


result = {}
if order == "strata-first":
    import strata  # noqa: F401
    result["torch"] = use_torch()
    result["strata"] = use_strata()
elif order == "torch-first":
    import torch, transformers  # noqa: F401
    import strata  # noqa: F401
    result["strata"] = use_strata()
    result["torch"] = use_torch()
else:
    result["torch"] = use_torch()
maps = set()
with open("/proc/self/maps") as f:
    for line in f:
        path = line.split()[-1]
        if path.startswith("/") and ".so" in path:
            maps.add(os.path.realpath(path))
result["maps"] = sorted(maps)
print("RESULT " + json.dumps(result))
"""

CUDA_LIB_NAMES = ("libnccl", "libcudnn", "libcublas", "libcudart", "libnvrtc")


def missing_modules():
    code = ("import importlib.util as u; "
            "print(' '.join(m for m in ('torch', 'transformers') if u.find_spec(m) is None))")
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return f"{PYTHON} does not run: {p.stderr.strip()}"
    return p.stdout.strip()


@pytest.fixture(scope="module")
def run_order(tmp_path_factory):
    missing = missing_modules()
    if missing:
        pytest.skip(f"{missing} not importable by {PYTHON} (set STRATA_TORCH_PYTHON to an interpreter that "
                    f"has torch and transformers: scripts/torch-venv.sh)")

    results = {}

    def run(order):
        if order in results:
            return results[order]
        tmp = tmp_path_factory.mktemp(order)
        env = sup.child_env(CHILD_TMP=str(tmp), CHILD_TESTS_DIR=str(pathlib.Path(__file__).parent))
        p = subprocess.run([PYTHON, "-c", CHILD, order], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{order}: child exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        results[order] = json.loads(line[len("RESULT "):])
        return results[order]

    return run


def cuda_libs(maps, inside_strata):
    """The loaded CUDA-side libraries (realpaths) in or outside strata's package folder."""
    out = set()
    for path in maps:
        name = os.path.basename(path)
        if (path.startswith(str(PACKAGE_DIR) + os.sep)) != inside_strata:
            continue
        if name.startswith(CUDA_LIB_NAMES) or name.startswith("st_"):
            out.add(path)
    return out


@pytest.mark.parametrize("order", ["strata-first", "torch-first"])
def test_torch_and_strata_run_in_one_process(run_order, order):
    """Both run in `order`; torch loads exactly the CUDA libraries it loads alone, and its NCCL and cuDNN
    versions are its own; strata's CUDA libraries are its private copies only."""
    alone = run_order("torch-only")
    both = run_order(order)
    assert both["torch"]["nccl"] == alone["torch"]["nccl"]
    assert both["torch"]["cudnn"] == alone["torch"]["cudnn"]
    assert both["torch"]["loss"] == alone["torch"]["loss"]
    assert cuda_libs(both["maps"], inside_strata=False) == cuda_libs(alone["maps"], inside_strata=False)
    mine = cuda_libs(both["maps"], inside_strata=True)
    assert all(os.path.basename(p).startswith("st_") for p in mine), mine

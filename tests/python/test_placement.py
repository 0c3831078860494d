"""Where the state lives does not change the arithmetic (zero3/engine.h, Note [Same losses in every
placement]), through the Python loop too: every offload placement of the stock configs trains the losses
of configs/demo_cpu.json's CPU offload, bit for bit, and the NVMe one keeps its state on NVMe."""

import copy
import json

import pytest

import strata_support as sup

STEPS = 4
# (offload_param, offload_optimizer) of zero_optimization; "nvme" takes its other keys from
# configs/zero3_nvme.json and a temporary nvme_path.
PLACEMENTS = [("none", "none"), ("none", "cpu"), ("cpu", "nvme"), ("nvme", "nvme")]


def placed(config, param, optim, nvme_dir):
    """`config` with the state placed as (param, optim) says."""
    with open(sup.SOURCE_DIR / "configs" / "zero3_nvme.json") as f:
        nvme = json.load(f)["zero_optimization"]
    c = copy.deepcopy(config)
    for key, device in (("offload_param", param), ("offload_optimizer", optim)):
        if device == "nvme":
            c["zero_optimization"][key] = dict(nvme[key], nvme_path=str(nvme_dir))
        else:
            c["zero_optimization"][key] = {"device": device, "pin_memory": True}
    return c


@pytest.fixture(scope="module")
def cpu_offload_steps(token_file):
    """configs/demo_cpu.json's steps (parameters and optimizer offloaded to pinned host memory)."""
    return sup.train_python(sup.demo_config(), token_file, STEPS)


@pytest.mark.parametrize("param,optim", PLACEMENTS, ids=[f"param_{p}-optim_{o}" for p, o in PLACEMENTS])
def test_every_placement_trains_the_same_steps(config, token_file, tmp_path, cpu_offload_steps, param, optim):
    """The Python loop's losses, rates and norms with the state on the device, in pinned memory or on
    NVMe are the CPU offload's, bit for bit."""
    assert sup.train_python(placed(config, param, optim, tmp_path), token_file, STEPS) == cpu_offload_steps


def test_nvme_offload_keeps_the_state_on_nvme(config, token_file, tmp_path):
    """With both offloaded to NVMe, the snapshot's nvme tier holds the master weights; pinned memory none."""
    engine = sup.new_engine(placed(config, "nvme", "nvme", tmp_path))
    sup.run_steps(engine, engine.token_loader(str(token_file)), 1)
    tiers = engine.memory_snapshot()["tiers"]
    assert tiers["nvme"]["by_kind"]["master"]["current"] > 0
    assert tiers["pinned"]["by_kind"]["master"]["current"] == 0

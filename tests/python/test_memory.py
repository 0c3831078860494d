"""engine.memory_snapshot() and engine.memory_plan (docs/python.md, "Memory"): memprof's snapshot document
and the device plan, which never exceed the device cap."""

import pytest

import strata_support as sup

CAP = 64 << 20  # strata.device_memory_cap of configs/demo_cpu.json
PLAN_PARTS = ("device_state", "device_working_set", "device_activations", "device_ops",
              "device_accumulator_bytes", "device_cache")


def plan_value(plan, key):
    """A figure of engine.memory_plan, whether the binding gives a dict or an object."""
    return plan[key] if isinstance(plan, dict) else getattr(plan, key)


@pytest.fixture
def trained(config, token_file):
    """A tiny engine after 2 optimizer steps."""
    engine = sup.new_engine(config)
    sup.run_steps(engine, engine.token_loader(str(token_file)), 2)
    return engine


def test_snapshot_is_memprofs_document(trained):
    """memory_snapshot() is a dict of schema strata.memprof with the tiers device, pinned and nvme."""
    snap = trained.memory_snapshot()
    assert isinstance(snap, dict)
    assert snap["schema"] == "strata.memprof"
    assert set(snap["tiers"]) == {"device", "pinned", "nvme"}


def test_device_peak_stays_within_the_cap(trained):
    """The device tier's peak bytes are positive (chunks were gathered) and at most the 64 MiB cap."""
    device = trained.memory_snapshot()["tiers"]["device"]
    assert 0 < device["total"]["peak"] <= device["capacity"] <= CAP


def test_offloaded_state_lives_in_pinned_memory(trained):
    """offload_optimizer cpu: the fp32 master is in the pinned tier, none of it on the device."""
    tiers = trained.memory_snapshot()["tiers"]
    assert tiers["pinned"]["by_kind"]["master"]["current"] > 0
    assert tiers["device"]["by_kind"]["master"]["current"] == 0


def test_there_is_no_nvme_without_nvme_offload(trained):
    """No NVMe tier in use when nothing is offloaded there."""
    assert trained.memory_snapshot()["tiers"]["nvme"]["total"]["current"] == 0


def test_the_device_tier_holds_what_the_plan_leaves_it(trained):
    """The tier manager's device pool gets the cap less the plan's activations and compute workspace (what
    state, working set, accumulators and the chunk cache share), and training stays within it."""
    plan = trained.memory_plan
    device = trained.memory_snapshot()["tiers"]["device"]
    assert device["capacity"] == CAP - plan_value(plan, "device_activations") - plan_value(plan, "device_ops")
    assert 0 < device["total"]["peak"] <= device["capacity"]
    assert plan_value(plan, "device_cache") > 0


def test_plan_reserves_activations_and_a_working_set(engine):
    """The plan holds a working set and activations for the micro-batch, and no device state (offloaded)."""
    plan = engine.memory_plan
    assert plan_value(plan, "device_working_set") > 0
    assert plan_value(plan, "device_activations") > 0
    assert plan_value(plan, "device_state") == 0


def test_keeping_every_activation_costs_more_device_memory(config):
    """checkpoint_activations=False plans more activation bytes than True, and the plan shows both sizes."""
    kept = sup.new_engine(config, checkpoint_activations=False).memory_plan
    recomputed = sup.new_engine(config, checkpoint_activations=True).memory_plan
    assert kept["checkpoint_activations"] is False and recomputed["checkpoint_activations"] is True
    assert plan_value(kept, "device_activations") > plan_value(recomputed, "device_activations")
    assert kept["device_activations"] == recomputed["device_activations_all"]
    assert recomputed["device_activations"] == kept["device_activations_checkpointed"]


def test_auto_checkpointing_keeps_every_activation_when_they_fit(config):
    """The default (strata.checkpoint_activations "auto") keeps every activation when the cap has room."""
    plan = sup.new_engine(config).memory_plan
    assert plan["checkpoint_activations"] is False
    assert plan["device_activations"] == plan["device_activations_all"]


def test_longer_sequences_plan_more_activations(config):
    """seq_len=64 plans more activation bytes than seq_len=16."""
    long = plan_value(sup.new_engine(config, seq_len=64).memory_plan, "device_activations")
    short = plan_value(sup.new_engine(config, seq_len=16).memory_plan, "device_activations")
    assert long > short


def test_the_plan_lists_each_chunks_update_route(trained):
    """memory_plan["update_routes"]: one route a chunk, in words; demo_cpu.json offloads the optimizer to the
    CPU, so every chunk is stepped by the CPU optimizer, and it trains on one rank (no reduce-scatter)."""
    routes = plan_value(trained.memory_plan, "update_routes")
    assert len(routes) == trained.model_config.n_layers + 2  # the embedding, each block, the head
    for r in routes:
        assert "; CPU optimizer" in r, r
        assert "reduce-scattered" not in r, r


def test_the_plan_carries_the_predicted_step(engine):
    """memory_plan has the step-time model's prediction for the plan (docs/train.md, "Predicted step times"):
    a positive step made of the pass and the update, its bottleneck, and the machine's rates it took."""
    plan = engine.memory_plan
    step = plan["predicted_step"]
    assert step["step"] > 0
    assert step["step"] == pytest.approx(step["pass"] + step["update"])
    assert step["bottleneck"]
    assert plan["machine"]["compute_flops"] > 0
    assert plan["placements"] == []  # the config's devices are fixed: nothing to choose from


def test_offload_devices_auto_choose_a_placement_that_fits(config):
    """offload_param.device and offload_optimizer.device "auto": the engine plans and predicts every
    placement, takes the fastest that fits, and the plan shows the table with the one it chose."""
    config["zero_optimization"]["offload_param"] = {"device": "auto"}
    config["zero_optimization"]["offload_optimizer"] = {"device": "auto"}
    plan = sup.new_engine(config).memory_plan
    chosen = [p for p in plan["placements"] if p["chosen"]]
    assert len(chosen) == 1 and chosen[0]["fits"]
    assert chosen[0]["device_need"] <= CAP
    assert all(p["predicted_step"] >= chosen[0]["predicted_step"] * 0.99 for p in plan["placements"] if p["fits"])

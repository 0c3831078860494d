"""The Python loop against `strata train`: the same config, model and data give the same steps, bit for bit
(docs/python.md, "The loop": token_loader's windows of T + 1 tokens train exactly as strata train does)."""

import pytest

import strata
import strata_support as sup

STEPS = 4


@pytest.fixture(scope="module", params=[1, 2], ids=["accumulation1", "accumulation2"])
def both_runs(request, strata_bin, token_file, tmp_path_factory):
    """(Python loop's steps, strata train's steps) over the demo config at accumulation 1 and 2."""
    cfg = sup.accumulating(sup.demo_config(), request.param)
    cli = sup.run_cli_train(strata_bin, cfg, token_file, tmp_path_factory.mktemp("cli"), STEPS)
    py = sup.train_python(cfg, token_file, STEPS)
    assert len(cli.steps) == STEPS and len(py) == STEPS
    return py, cli.steps


def test_losses_are_strata_trains_bit_for_bit(both_runs):
    """engine.last_step.loss after each optimizer step == strata train's train_loss (%.17g) exactly."""
    py, cli = both_runs
    assert [repr(x) for x in sup.field(py, "loss")] == [repr(x) for x in sup.field(cli, "loss")]


def test_learning_rates_are_strata_trains(both_runs):
    """engine.last_step.lr == strata train's lr, step by step."""
    py, cli = both_runs
    assert sup.field(py, "lr") == sup.field(cli, "lr")


def test_grad_norms_are_strata_trains(both_runs):
    """engine.last_step.grad_norm == strata train's grad_norm, step by step."""
    py, cli = both_runs
    assert sup.field(py, "grad_norm") == sup.field(cli, "grad_norm")


def test_global_samples_are_strata_trains_sample_counts(both_runs):
    """engine.global_samples after each step == the samples column of strata train's csv_monitor."""
    py, cli = both_runs
    assert sup.field(py, "samples") == sup.field(cli, "samples")


def test_the_loss_falls_over_a_few_steps(config, token_file):
    """Training works at all: with a constant rate, the mean loss of steps 9-12 is below that of 1-4
    (the data is the same batch again and again, so the fall is the model's)."""
    del config["scheduler"]
    engine = sup.new_engine(config)
    loader = engine.token_loader(str(token_file), shuffle=False)
    batch = next(loader)
    losses = []
    for _ in range(12):
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        losses.append(engine.last_step.loss)
    assert sum(losses[-4:]) < sum(losses[:4])


def test_forward_returns_a_float_loss(engine, batch):
    """engine(batch) returns a strata.Loss: a float, whose .item() is the same value."""
    loss = engine(batch)
    assert isinstance(loss, strata.Loss)
    assert isinstance(loss, float)
    assert loss.item() == float(loss)
    assert 0 < float(loss) < 10


def test_step_info_describes_the_step(config, token_file):
    """last_step after step k: step k, applied, loss scale 1 (bf16), B x T tokens per micro-batch."""
    engine = sup.new_engine(sup.accumulating(config, 2))
    sup.run_steps(engine, engine.token_loader(str(token_file)), 2)
    s = engine.last_step
    assert s.step == 2 == engine.global_steps
    assert s.applied is True
    assert s.loss_scale == 1.0
    assert s.tokens == engine.train_micro_batch_size_per_gpu() * sup.SEQ_LEN * 2
    assert s.grad_norm == engine.get_global_grad_norm()


def test_the_engine_releases_the_gil_while_it_computes(config, batch):
    """Another Python thread runs while eval_loss computes: with the interpreter's switch interval at
    1000 s, the main thread gives up the GIL only where the engine releases it, yet a counting thread
    advances during the calls."""
    import sys
    import threading
    import time

    config["strata"]["threads"] = 1
    engine = sup.new_engine(config)
    count, stop = [0], threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)  # gives the GIL back, so that the main thread can take it when the call returns

    old = sys.getswitchinterval()
    sys.setswitchinterval(1000)
    t = threading.Thread(target=counter)
    t.start()
    try:
        during = 0
        for _ in range(50):
            before = count[0]
            engine.eval_loss(batch)
            during += count[0] - before
    finally:
        stop.set()
        sys.setswitchinterval(old)
        t.join()
    assert during > 0

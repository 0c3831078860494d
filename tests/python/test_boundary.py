"""Gradient accumulation as DeepSpeed's engine shows it (docs/python.md, "The loop" and the table):
the boundary, the counters, the step's figures, dropped forwards and out-of-order calls."""

import pytest

import strata
import strata_support as sup

ACCUMULATION = 3


@pytest.fixture
def engine3(config):
    """A tiny engine accumulating 3 micro-batches of 4 per optimizer step."""
    return sup.new_engine(sup.accumulating(config, ACCUMULATION))


@pytest.fixture
def loader3(engine3, token_file):
    return engine3.token_loader(str(token_file))


def micro_batch(engine, loader):
    """forward + backward of the loader's next batch (no step())."""
    loss = engine(next(loader))
    engine.backward(loss)
    return loss


def test_sizes_come_from_the_config(engine3):
    """micro-batch 4 (demo_cpu.json), accumulation 3, train_batch_size 4 x 3 x 1 rank."""
    assert engine3.train_micro_batch_size_per_gpu() == 4
    assert engine3.gradient_accumulation_steps() == ACCUMULATION
    assert engine3.train_batch_size() == 4 * ACCUMULATION


def test_boundary_is_true_on_the_last_micro_batch_only(engine3, loader3):
    """is_gradient_accumulation_boundary() after each micro-batch's backward (before its step()):
    False, False, True, and again for the next optimizer step."""
    seen = []
    for _ in range(2 * ACCUMULATION):
        micro_batch(engine3, loader3)
        seen.append(engine3.is_gradient_accumulation_boundary())
        engine3.step()
    assert seen == [False, False, True] * 2


def test_global_steps_count_optimizer_steps_only(engine3, loader3):
    """global_steps stays 0 through the first two step() calls and becomes 1 at the third."""
    seen = []
    for _ in range(ACCUMULATION):
        micro_batch(engine3, loader3)
        engine3.step()
        seen.append(engine3.global_steps)
    assert seen == [0, 0, 1]


def test_micro_steps_count_every_step_call(engine3, loader3):
    """micro_steps is the number of step() calls so far, across optimizer steps."""
    seen = []
    for _ in range(2 * ACCUMULATION):
        micro_batch(engine3, loader3)
        engine3.step()
        seen.append(engine3.micro_steps)
    assert seen == list(range(1, 2 * ACCUMULATION + 1))


def test_global_samples_count_train_batches(engine3, loader3):
    """global_samples is global_steps x train_batch_size() after each optimizer step."""
    seen = []
    for _ in range(2):
        for _ in range(ACCUMULATION):
            micro_batch(engine3, loader3)
            engine3.step()
        seen.append(engine3.global_samples)
    assert seen == [engine3.train_batch_size(), 2 * engine3.train_batch_size()]


def test_last_step_is_set_at_the_boundary_only(engine3, loader3):
    """last_step describes step 1 only once its third micro-batch has stepped."""
    for _ in range(ACCUMULATION - 1):
        micro_batch(engine3, loader3)
        engine3.step()
    assert engine3.last_step is None or engine3.last_step.step == 0
    micro_batch(engine3, loader3)
    engine3.step()
    assert engine3.last_step.step == 1


def test_step_loss_is_the_mean_of_its_micro_batch_losses(engine3, loader3):
    """last_step.loss == the mean of the 3 losses engine() returned (summed in double, as the engine)."""
    losses = []
    for _ in range(ACCUMULATION):
        losses.append(float(micro_batch(engine3, loader3)))
        engine3.step()
    assert engine3.last_step.loss == pytest.approx(sum(losses) / ACCUMULATION, rel=1e-12)


def test_get_lr_is_a_list_of_one_float(engine3):
    """get_lr() is a list with one float (one parameter group)."""
    lr = engine3.get_lr()
    assert isinstance(lr, list) and len(lr) == 1 and isinstance(lr[0], float)


def test_get_lr_is_the_rate_of_the_next_step(config, token_file):
    """get_lr()[0] before a step == the lr that step reports in last_step (DeepSpeed: the optimizer's
    current rate, which the scheduler has already advanced past the last step)."""
    engine = sup.new_engine(config)
    loader = engine.token_loader(str(token_file))
    before, used = [], []
    for _ in range(4):
        before.append(engine.get_lr()[0])
        used.append(sup.run_steps(engine, loader, 1)[0].lr)
    assert before == used
    assert used[0] < used[-1]  # the warm-up of demo_cpu.json's WarmupCosineLR


def test_global_grad_norm_is_the_steps(engine3, loader3):
    """get_global_grad_norm() after a step == last_step.grad_norm, finite and positive."""
    for _ in range(ACCUMULATION):
        micro_batch(engine3, loader3)
        engine3.step()
    norm = engine3.get_global_grad_norm()
    assert norm == engine3.last_step.grad_norm
    assert 0 < norm < float("inf")


def test_was_step_applied_after_a_bf16_step(engine3, loader3):
    """was_step_applied() is True after a bf16 step (no overflow), and skipped_steps stays 0."""
    for _ in range(ACCUMULATION):
        micro_batch(engine3, loader3)
        engine3.step()
    assert engine3.was_step_applied() is True
    assert engine3.skipped_steps == 0


def test_loss_scale_is_one_without_fp16():
    """engine.loss_scale and optimizer.loss_scale are 1 with bf16."""
    engine, optimizer, _, _ = strata.initialize(sup.demo_config(), sup.MODEL, seq_len=sup.SEQ_LEN)
    assert engine.loss_scale == 1
    assert optimizer.loss_scale == 1


def train_with_extra_forwards(config, token_file, extra):
    """4 steps at accumulation 3 (the warm-up's rate is above 0 from step 3); before every micro-batch's
    forward, engine(extra) (no backward) when `extra` is not None. Returns the steps' figures and the
    final micro_steps."""
    engine = sup.new_engine(sup.accumulating(config, ACCUMULATION))
    loader = engine.token_loader(str(token_file))
    out = []
    for _ in range(4):
        for _ in range(ACCUMULATION):
            if extra is not None:
                engine(extra)
            micro_batch(engine, loader)
            engine.step()
        out.append(sup.Step(engine.global_samples, engine.last_step.loss, engine.last_step.lr,
                            engine.last_step.grad_norm))
    return out, engine.micro_steps


def test_a_forward_without_backward_is_dropped(config, token_file):
    """A forward followed by another forward does not count: the steps' losses, rates and norms are those
    of a run without it, bit for bit, and micro_steps is the same."""
    import numpy as np
    extra = np.arange(4 * (sup.SEQ_LEN + 1), dtype=np.int64).reshape(4, sup.SEQ_LEN + 1) % 256
    with_extra = train_with_extra_forwards(config, token_file, extra)
    without = train_with_extra_forwards(config, token_file, None)
    assert with_extra == without


def test_backward_of_a_stale_loss_raises_valueerror(engine3, loader3):
    """backward(loss) with the Loss of an earlier forward (not the last one) raises ValueError."""
    old = micro_batch(engine3, loader3)
    engine3.step()
    engine3(next(loader3))
    with pytest.raises(ValueError):
        engine3.backward(old)


def test_backward_of_a_dropped_forwards_loss_raises_valueerror(engine3, loader3):
    """A forward dropped by the next forward: backward of its loss raises ValueError, and the pending one
    still goes through."""
    first = engine3(next(loader3))
    second = engine3(next(loader3))
    with pytest.raises(ValueError):
        engine3.backward(first)
    engine3.backward(second)
    engine3.step()
    assert engine3.micro_steps == 1


def test_backward_of_another_engines_loss_raises_valueerror(config, token_file, engine3, loader3):
    """The Loss of another engine's forward is not this engine's last forward's: ValueError, even when
    both engines have run as many forwards."""
    other = sup.new_engine(config)
    theirs = other(next(other.token_loader(str(token_file))))
    engine3(next(loader3))
    with pytest.raises(ValueError):
        engine3.backward(theirs)


@pytest.mark.parametrize("after", ["backward", "step"])
def test_backward_without_a_pending_forward_raises_runtimeerror(engine3, loader3, after):
    """A second backward of the last forward's loss (after its backward, or after its step()) is a call
    out of order: strata.StrataError, a RuntimeError."""
    loss = micro_batch(engine3, loader3)
    if after == "step":
        engine3.step()
    with pytest.raises(RuntimeError) as e:
        engine3.backward(loss)
    assert isinstance(e.value, strata.StrataError)


def test_a_boundary_step_without_any_backward_raises(engine3):
    """step() at the boundary with no backward since the last optimizer step has no gradients to step with:
    strata.StrataError, and no optimizer step is taken."""
    engine3.step()
    engine3.step()
    with pytest.raises(strata.StrataError) as e:
        engine3.step()
    assert "no backward" in str(e.value)
    assert engine3.global_steps == 0

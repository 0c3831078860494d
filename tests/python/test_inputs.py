"""What a batch may be (docs/python.md, "The loop"): int32/int64 arrays of any strides from numpy, a
memoryview, Strata's own Tokens or anything with __dlpack__ all give the same loss; labels default to
input_ids, negative labels are ignored; eval_loss leaves training alone."""

import array
import math

import numpy as np
import pytest

import strata
import strata_support as sup



class DLPackOnly:
    """Exposes a numpy array through the DLPack protocol alone (no buffer protocol, no __array__)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *, stream=None, **_newer_keywords):
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def strided(a):
    """The same values as `a`, as a non-contiguous view (every other column of a wider array)."""
    wide = np.zeros((a.shape[0], 2 * a.shape[1]), dtype=a.dtype)
    wide[:, ::2] = a
    view = wide[:, ::2]
    assert not view.flags.c_contiguous
    return view


def as_array_module(a):
    """`a` as an array.array('i') seen through a 2-D memoryview."""
    flat = array.array("i", a.astype(np.int32).ravel().tolist())
    return memoryview(flat).cast("B").cast("i", list(a.shape))


FORMS = {
    "numpy_int64": lambda a: a.astype(np.int64),
    "numpy_int32": lambda a: a.astype(np.int32),
    "numpy_uint16": lambda a: a.astype(np.uint16),  # llm.c's token width
    "numpy_fortran_order": lambda a: np.asfortranarray(a.astype(np.int64)),
    "numpy_strided_view": lambda a: strided(a.astype(np.int64)),
    "numpy_reversed_rows": lambda a: a[::-1].astype(np.int32)[::-1],
    "memoryview_int32": lambda a: memoryview(np.ascontiguousarray(a, dtype=np.int32)),
    "memoryview_int64": lambda a: memoryview(np.ascontiguousarray(a, dtype=np.int64)),
    "array_module": as_array_module,
    "dlpack_int32": lambda a: DLPackOnly(np.ascontiguousarray(a, dtype=np.int32)),
    "dlpack_int64": lambda a: DLPackOnly(np.ascontiguousarray(a, dtype=np.int64)),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_input_form_gives_the_same_loss(engine, batch, form):
    """eval_loss of the batch in each accepted form == eval_loss of the plain int32 numpy array."""
    assert float(engine.eval_loss(FORMS[form](batch))) == float(engine.eval_loss(batch))


def test_strata_tokens_give_the_same_loss(engine, token_file):
    """A strata.Tokens from token_loader, passed as it is, == its numpy copy."""
    tokens = next(engine.token_loader(str(token_file)))
    assert isinstance(tokens, strata.Tokens)
    assert float(engine.eval_loss(tokens)) == float(engine.eval_loss(np.array(tokens)))


@pytest.mark.parametrize("form", ["numpy_int64", "numpy_strided_view", "dlpack_int32"])
def test_training_forward_accepts_every_form(engine, batch, form):
    """engine(x) (the training forward) gives the same loss for other forms as for the int32 array."""
    expected = float(engine(batch))
    assert float(engine(FORMS[form](batch))) == expected


def test_eval_loss_is_the_training_forwards_loss(engine, batch):
    """eval_loss(batch) == engine(batch) on the same weights: the same loss without gradients."""
    evaluated = float(engine.eval_loss(batch))
    assert float(engine(batch)) == evaluated


def test_explicit_labels_equal_the_default(engine, batch):
    """labels=input_ids gives the loss of labels=None (the default)."""
    assert float(engine.eval_loss(batch, labels=batch.copy())) == float(engine.eval_loss(batch))


def test_labels_may_differ_from_inputs(engine, batch):
    """Other labels give another finite loss."""
    labels = (batch + 1) % 256
    loss = float(engine.eval_loss(batch, labels=labels))
    assert math.isfinite(loss)
    assert loss != float(engine.eval_loss(batch))


def test_a_batch_shorter_than_seq_len_is_accepted(engine, batch):
    """A batch of L tokens with L - 1 < seq_len runs (a forward of L - 1 tokens); its loss is finite."""
    assert math.isfinite(float(engine.eval_loss(batch[:, :9])))


def test_fewer_rows_than_the_micro_batch_are_accepted(engine, batch):
    """B below train_micro_batch_size_per_gpu: the loss of those rows (one row alone is finite)."""
    assert math.isfinite(float(engine.eval_loss(batch[:1])))


def masked_to_column(batch, t, ignore=-100):
    """Labels that keep column t of `batch` only (position t - 1 predicts it); the rest `ignore`."""
    labels = np.full_like(batch, ignore)
    labels[:, t] = batch[:, t]
    return labels


def test_ignored_labels_leave_out_their_positions(engine, batch):
    """With every label -100 but column t, the loss is the mean over those B positions only: finite,
    not the full loss, and the mean of the per-column losses is the full loss (equal weights)."""
    full = float(engine.eval_loss(batch))
    per_column = [float(engine.eval_loss(batch, labels=masked_to_column(batch, t)))
                  for t in range(1, batch.shape[1])]
    assert all(math.isfinite(x) for x in per_column)
    assert per_column[0] != full
    assert sum(per_column) / len(per_column) == pytest.approx(full, rel=1e-5)


def test_any_negative_label_is_ignored(engine, batch):
    """A label of -1 is ignored as -100 is."""
    a = float(engine.eval_loss(batch, labels=masked_to_column(batch, 5, ignore=-100)))
    b = float(engine.eval_loss(batch, labels=masked_to_column(batch, 5, ignore=-1)))
    assert a == b


def test_the_first_label_column_is_never_a_target(engine, batch):
    """labels[:, 0] has no position that predicts it (the shift): changing it leaves the loss."""
    labels = batch.copy()
    labels[:, 0] = (labels[:, 0] + 7) % 256
    assert float(engine.eval_loss(batch, labels=labels)) == float(engine.eval_loss(batch))


def train_with_evals(config, token_file, evaluate):
    """4 steps at accumulation 2 (the warm-up's rate is above 0 from step 3); with `evaluate`, eval_loss of
    a fixed batch before the first step and after every micro-batch's step() (mid-accumulation and at the
    boundary)."""
    engine = sup.new_engine(sup.accumulating(config, 2))
    probe = np.array(next(engine.token_loader(str(token_file), shuffle=False)))
    between = (lambda e: e.eval_loss(probe)) if evaluate else None
    if evaluate:
        engine.eval_loss(probe)
    return sup.run_steps(engine, engine.token_loader(str(token_file)), 4, between=between)


def test_eval_loss_does_not_change_training(config, token_file):
    """A run with eval_loss calls before the first step and after every micro-batch has the losses, rates
    and norms of a run without them, bit for bit."""
    assert train_with_evals(config, token_file, True) == train_with_evals(config, token_file, False)


def test_eval_loss_does_not_count_as_a_micro_batch(engine, batch):
    """eval_loss leaves micro_steps, global_steps and the boundary as they were."""
    engine.eval_loss(batch)
    assert engine.micro_steps == 0
    assert engine.global_steps == 0

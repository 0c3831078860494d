"""Labels of -100 and num_items_in_batch (docs/python.md, "Labels"): an ignored label leaves its position
out of the mean exactly as cutting the position out of the batch would; num_items_in_batch weighs a step's
micro-batches by their counted labels (transformers' convention), giving the gradients of one batch of all
their rows; without it each micro-batch weighs the same."""

import struct

import numpy as np
import pytest

import strata
import strata_support as sup


def ignore_columns(batch, columns):
    """`batch` as labels with `columns` set to -100."""
    labels = batch.copy()
    labels[:, columns] = -100
    return labels


def test_ignored_tail_is_the_batch_cut_short(engine, batch):
    """Labels -100 in the last k columns == the batch without those k columns: the positions that
    predicted them are gone either way, and the earlier positions see the same (causal) context."""
    L = batch.shape[1]
    for k in (1, 4, 9):
        ignored = float(engine.eval_loss(batch, labels=ignore_columns(batch, list(range(L - k, L)))))
        cut = float(engine.eval_loss(batch[:, :L - k]))
        assert ignored == pytest.approx(cut, rel=1e-6), k


def test_loss_is_the_mean_over_the_labels_that_count(engine, batch):
    """Keeping columns {2, 5, 9} (all rows) gives the mean of those three columns' losses, each taken with
    every other label -100; keeping a ragged set (rows differ) gives the count-weighted mean by hand."""
    L = batch.shape[1]

    def only(cells):
        labels = np.full_like(batch, -100)
        for r, t in cells:
            labels[r, t] = batch[r, t]
        return float(engine.eval_loss(batch, labels=labels))

    B = batch.shape[0]
    column = {t: only([(r, t) for r in range(B)]) for t in (2, 5, 9)}
    kept = only([(r, t) for t in (2, 5, 9) for r in range(B)])
    assert kept == pytest.approx(sum(column.values()) / 3, rel=1e-6)
    # Ragged: one cell of column 3 and all of column 7; each cell's loss alone, averaged per cell.
    cells = [(0, 3)] + [(r, 7) for r in range(B)]
    per_cell = [only([c]) for c in cells]
    assert only(cells) == pytest.approx(sum(per_cell) / len(per_cell), rel=1e-6)
    assert L > 9


def two_micro_batches(engine, token_file):
    """Two batches of the token loader and their labels: the first counts 3 labels, the second all."""
    loader = engine.token_loader(str(token_file), shuffle=False)
    a, b = np.array(next(loader)), np.array(next(loader))
    la = np.full_like(a, -100)
    la[0, 4], la[1, 9], la[3, 16] = a[0, 4], a[1, 9], a[3, 16]
    return (a, la), (b, b.copy())


def counted(labels):
    return int((labels[:, 1:] >= 0).sum())


def accumulate(config, micro_batches, num_items):
    """One optimizer step over `micro_batches` (accumulation = their count); with num_items, each forward
    gets num_items_in_batch = the labels that count in all of them. Returns (engine, losses)."""
    engine = sup.new_engine(sup.accumulating(config, len(micro_batches)))
    n = sum(counted(l) for _, l in micro_batches) if num_items else None
    losses = []
    for ids, labels in micro_batches:
        loss = engine(ids, labels=labels, num_items_in_batch=n)
        losses.append(float(loss))
        engine.backward(loss)
        engine.step()
    return engine, losses


def test_num_items_in_batch_weighs_by_counted_labels(config, token_file):
    """With num_items_in_batch, the step's loss is Σ n_i loss_i / Σ n_i and its gradient norm that of one
    micro-batch holding all the rows; without it, the loss is the mean of the two means and the norm
    another."""
    probe = sup.new_engine(config)
    (a, la), (b, lb) = two_micro_batches(probe, token_file)
    n = [counted(la), counted(lb)]
    assert n[0] == 3 and n[1] == b.shape[0] * (b.shape[1] - 1)

    tokens, l_tok = accumulate(config, [(a, la), (b, lb)], num_items=True)
    means, l_mean = accumulate(config, [(a, la), (b, lb)], num_items=False)
    big_config = dict(config, train_micro_batch_size_per_gpu=2 * a.shape[0])
    big, l_big = accumulate(big_config, [(np.concatenate([a, b]), np.concatenate([la, lb]))], num_items=False)

    assert l_tok == l_mean  # the forwards' own losses: each micro-batch's mean
    s_tok, s_mean, s_big = tokens.last_step, means.last_step, big.last_step
    assert s_tok.counted == s_mean.counted == s_big.counted == sum(n)
    assert s_tok.loss == pytest.approx((n[0] * l_tok[0] + n[1] * l_tok[1]) / sum(n), rel=1e-12)
    assert s_tok.loss == pytest.approx(l_big[0], rel=1e-6)
    assert s_mean.loss == (l_mean[0] + l_mean[1]) / 2
    assert s_tok.grad_norm == pytest.approx(s_big.grad_norm, rel=1e-5)
    assert abs(s_mean.grad_norm - s_big.grad_norm) > 1e-3 * s_big.grad_norm


def test_num_items_below_the_micro_batchs_count_is_refused(engine, batch):
    """num_items_in_batch must cover the micro-batch's own counted labels (it is the step's total)."""
    n = counted(batch)
    with pytest.raises(strata.ConfigError, match=f"num_items_in_batch is {n - 1}, fewer than the {n} labels"):
        engine(batch, num_items_in_batch=n - 1)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        engine(batch, num_items_in_batch=-1)
    with pytest.raises(ValueError, match="expected an int"):
        engine(batch, num_items_in_batch="12")
    loss = engine(batch, num_items_in_batch=np.int64(n))  # a numpy scalar is taken
    engine.backward(loss)
    engine.step()
    assert engine.last_step.counted == n


def write_mask(token_path, mask):
    """TOKENFILE.mask (model/loss_mask.h): 256 int32 of header (magic, version, count as two uint32
    halves), then one 0/1 byte per token."""
    n = len(mask)
    header = struct.pack("<256i", 20261127, 1, n & 0xFFFFFFFF, n >> 32, *([0] * 252))
    with open(str(token_path) + ".mask", "wb") as f:
        f.write(header + bytes(mask))


@pytest.fixture(scope="module")
def masked_file(corpus, tmp_path_factory):
    """The corpus as a token file with a mask that counts a varying share of each sample's targets
    (token i counts when (i // 7) % 3 != 0, and never in every fifth window of SEQ_LEN)."""
    path = tmp_path_factory.mktemp("masked") / "sft.bin"
    sup.write_llmc_tokens(path, list(corpus))
    mask = [1 if (i // 7) % 3 and (i // sup.SEQ_LEN) % 5 else 0 for i in range(len(corpus))]
    write_mask(path, mask)
    return path, mask


def test_token_loader_batches_carry_the_masks_labels(engine, masked_file, token_file):
    """A batch of a masked file has labels: the tokens, -100 where the mask says so (column k of the
    window of sample s is token s·T + k) and in column 0; engine(batch) uses them."""
    path, mask = masked_file
    loader = engine.token_loader(str(path), shuffle=False)
    for b in range(3):
        batch = next(loader)
        ids, labels = np.array(batch), np.array(batch.labels)
        assert labels.shape == ids.shape
        T = sup.SEQ_LEN
        for r in range(ids.shape[0]):
            s = b * ids.shape[0] + r  # file order
            for k in range(ids.shape[1]):
                want = ids[r, k] if k > 0 and mask[s * T + k] else -100
                assert labels[r, k] == want, (b, r, k)
        assert float(engine.eval_loss(batch)) == float(engine.eval_loss(ids, labels=labels))
        assert float(engine.eval_loss(batch)) != float(engine.eval_loss(ids))
    assert next(engine.token_loader(str(token_file), shuffle=False)).labels is None  # no mask


def test_python_loop_with_num_items_is_strata_trains_on_a_masked_file(config, masked_file, strata_bin,
                                                                       tmp_path_factory):
    """Accumulation 2 over the masked file: the documented loop, passing num_items_in_batch = the step's
    counted labels, gives `strata train`'s losses (strata.loss_weighting "tokens"), rates and gradient
    norms bit for bit."""
    path, _ = masked_file
    cfg = sup.accumulating(config, 2)
    cli = sup.run_cli_train(strata_bin, cfg, path, tmp_path_factory.mktemp("cli-masked"), 4)
    assert "loss mask: " in cli.stdout
    engine = sup.new_engine(cfg)
    loader = engine.token_loader(str(path))
    steps = []
    for _ in range(4):
        batches = [next(loader), next(loader)]
        n = sum(counted(np.array(b.labels)) for b in batches)
        for b in batches:
            loss = engine(b, num_items_in_batch=n)
            engine.backward(loss)
            engine.step()
        s = engine.last_step
        assert s.counted == n
        steps.append(sup.Step(engine.global_samples, s.loss, s.lr, s.grad_norm))
    assert sup.field(steps, "loss") == sup.field(cli.steps, "loss")
    assert sup.field(steps, "lr") == sup.field(cli.steps, "lr")
    assert sup.field(steps, "grad_norm") == sup.field(cli.steps, "grad_norm")

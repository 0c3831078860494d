"""Packed documents from Python (docs/python.md, position_ids; docs/train.md "Packed documents"):
engine(input_ids, labels, position_ids=...) keeps a row's documents apart as transformers' padding-free
packing does, so a document's loss in a packed row is its loss alone; a token_loader batch of a file with
TOKENFILE.docs carries its position_ids and labels; positions that are not documents' are refused."""

import struct

import numpy as np
import pytest

import strata

import strata_support as sup

# Row documents over L = SEQ_LEN + 1 columns.
SPLIT = 11


def packed(batch):
    """position_ids restarting at column SPLIT, and labels -100 at each document's first token."""
    B, L = batch.shape
    pos = np.tile(np.arange(L, dtype=np.int64), (B, 1))
    pos[:, SPLIT:] -= SPLIT
    labels = batch.copy()
    labels[:, 0] = -100
    labels[:, SPLIT] = -100
    return pos, labels


def test_each_documents_loss_in_the_row_is_its_loss_alone(engine, batch):
    pos, labels = packed(batch)
    first, second = labels.copy(), labels.copy()
    first[:, SPLIT:] = -100
    second[:, :SPLIT] = -100
    alone_first = float(engine.eval_loss(batch[:, :SPLIT]))
    alone_second = float(engine.eval_loss(batch[:, SPLIT:]))
    assert float(engine.eval_loss(batch, labels=first, position_ids=pos)) == pytest.approx(alone_first, rel=1e-6)
    assert float(engine.eval_loss(batch, labels=second, position_ids=pos)) == pytest.approx(alone_second,
                                                                                              rel=1e-6)
    # Without position_ids the second document sees the first: another loss.
    assert float(engine.eval_loss(batch, labels=second)) != pytest.approx(alone_second, rel=1e-4)
    # The training forward takes them too (eval_loss first: it would drop a pending forward).
    evaluated = float(engine.eval_loss(batch, labels=labels, position_ids=pos))
    loss = engine(batch, labels=labels, position_ids=pos)
    assert float(loss) == evaluated
    engine.backward(loss)
    engine.step()


def test_positions_that_are_not_documents_are_refused(engine, batch):
    pos, labels = packed(batch)
    pos[1, 5] += 3
    with pytest.raises(strata.ConfigError, match=r"position_ids\[1, 5\]"):
        engine.eval_loss(batch, labels=labels, position_ids=pos)
    with pytest.raises(ValueError, match="position_ids"):
        engine.eval_loss(batch, labels=labels, position_ids=pos[:, :5])


def write_docs(path, count, starts):
    """TOKENFILE.docs (model/packed_docs.h): magic, version, token and document counts, then the starts."""
    header = struct.pack("<6i", 20261204, 1, count, 0, len(starts), 0) + bytes(4 * 250)
    with open(str(path) + ".docs", "wb") as f:
        f.write(header + struct.pack(f"<{len(starts)}Q", *starts))


def test_token_loader_batches_carry_position_ids(engine, corpus, tmp_path):
    path = tmp_path / "packed.bin"
    sup.write_llmc_tokens(path, list(corpus))
    T = sup.SEQ_LEN
    starts = [0, 5, T + 3, 2 * T]  # row 0 splits at 5, row 1 at 3, row 2 starts one
    write_docs(path, len(corpus), starts)
    batch = next(engine.token_loader(str(path), shuffle=False))
    ids, pos, labels = np.array(batch), np.array(batch.position_ids), np.array(batch.labels)
    assert pos.shape == ids.shape == labels.shape
    for r in range(3):
        for k in range(T + 1):
            i = r * T + k  # token i of the file
            before = [s for s in starts if s <= i]
            want = i - max(before[-1], r * T)
            assert pos[r, k] == want, (r, k)
            assert labels[r, k] == (-100 if k == 0 or i in starts else ids[r, k]), (r, k)
    assert float(engine.eval_loss(batch)) == float(engine.eval_loss(ids, labels=labels, position_ids=pos))
    assert float(engine.eval_loss(batch)) != float(engine.eval_loss(ids, labels=labels))

"""engine.token_loader and strata.text_to_tokens (docs/python.md, "Data"): strata train's loader — windows
of seq_len + 1 tokens in the order of Strata's permutation (the DistributedSampler's), micro-batch rows per
batch — and its byte tokenizer."""

import numpy as np
import pytest

import strata
import strata_support as sup


SEED = 1234  # strata.seed of configs/demo_cpu.json


def num_samples(corpus):
    """Samples in a token file of len(corpus) tokens (model/data_loader.h, Note [Samples and sharding])."""
    return (len(corpus) - 1) // sup.SEQ_LEN


def test_a_batch_is_int32_micro_batch_by_seq_len_plus_one(engine, token_file):
    """next(loader) is a strata.Tokens that numpy reads as int32 (4, SEQ_LEN + 1)."""
    tokens = next(engine.token_loader(str(token_file)))
    assert isinstance(tokens, strata.Tokens)
    a = np.asarray(tokens)
    assert a.dtype == np.int32
    assert a.shape == (engine.train_micro_batch_size_per_gpu(), sup.SEQ_LEN + 1)


def test_numpy_reads_tokens_without_a_copy(engine, token_file):
    """numpy.asarray(tokens) is a view of the Tokens' own buffer: two of them share memory."""
    tokens = next(engine.token_loader(str(token_file)))
    assert np.shares_memory(np.asarray(tokens), np.asarray(tokens))


def test_unshuffled_rows_are_the_files_windows_in_order(engine, token_file, corpus):
    """shuffle=False: batch k row i is sample 4k + i, the tokens [s T, s T + T + 1) of the file."""
    loader = engine.token_loader(str(token_file), shuffle=False)
    for k in range(2):
        rows = np.asarray(next(loader)).tolist()
        assert rows == [sup.window(corpus, 4 * k + i) for i in range(4)]


def test_shuffled_rows_follow_the_samplers_permutation(engine, token_file, corpus):
    """shuffle=True: the rows are the windows of DistributedSampler(N, 1, 0, seed=strata.seed)'s order —
    one permutation for the loader and the sampler."""
    order = list(strata.DistributedSampler(num_samples(corpus), num_replicas=1, rank=0, seed=SEED))
    loader = engine.token_loader(str(token_file))
    rows = np.asarray(next(loader)).tolist() + np.asarray(next(loader)).tolist()
    assert rows == [sup.window(corpus, s) for s in order[:8]]


def test_set_epoch_moves_to_that_epochs_permutation(engine, token_file, corpus):
    """loader.set_epoch(1): loader.epoch is 1 and the next batch is the first of the sampler's epoch 1."""
    sampler = strata.DistributedSampler(num_samples(corpus), num_replicas=1, rank=0, seed=SEED)
    sampler.set_epoch(1)
    loader = engine.token_loader(str(token_file))
    next(loader)
    loader.set_epoch(1)
    assert loader.epoch == 1
    assert np.asarray(next(loader)).tolist() == [sup.window(corpus, s) for s in list(sampler)[:4]]


def test_len_is_whole_batches_per_epoch(engine, token_file, corpus):
    """len(loader) == N // micro-batch: strata train's loader yields whole batches only."""
    assert len(engine.token_loader(str(token_file))) == num_samples(corpus) // 4


def test_iterating_a_loader_ends_at_the_epoch(engine, token_file, corpus):
    """`for batch in loader` gives one epoch's batches and stops (the rest of the epoch when it was begun
    with next()); the next loop is the next epoch, the sampler's epoch-1 order."""
    loader = engine.token_loader(str(token_file))
    assert sum(1 for _ in loader) == len(loader) > 0
    assert loader.epoch == 0
    sampler = strata.DistributedSampler(num_samples(corpus), num_replicas=1, rank=0, seed=SEED)
    sampler.set_epoch(1)
    batches = [np.asarray(b).tolist() for b in loader]
    assert len(batches) == len(loader) and loader.epoch == 1
    assert batches[0] == [sup.window(corpus, s) for s in list(sampler)[:4]]
    next(loader)  # epoch 2's first batch
    assert sum(1 for _ in loader) == len(loader) - 1


def test_two_loaders_give_the_same_batches(engine, token_file):
    """The order depends on strata.seed and the epoch only: two loaders agree."""
    a, b = engine.token_loader(str(token_file)), engine.token_loader(str(token_file))
    for _ in range(3):
        assert np.array_equal(np.asarray(next(a)), np.asarray(next(b)))


def test_text_to_tokens_writes_bytes_as_an_llmc_file(tmp_path, corpus):
    """text_to_tokens(text, out) returns the byte count and writes llm.c's uint16 .bin of the bytes."""
    text = tmp_path / "book.txt"
    text.write_bytes(corpus[:5000])
    out = tmp_path / "book.bin"
    assert strata.text_to_tokens(str(text), str(out)) == 5000
    expected = tmp_path / "expected.bin"
    sup.write_llmc_tokens(expected, list(corpus[:5000]))
    assert out.read_bytes() == expected.read_bytes()


def test_text_to_tokens_of_a_missing_file_raises_oserror(tmp_path):
    """A text path that does not exist: strata.IoError (an OSError) naming it."""
    with pytest.raises(OSError) as e:
        strata.text_to_tokens(str(tmp_path / "missing.txt"), str(tmp_path / "out.bin"))
    assert "missing.txt" in str(e.value)


def test_flat_uint16_files_are_read_too(engine, tmp_path, corpus):
    """A headerless file of uint16 tokens gives the windows the llm.c file gives."""
    flat = tmp_path / "flat.bin"
    np.frombuffer(corpus[:4000], dtype=np.uint8).astype("<u2").tofile(flat)
    rows = np.asarray(next(engine.token_loader(str(flat), shuffle=False))).tolist()
    assert rows == [sup.window(corpus, i) for i in range(4)]

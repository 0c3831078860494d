"""strata.DistributedSampler in one process (docs/python.md, "Data"): PyTorch's DistributedSampler
semantics over Strata's permutation — each rank takes positions rank, rank + world, ... of the epoch's
permutation, padded by wrapping or truncated with drop_last."""

import pytest

import strata


def indices(n, world, rank, **kwargs):
    return list(strata.DistributedSampler(n, num_replicas=world, rank=rank, **kwargs))


def interleave(per_rank):
    """The epoch's (padded) permutation back from the ranks' lists: rank r holds positions r, r + w, ..."""
    return [x for group in zip(*per_rank) for x in group]


def test_two_ranks_split_an_even_dataset_exactly():
    """N = 10 over 2 ranks: 5 indices each, disjoint, together range(10)."""
    a, b = indices(10, 2, 0), indices(10, 2, 1)
    assert len(a) == len(b) == 5
    assert sorted(a + b) == list(range(10))


def test_len_is_this_ranks_count():
    """len(sampler) == ceil(N / world), and the iteration yields that many."""
    for n, world in [(10, 2), (11, 2), (7, 3), (1, 1)]:
        s = strata.DistributedSampler(n, num_replicas=world, rank=world - 1)
        assert len(s) == -(-n // world) == len(list(s))


def test_an_odd_dataset_is_padded_by_wrapping():
    """N = 11 over 2 ranks: 6 each; the 12 positions are the permutation of range(11) followed by its
    first element again."""
    per_rank = [indices(11, 2, 0), indices(11, 2, 1)]
    assert [len(x) for x in per_rank] == [6, 6]
    padded = interleave(per_rank)
    assert sorted(padded[:11]) == list(range(11))
    assert padded[11] == padded[0]


def test_drop_last_truncates():
    """N = 11 over 2 ranks with drop_last: 5 each, 10 distinct indices of range(11)."""
    a, b = indices(11, 2, 0, drop_last=True), indices(11, 2, 1, drop_last=True)
    assert len(a) == len(b) == 5
    assert len(strata.DistributedSampler(11, num_replicas=2, rank=0, drop_last=True)) == 5
    assert len(set(a + b)) == 10 and set(a + b) <= set(range(11))


def test_without_shuffle_rank_r_takes_r_r_plus_world_and_so_on():
    """shuffle=False: rank r yields r, r + world, r + 2 world, ..."""
    assert indices(10, 2, 0, shuffle=False) == [0, 2, 4, 6, 8]
    assert indices(10, 2, 1, shuffle=False) == [1, 3, 5, 7, 9]
    assert indices(7, 3, 2, shuffle=False) == [2, 5, 1]  # position 8 wraps to position 8 - 7 = 1


def test_shuffle_permutes():
    """shuffle=True (the default) gives a permutation of range(N) that is not the identity."""
    order = indices(100, 1, 0)
    assert sorted(order) == list(range(100))
    assert order != list(range(100))


def test_set_epoch_changes_the_order():
    """set_epoch(1) gives another order than epoch 0, over the same indices."""
    s = strata.DistributedSampler(100, num_replicas=2, rank=0)
    s.set_epoch(0)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert first != second
    assert len(first) == len(second)


def test_the_same_epoch_gives_the_same_order():
    """Iterating twice, or a second sampler with the same seed and epoch, gives the same order."""
    s = strata.DistributedSampler(100, num_replicas=2, rank=1, seed=7)
    s.set_epoch(3)
    t = strata.DistributedSampler(100, num_replicas=2, rank=1, seed=7)
    t.set_epoch(3)
    assert list(s) == list(s) == list(t)


def test_the_seed_changes_the_order():
    """seed=1 and seed=2 give different orders."""
    assert indices(100, 1, 0, seed=1) != indices(100, 1, 0, seed=2)


def test_every_rank_sees_the_same_permutation():
    """The ranks' lists interleave into one permutation (no index twice for world dividing N)."""
    per_rank = [indices(12, 3, r, seed=5) for r in range(3)]
    assert sorted(interleave(per_rank)) == list(range(12))


def test_a_dataset_with_len_is_its_count():
    """dataset may be anything with len(): a list of 10 gives what the count 10 gives."""
    items = [object()] * 10
    assert list(strata.DistributedSampler(items, num_replicas=2, rank=1, seed=3)) == indices(10, 2, 1, seed=3)


def test_one_process_defaults_to_one_rank():
    """num_replicas and rank default to the launcher's: world 1, rank 0 without mpirun."""
    s = strata.DistributedSampler(10)
    assert len(s) == 10
    assert sorted(s) == list(range(10))


@pytest.mark.parametrize("rank", [2, -1])
def test_a_rank_outside_the_world_raises_valueerror(rank):
    """rank 2 (or -1) of 2 replicas: ValueError naming the rank."""
    with pytest.raises(ValueError) as e:
        list(strata.DistributedSampler(10, num_replicas=2, rank=rank))
    assert "rank" in str(e.value)


def test_a_world_below_one_raises_valueerror():
    """num_replicas=0: ValueError."""
    with pytest.raises(ValueError):
        list(strata.DistributedSampler(10, num_replicas=0, rank=0))


def test_a_negative_epoch_raises_valueerror():
    """set_epoch(-1): ValueError (epochs count from 0)."""
    s = strata.DistributedSampler(10, num_replicas=1, rank=0)
    with pytest.raises(ValueError):
        s.set_epoch(-1)
        list(s)

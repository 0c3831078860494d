"""DistributedSampler's semantics over Strata's permutation, for a user's own data set."""

import operator

from . import _strata
from .distributed import init_distributed


def _is_count(x):
    """An int, or an integer of another library (numpy's)."""
    try:
        operator.index(x)
        return not hasattr(x, "__len__")
    except TypeError:
        return False


class DistributedSampler:
    """Indices of a data set for this rank, as torch.utils.data.DistributedSampler gives them.

    Each epoch the indices 0..N-1 are permuted (shuffle=True) by Strata's counter-based generator keyed on
    (seed, epoch) — the same permutation on every rank and platform, and the one `strata train`'s token
    loader uses, though not torch's. The list is padded by wrapping around to a multiple of the world size
    (or truncated, drop_last=True) and rank r takes positions r, r + world, r + 2 world, ... So every index
    is seen at least once per epoch over the ranks, exactly once when the world size divides N.

        sampler = strata.DistributedSampler(dataset, seed=1234)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for i in sampler: ...
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None or rank is None:
            info = init_distributed()
            num_replicas = info.world_size if num_replicas is None else num_replicas
            rank = info.rank if rank is None else rank
        self.num_samples_total = operator.index(dataset) if _is_count(dataset) else len(dataset)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._indices(0)  # bad arguments fail here (strata.ConfigError, a ValueError)

    def set_epoch(self, epoch: int) -> None:
        """The next iteration walks `epoch`'s permutation (call it at the start of every epoch)."""
        if epoch < 0:
            raise ValueError(f"DistributedSampler.set_epoch({epoch}): epochs count from 0")
        self.epoch = int(epoch)

    def _indices(self, epoch):
        return _strata.rank_samples(self.num_samples_total, self.rank, self.num_replicas, self.seed, epoch,
                                    self.shuffle, self.drop_last)

    def __iter__(self):
        return iter(self._indices(self.epoch))

    def __len__(self) -> int:
        n, w = self.num_samples_total, self.num_replicas
        return n // w if self.drop_last else (n + w - 1) // w

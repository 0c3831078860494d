"""Ranks from the MPI launcher: `mpirun -np N python train.py` or `strata launch`."""

from dataclasses import dataclass

from . import _strata


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands among the ranks of the job."""

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    launched: bool  # started by an MPI launcher

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """DeepSpeed's init_distributed: reads the launcher's environment (Open MPI's or MPICH's variables) and
    makes log lines carry the rank, with ranks other than 0 logging warnings and errors only. The ranks'
    communicator itself is opened by initialize() (MPI, or NCCL on the cuda backend), on every rank.
    Calling it is optional: initialize() reads the same environment."""
    ri = _strata.rank_from_env()
    if ri.world_size > 1:
        _strata.set_log_rank(ri.rank)
    return DistInfo(ri.rank, ri.world_size, ri.local_rank, ri.local_size, ri.launched)

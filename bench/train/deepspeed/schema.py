#!/usr/bin/env python3
"""Loads configs under DeepSpeed's own schema: DeepSpeedZeroConfig(**zero_optimization) and the whole file as
deepspeed.runtime.config.DeepSpeedConfig, as `deepspeed.initialize` does before training (issue 44: the
stock configs/*.json and what `strata config new` writes must be valid DeepSpeed configs too).

  build-deepspeed/venv/bin/python bench/train/deepspeed/schema.py configs/*.json out.json

Needs bench/train/deepspeed/setup.sh's virtual environment (DeepSpeed from PyPI); optional, as every bench
script. Prints one line a file and exits 1 if any is refused. A file for several GPUs (train_batch_size =
micro-batch x accumulation x N) is checked as rank 0 of N sees it: DeepSpeedConfig takes the world size from
torch.distributed, which is not started here, so the script answers for it.
"""
import json
import sys


def world_size(cfg):
    """The number of ranks the file's batch sizes imply (1 where it does not say)."""
    try:
        per_rank = int(cfg["train_micro_batch_size_per_gpu"]) * int(cfg.get("gradient_accumulation_steps", 1))
        total = int(cfg["train_batch_size"])
    except (KeyError, TypeError, ValueError):
        return 1
    return total // per_rank if per_rank > 0 and total % per_rank == 0 and total >= per_rank else 1


def main(paths):
    import deepspeed.runtime.config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    refused = 0
    for path in paths:
        with open(path) as f:
            cfg = json.load(f)
        try:
            DeepSpeedZeroConfig(**cfg.get("zero_optimization", {}))
            # DeepSpeedConfig checks the batch sizes against the world size; a file without
            # train_batch_size gets it from micro-batch x accumulation at one rank.
            world = world_size(cfg)
            ds_config.dist.get_rank = lambda *a, **k: 0
            ds_config.dist.get_world_size = lambda *a, **k: world
            DeepSpeedConfig(cfg)
            print(f"{path}: accepted" + (f" (as rank 0 of {world})" if world > 1 else ""))
        except Exception as e:  # the schema's message is the point
            refused += 1
            print(f"{path}: refused: {str(e).splitlines()[0][:300]}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

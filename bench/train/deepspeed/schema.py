#!/usr/bin/env python3
"""Loads configs under DeepSpeed's own schema: DeepSpeedZeroConfig(**zero_optimization) and the whole file as
deepspeed.runtime.config.DeepSpeedConfig, as `deepspeed.initialize` does before training (issue 44: the
stock configs/*.json and what `strata config new` writes must be valid DeepSpeed configs too).

  build-deepspeed/venv/bin/python bench/train/deepspeed/schema.py configs/*.json out.json

Needs bench/train/deepspeed/setup.sh's virtual environment (DeepSpeed from PyPI); optional, as every bench
script. Prints one line a file and exits 1 if any is refused.
"""
import json
import sys


def main(paths):
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
            DeepSpeedConfig(cfg)
            print(f"{path}: accepted")
        except Exception as e:  # the schema's message is the point
            refused += 1
            print(f"{path}: refused: {str(e).splitlines()[0][:300]}")
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

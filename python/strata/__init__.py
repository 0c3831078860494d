"""Strata from Python: DeepSpeed's training-loop shape over Strata's ZeRO-3 offload engine.

    engine, optimizer, _, lr_scheduler = strata.initialize(config="ds_config.json", model="10m")
    for batch in engine.token_loader("train.bin"):
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

The engine and model are Strata's C++ runtime (the extension module strata._strata); this package gives
them DeepSpeed's calls. docs/python.md has the whole API beside DeepSpeed's.
"""

from ._strata import (  # noqa: F401  (re-exported)
    ConfigError,
    IoError,
    ModelConfig,
    OutOfMemoryError,
    StrataError,
    TokenLoader,
    Tokens,
    text_to_tokens,
)
from .distributed import DistInfo, init_distributed  # noqa: F401
from .engine import Engine, Loss, LRSchedulerView, OptimizerView, StepInfo, initialize  # noqa: F401
from .sampler import DistributedSampler  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "initialize",
    "init_distributed",
    "Engine",
    "Loss",
    "StepInfo",
    "OptimizerView",
    "LRSchedulerView",
    "DistInfo",
    "DistributedSampler",
    "ModelConfig",
    "TokenLoader",
    "Tokens",
    "text_to_tokens",
    "StrataError",
    "ConfigError",
    "OutOfMemoryError",
    "IoError",
]

"""Fixtures for the tests of the `strata` Python package (docs/python.md is the contract they check).

Run from the repository root (CTest does):
  PYTHONPATH=build/python STRATA_BIN=build/tools/strata STRATA_SOURCE_DIR=. python3 -m pytest -q tests/python
"""

import os
import pathlib

import pytest

import strata  # noqa: F401  (a missing or broken package fails the collection, never skips)
import strata_support as sup


@pytest.fixture(scope="session")
def strata_bin():
    """The `strata` CLI (env STRATA_BIN, else build/tools/strata of the source tree)."""
    path = pathlib.Path(os.environ.get("STRATA_BIN", sup.SOURCE_DIR / "build" / "tools" / "strata")).resolve()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"the strata CLI is not built at {path} (set STRATA_BIN)")
    return path


@pytest.fixture(scope="session")
def corpus():
    """Byte tokens of the repository's own Markdown (README.md, then docs/*.md by name)."""
    paths = [sup.SOURCE_DIR / "README.md", *sorted((sup.SOURCE_DIR / "docs").glob("*.md"))]
    return b"".join(p.read_bytes() for p in paths)


@pytest.fixture(scope="session")
def token_file(corpus, tmp_path_factory):
    """`corpus` as an llm.c .bin token file (uint16 tokens after the 256-int32 header)."""
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    sup.write_llmc_tokens(path, list(corpus))
    return path


@pytest.fixture
def config():
    """configs/demo_cpu.json as a dict: micro-batch 4, accumulation 1, 64 MiB host device, seed 1234."""
    return sup.demo_config()


@pytest.fixture
def engine(config):
    """A fresh tiny engine over the demo config."""
    return sup.new_engine(config)


@pytest.fixture
def batch(engine, token_file):
    """The first batch of the engine's token loader, as a (B, SEQ_LEN + 1) int32 numpy array."""
    import numpy as np  # required: scripts/install-deps.sh installs python3-numpy
    return np.array(next(engine.token_loader(str(token_file))))

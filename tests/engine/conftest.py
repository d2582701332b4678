"""Session fixtures for the engine tests."""

from __future__ import annotations

import pytest
import torch
from hf_checkpoints import HF_CLASSES, make_checkpoint

# The test models are tiny: one thread is as fast, and immune to a busy second core (with two
# threads, a CI neighbour on one core made these tests 5x slower).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """kind -> (directory, HF model), built once per test session."""
    out = {}
    for kind in HF_CLASSES:
        d = tmp_path_factory.mktemp(kind)
        out[kind] = (d, make_checkpoint(d, kind))
    return out

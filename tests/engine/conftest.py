"""Session fixtures for the engine tests."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # before anything imports triton (transformers may): Triton wraps its own library's jit
    # functions (tl.zeros, tl.max, ...) when it is imported, interpreted only if this is set then.
    # The kernel tests (test_triton_*.py) then run in Triton's interpreter on CPU tensors.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hf_checkpoints import HF_CLASSES, make_checkpoint  # noqa: E402

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

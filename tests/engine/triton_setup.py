"""Triton for the kernel tests: compiled on a CUDA device, else Triton's interpreter on CPU tensors.

TRITON_INTERPRET must be set before triton is imported at all: `triton.jit` reads it when it wraps
a function, and triton.language's own (tl.zeros, tl.max, ...) are wrapped at its import; a
kernel interpreted around compiled library functions fails. tests/conftest.py sets it before
any test module is collected; a test module also calls `device()` before importing splitserve's
Triton modules (for a run without that conftest). On a CUDA machine the interpreter stays off and
the same tests run the compiled kernels on the GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

WHY = ("triton is not installed: the Triton kernels (engine/triton_*.py) are not tested here "
       "(pip install triton; on CPU the tests run them in Triton's interpreter)")


def device() -> torch.device:
    """The device the kernel tests run on; skips the module when triton does not import."""
    if torch.cuda.is_available():
        dev = torch.device("cuda")
    else:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ["TRITON_INTERPRET"] != "1":
            pytest.skip("TRITON_INTERPRET is set to another value than 1 and there is no CUDA device",
                        allow_module_level=True)
        dev = torch.device("cpu")
    pytest.importorskip("triton", reason=WHY)
    return dev

"""The device and dtype an engine runs on, from what the user asked for."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

from ..errors import UserError
from .config import ModelConfig

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64}
CPU_KV_BYTES = 1 << 30  # default KV cache size on CPU


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, cfg: ModelConfig | None = None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        return DTYPES.get(cfg.torch_dtype or "", torch.bfloat16) if cfg else torch.bfloat16
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use float32, bfloat16, float16 or auto")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device cuda requested but no CUDA device is available")
    return dev


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make this process keep the memory it frees (glibc only; False elsewhere). By default glibc
    gives a freed block of over 128 KiB-32 MiB back to the kernel, so every CPU step's activations
    fault their pages in again, a large share of a prefill's time. With mmap off and no trimming,
    the heap grows to the largest step once and stays."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc (musl has no mallopt)
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))

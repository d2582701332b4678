"""Which kernels a model's layers run (EngineConfig.kernels, docs/architecture.md, engine/).

* `torch`: model.py's torch ops and attention.py's SDPA over gathered blocks: the reference, on
  every device;
* `triton`: triton_fused.py's fused elementwise kernels (RMSNorm with the residual, rotary in
  place, SiLU-and-multiply, the KV write) and triton_attention.py's paged decode kernel; CUDA, or
  CPU tensors under Triton's interpreter (TRITON_INTERPRET=1: tests only, slow);
* `auto`: triton on CUDA when `import triton` works, torch otherwise (always torch on the CPU).

A fresh prompt's attention stays torch's SDPA either way (FlashAttention on CUDA: causal, no
mask); with triton, the segments after cached context (chunked prefill, a prefix-cache hit) go to
triton_attention.prefill_attention, all in one launch, where SDPA needs a mask (attention.py).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import UserError

if TYPE_CHECKING:  # importing this module imports no torch (serve's config checks KERNEL_CHOICES)
    import torch

logger = logging.getLogger(__name__)

KERNEL_CHOICES = ("auto", "torch", "triton")


@dataclass(frozen=True)
class Kernels:
    """The ops a layer calls in place of torch's (triton_fused.py, triton_attention.py)."""

    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (x, weight, eps, residual) -> (norm, sum)
    rotary_: Callable[..., None]          # (qkv, positions, cos, sin, heads, head_dim), in place
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    write_kv: Callable[..., None]         # attention.write_kv's contract
    decode_attention: Callable[..., torch.Tensor]  # attention.decode_attention's contract
    cached_prefill: Callable[..., None]   # prefill segments after cached context, packed in one call


def triton_kernels() -> Kernels:
    """The Triton set (imports triton: ImportError where it is missing)."""
    from . import triton_attention, triton_fused

    return Kernels(rms_norm=triton_fused.rms_norm, rotary_=triton_fused.rotary_, silu_mul=triton_fused.silu_mul,
                   write_kv=triton_fused.write_kv, decode_attention=triton_attention.decode_attention,
                   cached_prefill=triton_attention.prefill_attention)


def interpreting() -> bool:
    """Triton's interpreter is on (TRITON_INTERPRET=1): its kernels run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def select_kernels(choice: str, device: torch.device) -> Kernels | None:
    """The Triton kernels, or None for torch's ops, as `choice` (KERNEL_CHOICES) asks on `device`."""
    if choice not in KERNEL_CHOICES:
        raise UserError(f"unknown kernels {choice!r}; use {', '.join(KERNEL_CHOICES)}")
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return None
    if choice == "triton" and device.type != "cuda" and not interpreting():
        raise UserError("kernels 'triton' need a CUDA device (or TRITON_INTERPRET=1, for tests)")
    try:
        kernels = triton_kernels()
    except ImportError as e:
        if choice == "triton":
            raise UserError(f"kernels 'triton' asked for, but triton does not import: {e}") from e
        logger.info("triton does not import (%s): the torch kernels run", e)
        return None
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)  # Triton launches on the current device, whatever its tensors' device
    return kernels

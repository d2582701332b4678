"""An engine's options, as one typed value: where it runs, its KV cache, its batching and
sampling seeds (LLMEngine(model, EngineConfig(...)))."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..policy.machine import BatchingConfig

if TYPE_CHECKING:  # importing this module imports no torch
    import torch

    from .tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineConfig:
    """device: cpu, cuda[:N] or auto. dtype: float32, bfloat16, float16 or auto (float32 on CPU;
    the checkpoint's dtype, else bfloat16, on CUDA). seed: the sampler's generator (requests
    without their own seed); weight_seed: a preset's random weights.

    KV cache: `num_blocks` blocks of `block_size` tokens, or as many as `kv_cache_bytes` hold
    (default: 1 GiB on CPU, 90% of free memory less 4 GiB on CUDA), never more than
    `max_num_seqs` full-length sequences need. max_model_len: context limit (default: the
    model's). batching: the machine-level policy (scheduler.py: prompt token cap, chunked
    prefill, preemption limit, KV allocation), with at most `max_num_seqs` sequences holding KV
    (its `max_seqs`, if that is 0). cuda_graphs: replay decode steps from CUDA graphs (CUDA
    only). tokenizer: a Tokenizer, None, or "auto" (the checkpoint's tokenizer.json; the
    byte-level one for `tiny`). tp: tensor parallel size (rank r on cuda:(N + r) for device
    cuda:N; all on the CPU else). prefix_caching: a prompt shares the cached K/V of its longest
    prefix computed before, in whole blocks, and computes only the rest (policy/prefix_cache.py).
    kernels: the layers' kernels (kernels.py): torch (the default: the path measured on GPUs),
    triton, or auto (triton on CUDA when it imports, torch otherwise)."""

    device: str | torch.device = "cpu"
    dtype: str | torch.dtype = "auto"
    seed: int = 0
    weight_seed: int = 0
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 256
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    cuda_graphs: bool = False
    tokenizer: Tokenizer | str | None = "auto"
    tp: int = 1
    prefix_caching: bool = True
    kernels: str = "torch"   # triton: not yet run on a GPU (README)

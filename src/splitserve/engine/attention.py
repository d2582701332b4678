"""Attention over a paged KV cache, through PyTorch SDPA (CPU and CUDA).

A step's tokens are flattened into one (T, heads, head_dim) batch: first `num_decode` sequences
with one query token each, then prefill segments (a whole prompt or one chunk of it). Every new
token's K/V is written into the cache at its slot (block * block_size + offset). Then

* decode tokens attend in one batched SDPA call: each sequence's blocks are gathered through the
  block table (padded with the cache's null block) and a length mask hides the padding. This path
  has no host synchronisation, so it can be captured in a CUDA graph;
* a prefill segment that starts at position 0 attends to its own fresh K/V with a causal SDPA
  (FlashAttention on CUDA); a later chunk gathers its sequence's earlier K/V from the cache.

On CUDA, SDPA may not pick its cuDNN backend: cuDNN builds a graph for every new shape, and every
prompt length is a new shape. A fresh prompt (causal, no mask) runs at the flash backend. A
segment after cached context needs a mask, which the flash backend does not take (SDPA falls back
to the memory-efficient or the math backend); with the Triton kernels (kernels.py) such segments
go instead to `cached_prefill`, all of a step's in one launch, read from the cache like decodes.

`reference_attention` is the plain contiguous softmax(QK^T)V the tests compare against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # no cuDNN


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, **kw)
    with sdpa_kernel(_CUDA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **kw)


@dataclass
class PrefillSegment:
    q_start: int  # first row of this segment in the flattened batch
    q_len: int
    ctx_len: int  # positions 0..ctx_len-1 are attended (ctx_len - q_len were cached before)
    blocks: torch.Tensor | None  # block ids on device, needed when ctx_len > q_len


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,) int64: cache slot of each new token
    num_decode: int = 0
    decode_block_tables: torch.Tensor | None = None  # (num_decode, max_blocks) int64
    decode_context_lens: torch.Tensor | None = None  # (num_decode,) int64, incl. the new token
    prefills: list[PrefillSegment] = field(default_factory=list)

    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The decodes' block tables and context lengths (set whenever `num_decode` > 0)."""
        if self.decode_block_tables is None or self.decode_context_lens is None:
            raise ValueError(f"{self.num_decode} decodes without their block tables and context lengths")
        return self.decode_block_tables, self.decode_context_lens


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new K/V rows (T, kv_heads, head_dim) at their slots of (blocks, bs, kv_heads, hd)."""
    kvh, hd = k.shape[-2:]
    k_cache.view(-1, kvh, hd)[slot_mapping] = k
    v_cache.view(-1, kvh, hd)[slot_mapping] = v


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """(..., n_blocks) block ids -> (..., n_blocks * block_size, kv_heads, head_dim)."""
    g = cache[blocks]
    return g.reshape(*blocks.shape[:-1], -1, *cache.shape[-2:])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     window: int | None = None) -> torch.Tensor:
    """One query per sequence. q: (B, heads, hd) -> (B, heads, hd)."""
    b, nh, hd = q.shape
    kvh = k_cache.shape[-2]
    k = gather_blocks(k_cache, block_tables).transpose(1, 2)  # (B, kvh, S, hd)
    v = gather_blocks(v_cache, block_tables).transpose(1, 2)
    pos = torch.arange(k.shape[2], device=q.device)
    mask = pos[None, :] < context_lens[:, None]
    if window is not None:
        mask &= pos[None, :] > context_lens[:, None] - 1 - window
    # The query heads sharing one KV head become that head's "query rows": no K/V expansion.
    qg = q.reshape(b, kvh, nh // kvh, hd)
    out = _sdpa(qg, k, v, attn_mask=mask[:, None, None, :], scale=scale)
    return out.reshape(b, nh, hd)


def _causal_mask(q_len: int, ctx_len: int, window: int | None, device) -> torch.Tensor:
    qpos = torch.arange(ctx_len - q_len, ctx_len, device=device)[:, None]
    kpos = torch.arange(ctx_len, device=device)[None, :]
    mask = kpos <= qpos
    if window is not None:
        mask &= kpos > qpos - window
    return mask


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, seg: PrefillSegment, scale: float,
                      window: int | None = None) -> torch.Tensor:
    """One prefill segment. q/k/v: the segment's fresh rows (L, heads|kv_heads, hd)."""
    qt = q.transpose(0, 1).unsqueeze(0)  # (1, heads, L, hd)
    if seg.ctx_len == seg.q_len:
        kt, vt = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
    else:
        if seg.blocks is None:
            raise ValueError(f"a prefill segment of {seg.q_len} tokens at {seg.ctx_len} needs its cached blocks")
        kt = gather_blocks(k_cache, seg.blocks)[: seg.ctx_len].transpose(0, 1).unsqueeze(0)
        vt = gather_blocks(v_cache, seg.blocks)[: seg.ctx_len].transpose(0, 1).unsqueeze(0)
    if seg.ctx_len == seg.q_len and (window is None or seg.ctx_len <= window):
        out = _sdpa(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = _causal_mask(seg.q_len, seg.ctx_len, window, q.device)
        out = _sdpa(qt, kt, vt, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                    window: int | None = None, write: Callable[..., None] = write_kv,
                    decode: Callable[..., torch.Tensor] = decode_attention,
                    cached_prefill: Callable[..., None] | None = None) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend. q: (T, heads, hd) -> (T, heads, hd).
    `write` and `decode`: the KV write and the decode attention (default this module's; the
    Triton kernels of kernels.py have the same contracts). `cached_prefill` (Triton's
    triton_attention.prefill_attention), when given, takes every segment after cached context
    in one call (SDPA would need a mask there, which keeps it off the flash backend)."""
    write(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decode
    if not meta.prefills:
        return decode(q, k_cache, v_cache, *meta.decode_tables(), scale, window)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if nd:
        out[:nd] = decode(q[:nd], k_cache, v_cache, *meta.decode_tables(), scale, window)
    packed = []
    for seg in meta.prefills:
        if cached_prefill is not None and seg.ctx_len > seg.q_len and seg.blocks is not None:
            packed.append((seg.q_start, seg.q_len, seg.ctx_len, seg.blocks))
            continue
        rows = slice(seg.q_start, seg.q_start + seg.q_len)
        out[rows] = prefill_attention(q[rows], k[rows], v[rows], k_cache, v_cache, seg, scale, window)
    if packed and cached_prefill is not None:
        cached_prefill(q, k_cache, v_cache, out, packed, scale, window)
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        window: int | None = None) -> torch.Tensor:
    """Contiguous causal attention of a whole sequence, spelled out. q (T, heads, hd),
    k/v (T, kv_heads, hd) -> (T, heads, hd). For tests."""
    t, nh, _ = q.shape
    rep = nh // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) * scale
    mask = _causal_mask(t, t, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).to(q.dtype)

"""Decode attention over the paged KV cache as a Triton kernel (docs/architecture.md, engine/).

The same contract as attention.py's `decode_attention` (one query token per sequence, the cache
(blocks + 1, block_size, kv_heads, head_dim), block tables padded with the null block, context
lengths counting the new token, an optional sliding window), without the gather: each program
reads its sequence's K/V rows through the block table, slot by slot.

Flash-decoding: the context is cut into `splits` equal ranges; program (sequence, KV head, split)
keeps a running max, sum and weighted V for the query heads that share its KV head (grouped-query
attention: one K/V read for the whole group, the group padded to 16 rows for `tl.dot`), then a
second kernel combines the splits' partial softmaxes. The split count is chosen from the batch
and the block table's width alone (host-known values: no device sync, so a CUDA graph captures
it; each graph bucket has its own width).

Runs on CUDA, and on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1, set before
triton is imported), which is how the tests compare it with `reference_attention`. Every load is
converted to float32 (or fed to `tl.dot` in the cache's own 16-bit type) and every store is
converted back. The interpreter has no bfloat16 arithmetic (numpy lacks the type: a bf16 `tl.dot`
there returns garbage), so on CPU tensors (EMULATE) a 16-bit dot's operands are rounded to the
cache's type and multiplied in float32: the same products, accumulated in float32, as the tensor
cores' bf16 dot on the GPU (up to summation order).
"""

from __future__ import annotations

import torch
import triton  # type: ignore[import-untyped,unused-ignore]
import triton.language as tl  # type: ignore[import-untyped,unused-ignore]

from .triton_fused import emulate, narrow

BLOCK_N = 64        # context positions per inner iteration
MIN_ROWS = 16       # tl.dot's smallest tile: a KV head's query group is padded to it
TARGET_PROGRAMS = 512  # about 4 programs per SM on an H100 (132 SMs): splits until a step has this many


@triton.jit
def _dot(a, b, LOW: tl.constexpr, EMULATE: tl.constexpr):
    """a @ b accumulated in float32: 16-bit operands on the tensor cores (LOW), float32 ones exactly
    ("ieee", not TF32); in the interpreter (EMULATE) 16-bit operands widened first."""
    if LOW and not EMULATE:
        out = tl.dot(a, b)
    else:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return out


@triton.jit
def _split_kernel(Q, K, V, T, L, OP, MLP, scale, window,
                  sq_b, sq_h, sk_s, sk_h, st_b, so_b, so_h, so_s, sm_b, sm_h,
                  split_len,
                  BS: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, HD: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  LOW: tl.constexpr, EMULATE: tl.constexpr):
    b = tl.program_id(0)
    kh = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(L + b).to(tl.int32)
    lo = s * split_len
    hi = tl.minimum(lo + split_len, ctx)
    if HAS_WINDOW:
        lo = tl.maximum(lo, ctx - window)  # positions > ctx - 1 - window
    rows = tl.arange(0, ROWS)
    heads = kh * GROUP + rows
    hmask = rows < GROUP
    d = tl.arange(0, BLOCK_D)
    dmask = d < HD
    q = tl.load(Q + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=hmask[:, None] & dmask[None, :], other=0.0)
    if LOW:
        q = q.to(K.dtype.element_ty)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        pmask = pos < hi
        blk = tl.load(T + b * st_b + pos // BS, mask=pmask, other=0)
        slot = blk.to(tl.int64) * BS + pos % BS
        kv_off = slot[:, None] * sk_s + kh * sk_h + d[None, :]
        kvmask = pmask[:, None] & dmask[None, :]
        k = tl.load(K + kv_off, mask=kvmask, other=0.0)
        v = tl.load(V + kv_off, mask=kvmask, other=0.0)
        qk = _dot(q, tl.trans(k), LOW, EMULATE)
        qk = tl.where(pmask[None, :], qk * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if LOW:
            p = narrow(p, V.dtype.element_ty, EMULATE)  # flash attention's rounding of P
        acc = acc * alpha[:, None] + _dot(p, v, LOW, EMULATE)
        m_i = m_new
    o_off = b * so_b + heads[:, None] * so_h + s * so_s + d[None, :]
    tl.store(OP + o_off, acc, mask=hmask[:, None] & dmask[None, :])
    m_off = b * sm_b + heads * sm_h + s * 2
    tl.store(MLP + m_off, m_i, mask=hmask)
    tl.store(MLP + m_off + 1, l_i, mask=hmask)


@triton.jit
def _reduce_kernel(OP, MLP, O, splits, so_b, so_h, so_s, sm_b, sm_h, sq_b, sq_h,
                   HD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, EMULATE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < splits
    d = tl.arange(0, BLOCK_D)
    dmask = d < HD
    m = tl.load(MLP + b * sm_b + h * sm_h + s * 2, mask=smask, other=float("-inf"))
    ls = tl.load(MLP + b * sm_b + h * sm_h + s * 2 + 1, mask=smask, other=0.0)
    top = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)  # an empty split weighs nothing
    parts = tl.load(OP + b * so_b + h * so_h + s[:, None] * so_s + d[None, :],
                    mask=smask[:, None] & dmask[None, :], other=0.0)
    out = tl.sum(parts * w[:, None], 0) / tl.sum(ls * w, 0)
    tl.store(O + b * sq_b + h * sq_h + d, narrow(out, O.dtype.element_ty, EMULATE), mask=dmask)


def num_splits(batch: int, kv_heads: int, max_positions: int, target: int = TARGET_PROGRAMS) -> int:
    """Splits of the context for a step of `batch` sequences whose block tables cover
    `max_positions` positions: enough programs to fill the GPU, each split at least one
    BLOCK_N-position iteration. A function of host-known sizes only (CUDA graphs)."""
    most = max(1, -(-max_positions // BLOCK_N))
    want = -(-target // max(1, batch * kv_heads))
    return max(1, min(most, want))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                     window: int | None = None, splits: int | None = None) -> torch.Tensor:
    """attention.decode_attention's contract, read through the block table by Triton.
    q (B, heads, hd); caches (blocks + 1, block_size, kv_heads, hd) -> (B, heads, hd).
    `splits`: the context's split count (default: `num_splits`)."""
    b, nh, hd = q.shape
    _, bs, kvh, _ = k_cache.shape
    if nh % kvh:
        raise ValueError(f"{nh} query heads are not a multiple of {kvh} KV heads")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(-1) == 1):
        raise ValueError("the Triton decode kernel reads a contiguous KV cache and unit-stride queries")
    group = nh // kvh
    positions = block_tables.shape[1] * bs
    splits = splits or num_splits(b, kvh, positions)
    split_len = -(-positions // splits)
    split_len = -(-split_len // BLOCK_N) * BLOCK_N
    block_d = max(16, triton.next_power_of_2(hd))
    partial = torch.empty(b, nh, splits, hd, dtype=torch.float32, device=q.device)
    ml = torch.empty(b, nh, splits, 2, dtype=torch.float32, device=q.device)
    out = torch.empty(b, nh, hd, dtype=q.dtype, device=q.device)
    low = k_cache.dtype in (torch.bfloat16, torch.float16)
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    _split_kernel[(b, kvh, splits)](
        q, k_cache, v_cache, tables, context_lens, partial, ml, scale, window or 0,
        q.stride(0), q.stride(1), kvh * hd, hd, tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2), ml.stride(0), ml.stride(1),
        split_len,
        BS=bs, GROUP=group, ROWS=max(MIN_ROWS, triton.next_power_of_2(group)), HD=hd, BLOCK_D=block_d,
        BLOCK=BLOCK_N, HAS_WINDOW=window is not None, LOW=low, EMULATE=emulate(q))
    _reduce_kernel[(b, nh)](
        partial, ml, out, splits, partial.stride(0), partial.stride(1), partial.stride(2),
        ml.stride(0), ml.stride(1), out.stride(0), out.stride(1),
        HD=hd, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(splits)), EMULATE=emulate(q))
    return out


@triton.jit
def _prefill_kernel(Q, K, V, O, TILES, SEGS, T, scale, window,
                    sq_t, sq_h, so_t, so_h, sk_s, sk_h, st_s,
                    BS: tl.constexpr, GROUP: tl.constexpr, HD: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK: tl.constexpr, HAS_WINDOW: tl.constexpr,
                    LOW: tl.constexpr, EMULATE: tl.constexpr):
    seg = tl.load(TILES + tl.program_id(0) * 2)
    m0 = tl.load(TILES + tl.program_id(0) * 2 + 1)
    h = tl.program_id(1)
    kh = h // GROUP
    q0 = tl.load(SEGS + seg * 3)
    qlen = tl.load(SEGS + seg * 3 + 1)
    ctx = tl.load(SEGS + seg * 3 + 2)
    m = m0 + tl.arange(0, BLOCK_M)
    mmask = m < qlen
    qpos = ctx - qlen + m  # each query row's position in its sequence
    d = tl.arange(0, BLOCK_D)
    dmask = d < HD
    rows = (q0 + m).to(tl.int64)
    q = tl.load(Q + rows[:, None] * sq_t + h * sq_h + d[None, :], mask=mmask[:, None] & dmask[None, :], other=0.0)
    if LOW:
        q = q.to(K.dtype.element_ty)
    hi = tl.minimum(ctx, ctx - qlen + m0 + BLOCK_M)  # the tile's last row sees up to its own position
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(0, ctx - qlen + m0 - window + 1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK):
        pos = start + tl.arange(0, BLOCK)
        pmask = pos < hi
        blk = tl.load(T + seg * st_s + pos // BS, mask=pmask, other=0)
        kv_off = (blk.to(tl.int64) * BS + pos % BS)[:, None] * sk_s + kh * sk_h + d[None, :]
        k = tl.load(K + kv_off, mask=pmask[:, None] & dmask[None, :], other=0.0)
        v = tl.load(V + kv_off, mask=pmask[:, None] & dmask[None, :], other=0.0)
        seen = pmask[None, :] & (pos[None, :] <= qpos[:, None])
        if HAS_WINDOW:
            seen = seen & (pos[None, :] > qpos[:, None] - window)
        qk = tl.where(seen, _dot(q, tl.trans(k), LOW, EMULATE) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # a row that has seen nothing yet
        p = tl.exp(qk - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if LOW:
            p = narrow(p, V.dtype.element_ty, EMULATE)
        acc = acc * alpha[:, None] + _dot(p, v, LOW, EMULATE)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + rows[:, None] * so_t + h * so_h + d[None, :], narrow(out, O.dtype.element_ty, EMULATE),
             mask=mmask[:, None] & dmask[None, :])


PREFILL_ROWS = 32  # query rows of one prefill program


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                      segments: list[tuple[int, int, int, torch.Tensor]], scale: float,
                      window: int | None = None, block_m: int = PREFILL_ROWS) -> None:
    """Causal attention of prefill segments, every one in one launch, K/V read from the cache
    through each segment's block table (this step's K/V already written there). segments:
    (first row, rows, context length, block ids) each; their rows of `out` are written.
    q/out (T, heads, hd); caches as `decode_attention`'s. One compiled kernel for every length."""
    if not segments:
        return
    _, nh, hd = q.shape
    _, bs, kvh, _ = k_cache.shape
    width = max(len(t) for _, _, _, t in segments)
    dev = q.device
    tables = torch.full((len(segments), width), k_cache.shape[0] - 1, dtype=torch.long, device=dev)
    for i, (_, _, _, t) in enumerate(segments):
        tables[i, : len(t)] = t
    segs = torch.tensor([(q0, n, ctx) for q0, n, ctx, _ in segments], dtype=torch.int32, device=dev)
    tiles = torch.tensor([(i, m) for i, (_, n, _, _) in enumerate(segments) for m in range(0, n, block_m)],
                         dtype=torch.int32, device=dev)
    _prefill_kernel[(tiles.shape[0], nh)](
        q, k_cache, v_cache, out, tiles, segs, tables, scale, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), kvh * hd, hd, tables.stride(0),
        BS=bs, GROUP=nh // kvh, HD=hd, BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_M=block_m,
        BLOCK=BLOCK_N, HAS_WINDOW=window is not None, LOW=k_cache.dtype in (torch.bfloat16, torch.float16),
        EMULATE=emulate(q))

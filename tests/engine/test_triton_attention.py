"""The Triton paged decode kernel (engine/triton_attention.py) against the reference attention and
the torch paged path: random scattered block tables, contexts of 1 to 240 tokens (not multiples of
the block size), GQA ratios 1 to 8, 1 to 16 sequences, split and unsplit, with and without a
sliding window, float32 and bfloat16. On CPU the kernel runs in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
from triton_setup import device

DEV = device()  # before triton is imported

import triton  # noqa: E402

from splitserve.engine.attention import decode_attention, reference_attention  # noqa: E402
from splitserve.engine.triton_attention import BLOCK_N, decode_attention as triton_decode, num_splits  # noqa: E402

TOL = {torch.float32: dict(rtol=0, atol=2e-6),
       torch.bfloat16: dict(rtol=2 ** -8, atol=2 ** -7)}  # about one bf16 step at the outputs' magnitudes


def make_batch(gen: torch.Generator, lens: list[int], heads: int, kv_heads: int, hd: int, bs: int,
               dtype: torch.dtype, spare: int = 3):
    """q (B, heads, hd), caches with random contents, and block tables over scattered,
    distinct blocks, padded with the null block to a common width."""
    nb = [-(-n // bs) for n in lens]
    total = sum(nb) + spare
    k_cache = torch.randn(total + 1, bs, kv_heads, hd, generator=gen).to(dtype)
    v_cache = torch.randn(total + 1, bs, kv_heads, hd, generator=gen).to(dtype)
    perm = torch.randperm(total, generator=gen).tolist()
    width = max(nb) + 1
    tables, used = [], 0
    for n in nb:
        tables.append(perm[used:used + n] + [total] * (width - n))
        used += n
    q = torch.randn(len(lens), heads, hd, generator=gen).to(dtype)
    to = dict(device=DEV)
    return (q.to(**to), k_cache.to(**to), v_cache.to(**to), torch.tensor(tables, **to),
            torch.tensor(lens, **to))


CASES = [  # (sequences, heads, kv heads, head_dim, block size)
    (1, 4, 4, 32, 16),
    (5, 8, 2, 64, 16),
    (16, 8, 1, 16, 8),
    (3, 32, 8, 128, 16),
    (7, 6, 2, 48, 5),   # head_dim and block size not powers of two
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[f"B{c[0]}-h{c[1]}/{c[2]}-d{c[3]}-bs{c[4]}" for c in CASES])
def test_kernel_equals_the_torch_paged_path(case, dtype):
    b, nh, kvh, hd, bs = case
    gen = torch.Generator().manual_seed(b * 1000 + nh)
    lens = torch.randint(1, 241, (b,), generator=gen).tolist()
    lens[0] = 1 if b > 1 else lens[0]  # a one-token context (a padded graph row's shape)
    q, kc, vc, tables, ctx = make_batch(gen, lens, nh, kvh, hd, bs, dtype)
    scale = hd ** -0.5
    ref = decode_attention(q.double(), kc.double(), vc.double(), tables, ctx, scale)
    for splits in (1, 3) if dtype == torch.float32 else (None,):
        out = triton_decode(q, kc, vc, tables, ctx, scale, splits=splits)
        assert out.dtype == dtype and out.shape == q.shape
        torch.testing.assert_close(out.double(), ref, **TOL[dtype], msg=lambda m, s=splits: f"splits={s}: {m}")


@pytest.mark.parametrize("window", [1, 37])
def test_sliding_window_equals_the_torch_paged_path(window):
    gen = torch.Generator().manual_seed(window)
    lens = [1, 37, 38, 150]
    q, kc, vc, tables, ctx = make_batch(gen, lens, 8, 2, 32, 16, torch.float32)
    ref = decode_attention(q.double(), kc.double(), vc.double(), tables, ctx, 0.2, window)
    for splits in (1, 4):
        out = triton_decode(q, kc, vc, tables, ctx, 0.2, window, splits=splits)
        torch.testing.assert_close(out.double(), ref, **TOL[torch.float32])


def test_every_position_of_a_sequence_equals_the_reference_attention():
    """A 45-token sequence's K/V written into scattered blocks of 16: the query at a position
    (each side of every block boundary, the first and the last) decoded against the context up
    to it gives that row of softmax(QK^T)V over the contiguous sequence."""
    gen = torch.Generator().manual_seed(4)
    t, kvh, hd, bs = 45, 2, 32, 16
    nh = kvh * 4
    q = torch.randn(t, nh, hd, generator=gen)
    k = torch.randn(t, kvh, hd, generator=gen)
    v = torch.randn(t, kvh, hd, generator=gen)
    ref = reference_attention(q.double(), k.double(), v.double(), hd ** -0.5)
    table = torch.randperm(9, generator=gen)[:3]
    k_cache = torch.zeros(10, bs, kvh, hd)
    v_cache = torch.zeros_like(k_cache)
    slots = table[torch.arange(t) // bs] * bs + torch.arange(t) % bs
    k_cache.view(-1, kvh, hd)[slots], v_cache.view(-1, kvh, hd)[slots] = k, v
    rows = torch.tensor([0, 1, 14, 15, 16, 17, 30, 31, 32, 33, 44])  # positions
    tables = table.repeat(len(rows), 1)  # the same sequence, a context up to the position each row
    out = triton_decode(q[rows].to(DEV), k_cache.to(DEV), v_cache.to(DEV), tables.to(DEV),
                        (rows + 1).to(DEV), hd ** -0.5, splits=2)
    torch.testing.assert_close(out.double().cpu(), ref[rows], **TOL[torch.float32])


def test_split_count_fills_the_gpu_within_the_context():
    assert num_splits(1, 8, 4096) == 64        # 8 programs: 64 splits of one BLOCK_N (64) each
    assert num_splits(1, 8, 4096 * 4) == 64    # 512 programs reached before one split per BLOCK_N
    assert num_splits(256, 8, 4096) == 1       # a full batch needs no split
    assert num_splits(64, 8, 1024) == 1
    assert num_splits(16, 8, 1024) == 4
    for b in (1, 2, 3, 16, 64, 255):
        for positions in (1, 16, 100, 1000, 5000):
            s = num_splits(b, 8, positions)
            assert 1 <= s <= max(1, -(-positions // BLOCK_N))
            assert s == 1 or b * 8 * (s - 1) < 512  # no more splits than the target needs
    assert triton.next_power_of_2(num_splits(1, 1, 10 ** 6)) == 512


def scattered_sequences(gen: torch.Generator, lens: list[int], nh: int, kvh: int, hd: int, bs: int):
    """Each sequence's q/k/v (float32) and its K/V written into scattered blocks of a cache."""
    seqs = [(torch.randn(n, nh, hd, generator=gen), torch.randn(n, kvh, hd, generator=gen),
             torch.randn(n, kvh, hd, generator=gen)) for n in lens]
    nb = sum(-(-n // bs) for n in lens)
    k_cache = torch.zeros(nb + 3, bs, kvh, hd)
    v_cache = torch.zeros_like(k_cache)
    perm, used, tables = torch.randperm(nb + 2, generator=gen).tolist(), 0, []
    for (_, k, v), n in zip(seqs, lens):
        table = torch.tensor(perm[used:used + -(-n // bs)])
        used += len(table)
        slots = table[torch.arange(n) // bs] * bs + torch.arange(n) % bs
        k_cache.view(-1, kvh, hd)[slots], v_cache.view(-1, kvh, hd)[slots] = k, v
        tables.append(table)
    return seqs, k_cache, v_cache, tables


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_prefill_after_cached_context_equals_the_reference(dtype, window):
    """Three prompt chunks in one launch (after 0, 10 and 33 cached tokens; 40, 13 and 37 rows,
    over tiles of 16 rows) give the rows of softmax(QK^T)V of their whole sequences."""
    from splitserve.engine.triton_attention import prefill_attention

    gen = torch.Generator().manual_seed(5)
    lens, cached, nh, kvh, hd = [40, 23, 70], [0, 10, 33], 8, 2, 32
    seqs, kc, vc, tables = scattered_sequences(gen, lens, nh, kvh, hd, 16)
    segs, row = [], 0
    for table, c, n in zip(tables, cached, lens):
        segs.append((row, n - c, n, table.to(DEV)))
        row += n - c
    q = torch.cat([s[0][c:] for s, c in zip(seqs, cached)]).to(dtype=dtype, device=DEV)
    out = torch.full_like(q, float("nan"))
    prefill_attention(q, kc.to(dtype=dtype, device=DEV), vc.to(dtype=dtype, device=DEV), out, segs,
                      hd ** -0.5, window, block_m=16)
    for (sq, sk, sv), (r0, m, n, _) in zip(seqs, segs):
        ref = reference_attention(*(x.to(dtype).double() for x in (sq, sk, sv)), hd ** -0.5, window)[n - m:]
        torch.testing.assert_close(out[r0:r0 + m].double().cpu(), ref, **TOL[dtype])

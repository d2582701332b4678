"""Paged attention (block tables, scattered blocks) against the contiguous reference."""

from __future__ import annotations

import pytest
import torch

from splitserve.engine.attention import (AttentionMetadata, PrefillSegment, paged_attention,
                                         reference_attention)

NH, KVH, HD, BS = 4, 2, 16, 4
SCALE = HD ** -0.5


def make_cache(num_blocks: int):
    k = torch.zeros(num_blocks + 1, BS, KVH, HD, dtype=torch.float64)
    return k, torch.zeros_like(k)


def slots_of(table, start, end):
    return [table[p // BS] * BS + p % BS for p in range(start, end)]


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("chunks", [[23], [7, 9, 1, 6], [1] * 23, [10, 1, 1, 11]])
def test_paged_equals_contiguous(chunks, window):
    """One sequence of 23 tokens run as prefill chunks and single-token decodes, its blocks
    scattered over the cache, gives the reference's outputs row for row."""
    torch.manual_seed(0)
    t = sum(chunks)
    q = torch.randn(t, NH, HD, dtype=torch.float64)
    k = torch.randn(t, KVH, HD, dtype=torch.float64)
    v = torch.randn(t, KVH, HD, dtype=torch.float64)
    ref = reference_attention(q, k, v, SCALE, window)
    k_cache, v_cache = make_cache(20)
    table = torch.randperm(20)[: -(-t // BS)].tolist()  # scattered, out of order
    start, outs = 0, []
    for n in chunks:
        end = start + n
        meta = AttentionMetadata(slot_mapping=torch.tensor(slots_of(table, start, end)))
        nb = -(-end // BS)
        if n == 1:
            meta.num_decode = 1
            meta.decode_block_tables = torch.tensor([table[:nb] + [20] * 3])  # padded with null
            meta.decode_context_lens = torch.tensor([end])
        else:
            meta.prefills = [PrefillSegment(0, n, end, torch.tensor(table[:nb]))]
        outs.append(paged_attention(q[start:end], k[start:end], v[start:end], k_cache, v_cache,
                                    meta, SCALE, window))
        start = end
    torch.testing.assert_close(torch.cat(outs), ref, rtol=0, atol=1e-10)


def test_mixed_batch_of_sequences_does_not_mix_them():
    """Decodes of two sequences and chunks of two others in one flattened batch."""
    torch.manual_seed(1)
    lens = [9, 14, 6, 11]  # total lengths; seqs 0,1 decode their last token, 2 full prefill,
    done = [8, 13, 0, 4]   # 3 prefills positions 4..10 after 4 cached
    seqs = [(torch.randn(n, NH, HD, dtype=torch.float64), torch.randn(n, KVH, HD, dtype=torch.float64),
             torch.randn(n, KVH, HD, dtype=torch.float64)) for n in lens]
    k_cache, v_cache = make_cache(24)
    perm = torch.randperm(24).tolist()
    tables, used = [], 0
    for n in lens:
        nb = -(-n // BS)
        tables.append(perm[used:used + nb])
        used += nb
    for (q, k, v), table, c in zip(seqs, tables, done):  # what earlier steps wrote
        if c:
            meta = AttentionMetadata(slot_mapping=torch.tensor(slots_of(table, 0, c)),
                                     prefills=[PrefillSegment(0, c, c, None)])
            paged_attention(q[:c], k[:c], v[:c], k_cache, v_cache, meta, SCALE)
    qs, ks, vs, slots = [], [], [], []
    for (q, k, v), table, c, n in zip(seqs, tables, done, lens):
        qs.append(q[c:n]), ks.append(k[c:n]), vs.append(v[c:n]), slots.extend(slots_of(table, c, n))
    width = max(len(t) for t in tables[:2])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), num_decode=2,
        decode_block_tables=torch.tensor([t + [24] * (width - len(t)) for t in tables[:2]]),
        decode_context_lens=torch.tensor(lens[:2]),
        prefills=[PrefillSegment(2, 6, 6, None), PrefillSegment(8, 7, 11, torch.tensor(tables[3]))])
    out = paged_attention(torch.cat(qs), torch.cat(ks), torch.cat(vs), k_cache, v_cache, meta, SCALE)
    row = 0
    for (q, k, v), c, n in zip(seqs, done, lens):
        ref = reference_attention(q, k, v, SCALE)[c:n]
        torch.testing.assert_close(out[row:row + n - c], ref, rtol=0, atol=1e-10)
        row += n - c

"""One batch through the model: the inputs of a step (token ids, positions, KV slots, block tables
of decodes and prefill segments) built from its sequences, the forward pass (or a CUDA graph
replay for a batch of decodes), and the logits of the rows that sample a token."""

from __future__ import annotations

import torch

from .attention import AttentionMetadata, PrefillSegment
from .sequence import Sequence


def run_batch(model, kv, blocks, graphs, device: torch.device,
              batch: list[tuple[Sequence, int]]) -> tuple[torch.Tensor | None, list[Sequence]]:
    """Run `batch` ((sequence, new tokens), decodes first); the logits of the sequences that
    sample now (at the end of their prompt, or decoding), and those sequences."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    rows: list[int] = []
    samplers: list[Sequence] = []
    dec_tables: list[list[int]] = []
    dec_lens: list[int] = []
    segs: list[tuple[int, int, int, list[int]]] = []
    for seq, n in batch:
        c = seq.num_computed
        table = blocks.block_table(seq.request_id)
        if n == 1:
            dec_tables.append(table[: blocks.blocks_for(c + 1)])
            dec_lens.append(c + 1)
        else:
            segs.append((len(ids), n, c + n, table[: blocks.blocks_for(c + n)]))
        ids += seq.token_slice(c, c + n)
        pos += range(c, c + n)
        slots += kv.slots(table, c, c + n)
        if c + n == seq.num_tokens:
            rows.append(len(ids) - 1)
            samplers.append(seq)
    if not segs and graphs is not None and graphs.bucket(len(ids), max(map(len, dec_tables))):
        logits = graphs.run(ids, pos, slots, dec_lens, dec_tables)
        return logits, samplers

    dev = device
    lt = lambda x: torch.tensor(x, dtype=torch.long, device=dev)  # noqa: E731
    meta = AttentionMetadata(slot_mapping=lt(slots), num_decode=len(dec_lens))
    if dec_lens:
        width = max(map(len, dec_tables))
        meta.decode_block_tables = lt([t + [kv.null_block] * (width - len(t)) for t in dec_tables])
        meta.decode_context_lens = lt(dec_lens)
    meta.prefills = [PrefillSegment(q0, n, ctx, lt(t) if ctx > n else None) for q0, n, ctx, t in segs]
    hidden = model(lt(ids), lt(pos), meta)
    logits = model.compute_logits(hidden[lt(rows)]) if rows else None
    return logits, samplers

"""One batch through the model: the inputs of a step (token ids, positions, KV slots, block tables
of decodes and prefill segments) built from its sequences (`prepare`), then the forward pass or a
CUDA graph replay for a batch of decodes, and the logits of the rows that sample a token
(`execute`). `StepInputs` is plain lists, so rank 0 of a tensor-parallel group sends it to the
other ranks as it is (parallel.py), and every rank runs the same `execute`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .attention import AttentionMetadata, PrefillSegment
from .logprobs import prompt_positions
from .sequence import Sequence


@dataclass
class StepInputs:
    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)             # rows whose logits sample a token
    prompt_rows: list[int] = field(default_factory=list)      # rows whose logits give prompt logprobs, after `rows`
    dec_tables: list[list[int]] = field(default_factory=list)
    dec_lens: list[int] = field(default_factory=list)
    segs: list[tuple[int, int, int, list[int]]] = field(default_factory=list)  # q0, n, ctx, blocks
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write block pairs, first
    saves: list[list[int]] = field(default_factory=list)    # slots of prompts streamed layer by layer
    exports: list[list[int]] = field(default_factory=list)  # slots of prompts whose KV goes at the end


def prepare(kv, blocks, batch: list[tuple[Sequence, int]]) -> tuple[StepInputs, list[Sequence]]:
    """The inputs of `batch` ((sequence, new tokens), decodes first), and the sequences that
    sample now (at the end of their prompt, or decoding)."""
    inp = StepInputs()
    samplers: list[Sequence] = []
    for seq, n in batch:
        c = seq.num_computed
        table = blocks.block_table(seq.request_id)
        if n == 1:
            inp.dec_tables.append(table[: blocks.blocks_for(c + 1)])
            inp.dec_lens.append(c + 1)
        else:
            inp.segs.append((len(inp.ids), n, c + n, table[: blocks.blocks_for(c + n)]))
        if seq.params.prompt_logprobs is not None:
            inp.prompt_rows += [len(inp.ids) + q - c for q in prompt_positions(seq, n)]
        inp.ids += seq.token_slice(c, c + n)
        inp.pos += range(c, c + n)
        inp.slots += kv.slots(table, c, c + n)
        if c + n == seq.num_tokens:
            inp.rows.append(len(inp.ids) - 1)
            samplers.append(seq)
    return inp, samplers


def execute(model, kv, graphs, device: torch.device, inp: StepInputs, logits: bool = True) -> torch.Tensor | None:
    """Run the step `inp` on this rank's model and KV cache; the logits of its sampling rows
    (None without any, or when `logits` is False: a follower rank)."""
    kv.copy_blocks(inp.copies)
    if not inp.segs and graphs is not None and graphs.bucket(len(inp.ids), max(map(len, inp.dec_tables))):
        return graphs.run(inp.ids, inp.pos, inp.slots, inp.dec_lens, inp.dec_tables)
    lt = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    meta = AttentionMetadata(slot_mapping=lt(inp.slots), num_decode=len(inp.dec_lens))
    if inp.dec_lens:
        width = max(map(len, inp.dec_tables))
        meta.decode_block_tables = lt([t + [kv.null_block] * (width - len(t)) for t in inp.dec_tables])
        meta.decode_context_lens = lt(inp.dec_lens)
    meta.prefills = [PrefillSegment(q0, n, ctx, lt(t) if ctx > n else None) for q0, n, ctx, t in inp.segs]
    hidden = model(lt(inp.ids), lt(inp.pos), meta)
    rows = inp.rows + inp.prompt_rows
    if not (logits and rows):
        return None
    return model.compute_logits(hidden[lt(rows)])

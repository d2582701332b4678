"""CUDA graphs for decode steps.

A decode-only step is captured once per (batch bucket, block bucket) and replayed afterwards:
batch sizes are padded up to 1, 2, 4, 8, 16, 32, ... (up to max_batch) and the per-sequence block
tables to a power of two of blocks (at least 8, at most max_blocks). Padded rows read and write
only the KV cache's null block, and their logits are dropped. All graphs share one memory pool;
inputs live in static tensors that are refilled before each replay. Captures happen lazily, the
first time a bucket is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .attention import AttentionMetadata
from .kv_cache import KVCache
from .model import CausalLM

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

MIN_BLOCKS = 8


class DecodeGraphs:
    def __init__(self, model: CausalLM, kv: KVCache, max_batch: int, max_blocks: int) -> None:
        self.model, self.kv = model, kv
        self.max_batch, self.max_blocks = max_batch, max_blocks
        sizes, b = set(), 1
        while b < max_batch:
            sizes.add(b)
            b *= 2
        self.batch_sizes = sorted(sizes | {max_batch})
        dev = kv.device
        self.null_slot = kv.null_block * kv.block_size
        self.ids = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.pos = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.slots = torch.full((max_batch,), self.null_slot, dtype=torch.long, device=dev)
        self.ctx = torch.ones(max_batch, dtype=torch.long, device=dev)
        self.tables = torch.full((max_batch, max_blocks), kv.null_block, dtype=torch.long, device=dev)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.pool: _POOL_HANDLE | None = None  # the graphs' shared memory pool, from the first capture

    def bucket(self, batch: int, blocks: int) -> tuple[int, int] | None:
        if batch > self.max_batch or blocks > self.max_blocks:
            return None
        b = next(s for s in self.batch_sizes if s >= batch)
        nb = MIN_BLOCKS
        while nb < blocks:
            nb *= 2
        return b, min(nb, self.max_blocks)

    def buckets(self) -> list[tuple[int, int]]:
        """Every (batch, blocks) bucket a step may use."""
        blocks, nb = set(), MIN_BLOCKS
        while nb < self.max_blocks:
            blocks.add(nb)
            nb *= 2
        blocks.add(min(nb, self.max_blocks))
        return [(b, n) for b in self.batch_sizes for n in sorted(blocks)]

    def capture_all(self) -> None:
        """Capture every bucket now (a benchmark, before its clock starts). The static inputs then
        hold padding only: the captures' warm-up steps write the null block alone."""
        for b, nb in self.buckets():
            if (b, nb) not in self.graphs:
                self._capture(b, nb)

    def _forward(self, b: int, nb: int) -> torch.Tensor:
        meta = AttentionMetadata(slot_mapping=self.slots[:b], num_decode=b,
                                 decode_block_tables=self.tables[:b, :nb],
                                 decode_context_lens=self.ctx[:b])
        return self.model.compute_logits(self.model(self.ids[:b], self.pos[:b], meta))

    def _capture(self, b: int, nb: int) -> None:
        # Warm-up on a side stream (lazy initialisations must not happen during capture). It runs
        # the real step's inputs, so its cache writes are the very values the replay writes.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(b, nb)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._forward(b, nb)
        self.pool = graph.pool()
        self.graphs[(b, nb)], self.outputs[(b, nb)] = graph, out

    def run(self, ids: list[int], positions: list[int], slots: list[int], context_lens: list[int],
            tables: list[list[int]]) -> torch.Tensor:
        """Logits (batch, vocab) of one decode step; the caller checked `bucket(...)` is not None."""
        n = len(ids)
        bucket = self.bucket(n, max(len(t) for t in tables))
        if bucket is None:
            raise ValueError(f"a decode step of {n} sequences fits no CUDA graph (check bucket() first)")
        b, nb = bucket
        pad = b - n
        null = self.kv.null_block
        long = torch.long  # on the CPU, copied to the static inputs without a sync
        self.ids[:b].copy_(torch.tensor(ids + [0] * pad, dtype=long), non_blocking=True)
        self.pos[:b].copy_(torch.tensor(positions + [0] * pad, dtype=long), non_blocking=True)
        self.slots[:b].copy_(torch.tensor(slots + [self.null_slot] * pad, dtype=long), non_blocking=True)
        self.ctx[:b].copy_(torch.tensor(context_lens + [1] * pad, dtype=long), non_blocking=True)
        table = torch.full((b, nb), null, dtype=long)
        for i, t in enumerate(tables):
            table[i, : len(t)] = torch.tensor(t, dtype=long)
        self.tables[:b, :nb].copy_(table, non_blocking=True)
        if (b, nb) not in self.graphs:
            self._capture(b, nb)
        self.graphs[(b, nb)].replay()
        return self.outputs[(b, nb)][:n]

"""Paged KV-cache bookkeeping: which fixed-size blocks each sequence owns. Pure Python, no torch.

A block holds `block_size` consecutive token positions of one sequence. Blocks come from the
free blocks (`cache`, block_cache.py: with prefix caching, some of them still named by the tokens
they hold) and carry a reference count: `fork` lets a second sequence share a parent's blocks,
and a shared, partly filled last block is copied before either sequence writes into it (copy on
write; `append` returns the (src, dst) pairs the cache must copy). Full blocks are never written
again, so sharing them is safe: `attach` starts a sequence on the cached blocks of its prefix.
Blocks reserved but not yet written wait in `pools` (block_pools.py), and a sequence's new
blocks can come from one of them.
"""

from __future__ import annotations

from collections.abc import Hashable

from .block_cache import BlockCache, NoFreeBlocks
from .block_pools import BlockPools

__all__ = ["BlockManager", "NoFreeBlocks"]


class BlockManager:
    """Block tables and lengths by sequence, and each block's reference count, over the free
    blocks and prefix cache (`cache`) and the reserved pools (`pools`)."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.cache = BlockCache(num_blocks, caching)
        self.pools = BlockPools(self.cache)
        self._refs = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}  # token positions each sequence has room for

    # ---- queries -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.cache.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def has(self, seq_id: Hashable) -> bool:
        return seq_id in self._tables

    def block_table(self, seq_id: Hashable) -> list[int]:
        return self._tables[seq_id]

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._lengths.get(seq_id, 0)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def blocks_needed(self, seq_id: Hashable, num_tokens: int) -> int:
        """Free blocks that growing `seq_id` (new or existing) to `num_tokens` would take."""
        table = self._tables.get(seq_id)
        if table is None:
            return self.blocks_for(num_tokens)
        have = self._lengths[seq_id]
        if num_tokens <= have:
            return 0
        need = self.blocks_for(num_tokens) - len(table)
        if have % self.block_size and self._refs[table[-1]] > 1:
            need += 1  # the shared partial last block is copied before it is written
        return need

    # ---- changes -----------------------------------------------------------------------
    def _take(self, n: int, pool: Hashable | None = None) -> list[int]:
        if pool is not None:
            out = self.pools.take(pool, n)
        else:
            if n > self.num_free:
                raise NoFreeBlocks(f"need {n} blocks, {self.num_free} free")
            out = [self.cache.pop() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def allocate(self, seq_id: Hashable, num_tokens: int, pool: Hashable | None = None) -> list[int]:
        """A new sequence with room for `num_tokens` positions (its blocks from the free list, or
        from `pool`); returns its block table."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        self._tables[seq_id] = self._take(self.blocks_for(num_tokens), pool)
        self._lengths[seq_id] = num_tokens
        return self._tables[seq_id]

    def append(self, seq_id: Hashable, num_tokens: int, pool: Hashable | None = None) -> list[tuple[int, int]]:
        """Grow `seq_id` to hold `num_tokens` positions (a new id is allocated), its new blocks
        from the free list, or from `pool` only.

        Returns the copy-on-write pairs (src_block, dst_block) whose contents must be copied
        before the new positions are written."""
        if seq_id not in self._tables:
            self.allocate(seq_id, num_tokens, pool)
            return []
        have = self._lengths[seq_id]
        if num_tokens <= have:
            return []
        need = self.blocks_needed(seq_id, num_tokens)
        avail = self.num_free if pool is None else self.pools.size(pool)
        if need > avail:
            raise NoFreeBlocks(f"need {need} blocks, {avail} " + ("free" if pool is None else f"in pool {pool!r}"))
        table = self._tables[seq_id]
        copies: list[tuple[int, int]] = []
        if have % self.block_size and self._refs[table[-1]] > 1:
            (new,) = self._take(1, pool)
            old = table[-1]
            self._refs[old] -= 1
            table[-1] = new
            copies.append((old, new))
        table.extend(self._take(self.blocks_for(num_tokens) - len(table), pool))
        self._lengths[seq_id] = num_tokens
        return copies

    def fork(self, src: Hashable, dst: Hashable) -> list[int]:
        """`dst` shares all of `src`'s blocks (reference counts go up)."""
        if dst in self._tables:
            raise ValueError(f"sequence {dst!r} already has blocks")
        table = list(self._tables[src])
        for b in table:
            self._refs[b] += 1
        self._tables[dst] = table
        self._lengths[dst] = self._lengths[src]
        return table

    def free(self, seq_id: Hashable) -> None:
        """Drop `seq_id`; blocks no other sequence references go back to the free list (last to
        first: a cached prefix is evicted after its tails)."""
        for b in reversed(self._tables.pop(seq_id, ())):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self.cache.release(b)
        self._lengths.pop(seq_id, None)

    def attach(self, seq_id: Hashable, blocks: list[int]) -> None:
        """A new sequence whose first blocks are the cached `blocks` (cache.lookup): shared, not
        written; its length is theirs."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        for b in blocks:
            self.cache.reuse(b, free=self._refs[b] == 0)
            self._refs[b] += 1
        self._tables[seq_id] = list(blocks)
        self._lengths[seq_id] = len(blocks) * self.block_size

    # ---- invariants (tests) -------------------------------------------------------------
    def check(self) -> None:
        refs = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            assert len(table) == self.blocks_for(self._lengths[seq_id]), seq_id
            for b in table:
                refs[b] += 1
        assert refs == self._refs, "reference counts disagree with block tables"
        free = self.cache.check()
        pooled = self.pools.blocks()
        assert len(set(pooled)) == len(pooled) and not free & set(pooled), "a pooled block twice"
        for b in range(self.num_blocks):
            assert (b in free or b in pooled) == (refs[b] == 0), f"block {b}: free={b in free} refs={refs[b]}"

"""Paged KV-cache bookkeeping: which fixed-size blocks each sequence owns. Pure Python, no torch.

A block holds `block_size` consecutive token positions of one sequence. Blocks come from a free
list and carry a reference count: `fork` lets a second sequence share a parent's blocks, and a
shared, partly filled last block is copied before either sequence writes into it (copy on
write; `append` returns the (src, dst) pairs the cache must copy). Full blocks are never written
again, so sharing them is safe.

Prefix caching (`caching=True`): a full block whose K/V is written can be `register`ed under
the chained hash of its tokens (policy/prefix_cache.py), and a new sequence `attach`es the blocks of its
longest cached prefix instead of computing them. A cached block whose last reference goes stays
cached, on an LRU list of its own, until a block is needed and no uncached one is free: free
blocks are taken uncached first, then cached, least recently freed first (a sequence frees its
blocks last to first, so a prefix outlives its tails). Either kind counts as free.

Pools: blocks reserved but not yet written. `set_pool(key, n)` holds `n` blocks aside under `key`
(out of the free list, in no table), and `append(..., pool=key)` takes a sequence's new blocks
from that pool only. EcoServe's KV pipelining (policy/schedulers/ecoserve/) so runs for real: a
host's reservation is its pool, and the guests it hosts write into blocks from it.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable


class NoFreeBlocks(RuntimeError):
    """Not enough free blocks for an allocation; nothing was changed."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self._free: deque[int] = deque(range(num_blocks))  # free and uncached
        self._lru: dict[int, None] = {}                    # free and cached, least recently freed first
        self._cached: dict[int, int] = {}                  # block hash -> block
        self._hash_of: dict[int, int] = {}                 # block -> its hash (cached blocks)
        self._refs = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}  # token positions each sequence has room for
        self._pools: dict[Hashable, list[int]] = {}  # reserved, unwritten blocks by holder
        self.evictions = 0  # cached blocks taken for other contents

    # ---- queries -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def cached_prefix(self, hashes: Iterable[int]) -> list[int]:
        """The cached blocks of the longest prefix whose block hashes are `hashes` (in order)."""
        out = []
        for h in hashes:
            b = self._cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

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

    def blocks_released_by(self, seq_id: Hashable) -> int:
        """Blocks that `free(seq_id)` would return to the free list."""
        return sum(1 for b in self._tables.get(seq_id, ()) if self._refs[b] == 1)

    # ---- changes -----------------------------------------------------------------------
    def pool_size(self, key: Hashable) -> int:
        return len(self._pools.get(key, ()))

    @property
    def pools(self) -> dict[Hashable, int]:
        return {k: len(v) for k, v in self._pools.items()}

    def _pop_free(self) -> int:
        """A free block for new contents: an uncached one, else the least recently freed cached
        one (evicted: its hash goes)."""
        if self._free:
            return self._free.popleft()
        b = next(iter(self._lru))
        del self._lru[b]
        del self._cached[self._hash_of.pop(b)]
        self.evictions += 1
        return b

    def _take(self, n: int, pool: Hashable | None = None) -> list[int]:
        if pool is not None:
            src = self._pools.get(pool, [])
            if n > len(src):
                raise NoFreeBlocks(f"need {n} blocks, {len(src)} reserved in pool {pool!r}")
            out = [src.pop() for _ in range(n)]
            for b in out:
                self._refs[b] = 1
            return out
        if n > self.num_free:
            raise NoFreeBlocks(f"need {n} blocks, {self.num_free} free")
        out = [self._pop_free() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def _release(self, b: int) -> None:
        """`b` lost its last reference: free, and still cached if it was."""
        if b in self._hash_of:
            self._lru[b] = None
        else:
            self._free.append(b)

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
        avail = self.num_free if pool is None else self.pool_size(pool)
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
                self._release(b)
        self._lengths.pop(seq_id, None)

    # ---- prefix caching ----------------------------------------------------------------------
    def attach(self, seq_id: Hashable, blocks: list[int]) -> None:
        """A new sequence whose first blocks are the cached `blocks` (cached_prefix): shared, not
        written; its length is theirs."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        for b in blocks:
            if b not in self._hash_of:
                raise ValueError(f"block {b} is not cached")
            if self._refs[b] == 0:
                del self._lru[b]
            self._refs[b] += 1
        self._tables[seq_id] = list(blocks)
        self._lengths[seq_id] = len(blocks) * self.block_size

    def register(self, block: int, h: int) -> None:
        """Full block `block`, written, holds the tokens whose chained hash is `h`: later
        sequences may share it. A hash already cached keeps its block (this one stays uncached)."""
        if self.caching and h not in self._cached and block not in self._hash_of and self._refs[block] > 0:
            self._cached[h] = block
            self._hash_of[block] = h

    def set_pool(self, key: Hashable, n: int) -> None:
        """Hold exactly `n` blocks aside under `key` (from or back to the free list; 0 drops it)."""
        pool = self._pools.setdefault(key, [])
        if n > len(pool):
            if n - len(pool) > self.num_free:
                raise NoFreeBlocks(f"pool {key!r} needs {n - len(pool)} blocks, {self.num_free} free")
            pool.extend(self._pop_free() for _ in range(n - len(pool)))
        while len(pool) > n:
            self._free.append(pool.pop())
        if not pool:
            del self._pools[key]

    def rename(self, old: Hashable, new: Hashable) -> None:
        """Hand `old`'s blocks to `new` unchanged (a reservation becoming a sequence)."""
        if new in self._tables:
            raise ValueError(f"sequence {new!r} already has blocks")
        self._tables[new] = self._tables.pop(old)
        self._lengths[new] = self._lengths.pop(old)

    # ---- invariants (tests) -------------------------------------------------------------
    def check(self) -> None:
        refs = [0] * self.num_blocks
        for seq_id, table in self._tables.items():
            assert len(table) == self.blocks_for(self._lengths[seq_id]), seq_id
            for b in table:
                refs[b] += 1
        assert refs == self._refs, "reference counts disagree with block tables"
        free = set(self._free) | set(self._lru)
        assert len(free) == len(self._free) + len(self._lru), "a block is on the free lists twice"
        assert all(b in self._hash_of for b in self._lru), "an uncached block on the cached free list"
        assert {b: h for h, b in self._cached.items()} == self._hash_of, "the cache's two maps disagree"
        pooled = [b for p in self._pools.values() for b in p]
        assert len(set(pooled)) == len(pooled) and not free & set(pooled), "a pooled block twice"
        for b in range(self.num_blocks):
            assert (b in free or b in pooled) == (refs[b] == 0), f"block {b}: free={b in free} refs={refs[b]}"

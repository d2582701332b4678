"""Pools: KV blocks reserved but not yet written. Pure Python, no torch.

`set(key, n)` holds `n` blocks aside under `key` (out of the free blocks, in no table), and a
sequence's new blocks can come from one pool only (BlockManager.append(..., pool=key)).
EcoServe's KV pipelining (policy/schedulers/ecoserve/) so runs for real: a host's reservation is
its pool, and the guests it hosts write into blocks from it.
"""

from __future__ import annotations

from collections.abc import Hashable

from .block_cache import BlockCache, NoFreeBlocks


class BlockPools:
    """Reserved, unwritten blocks by holder, taken from and given back to `cache`'s free blocks."""

    def __init__(self, cache: BlockCache) -> None:
        self.cache = cache
        self._pools: dict[Hashable, list[int]] = {}

    def size(self, key: Hashable) -> int:
        return len(self._pools.get(key, ()))

    def sizes(self) -> dict[Hashable, int]:
        return {k: len(v) for k, v in self._pools.items()}

    def set(self, key: Hashable, n: int) -> None:
        """Hold exactly `n` blocks aside under `key` (from or back to the free blocks; 0 drops it)."""
        pool = self._pools.setdefault(key, [])
        if n > len(pool):
            if n - len(pool) > self.cache.num_free:
                raise NoFreeBlocks(f"pool {key!r} needs {n - len(pool)} blocks, {self.cache.num_free} free")
            pool.extend(self.cache.pop() for _ in range(n - len(pool)))
        while len(pool) > n:
            self.cache.release(pool.pop())
        if not pool:
            del self._pools[key]

    def take(self, key: Hashable, n: int) -> list[int]:
        """`n` blocks out of pool `key` (NoFreeBlocks if it holds fewer)."""
        src = self._pools.get(key, [])
        if n > len(src):
            raise NoFreeBlocks(f"need {n} blocks, {len(src)} reserved in pool {key!r}")
        return [src.pop() for _ in range(n)]

    def blocks(self) -> list[int]:
        """Every pooled block."""
        return [b for p in self._pools.values() for b in p]

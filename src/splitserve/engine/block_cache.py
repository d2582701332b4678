"""The free blocks of a paged KV cache and the prefix cache over them. Pure Python, no torch.

A full block whose K/V is written can be `register`ed under the chained hash of its tokens
(policy/prefix_cache.py), and a new sequence shares the blocks of its longest cached prefix
(`lookup`) instead of computing them. A cached block whose last reference goes stays cached, on
an LRU list of its own, until a block is needed and no uncached one is free: free blocks are
taken uncached first, then cached, least recently freed first (a sequence frees its blocks last
to first, so a prefix outlives its tails). Either kind counts as free.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class NoFreeBlocks(RuntimeError):
    """Not enough free blocks for an allocation; nothing was changed."""


class BlockCache:
    """Free blocks (`num_free`: uncached and cached ones) and the cached blocks by name. With
    `enabled` False nothing is ever cached."""

    def __init__(self, num_blocks: int, enabled: bool) -> None:
        self.enabled = enabled
        self._free: deque[int] = deque(range(num_blocks))  # free and uncached
        self._lru: dict[int, None] = {}                    # free and cached, least recently freed first
        self._cached: dict[int, int] = {}                  # block hash -> block
        self._hash_of: dict[int, int] = {}                 # block -> its hash (cached blocks)
        self.evictions = 0  # cached blocks taken for other contents

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._lru)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def lookup(self, hashes: Iterable[int]) -> list[int]:
        """The cached blocks of the longest prefix whose block hashes are `hashes` (in order)."""
        out = []
        for h in hashes:
            b = self._cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def is_cached(self, block: int) -> bool:
        return block in self._hash_of

    def register(self, block: int, h: int) -> None:
        """Full block `block`, written and held by a sequence, holds the tokens whose chained hash
        is `h`: later sequences may share it. A hash already cached keeps its block (this one
        stays uncached)."""
        if self.enabled and h not in self._cached and block not in self._hash_of:
            self._cached[h] = block
            self._hash_of[block] = h

    def pop(self) -> int:
        """A free block for new contents: an uncached one, else the least recently freed cached
        one (evicted: its hash goes)."""
        if self._free:
            return self._free.popleft()
        b = next(iter(self._lru))
        del self._lru[b]
        del self._cached[self._hash_of.pop(b)]
        self.evictions += 1
        return b

    def release(self, block: int) -> None:
        """`block` lost its last reference: free, and still cached if it was."""
        if block in self._hash_of:
            self._lru[block] = None
        else:
            self._free.append(block)

    def reuse(self, block: int, free: bool) -> None:
        """A sequence shares cached `block` (`free`: no other sequence held it: off the LRU list).
        ValueError if it is not cached."""
        if block not in self._hash_of:
            raise ValueError(f"block {block} is not cached")
        if free:
            del self._lru[block]

    def check(self) -> set[int]:
        """Assert its invariants; the free blocks."""
        free = set(self._free) | set(self._lru)
        assert len(free) == len(self._free) + len(self._lru), "a block is on the free lists twice"
        assert all(b in self._hash_of for b in self._lru), "an uncached block on the cached free list"
        assert {b: h for h, b in self._cached.items()} == self._hash_of, "the cache's two maps disagree"
        return free

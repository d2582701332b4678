"""Paged KV-cache bookkeeping: which fixed-size blocks each sequence owns. Pure Python, no torch.

A block holds `block_size` consecutive token positions of one sequence. Blocks come from a free
list and carry a reference count: `fork` lets a second sequence share a parent's blocks, and a
shared, partly filled last block is copied before either sequence writes into it (copy on
write; `append` returns the (src, dst) pairs the cache must copy). Full blocks are never written
again, so sharing them is safe.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable


class NoFreeBlocks(RuntimeError):
    """Not enough free blocks for an allocation; nothing was changed."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}  # token positions each sequence has room for

    # ---- queries -----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

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
    def _take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise NoFreeBlocks(f"need {n} blocks, {len(self._free)} free")
        out = [self._free.popleft() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        return out

    def allocate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """A new sequence with room for `num_tokens` positions; returns its block table."""
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        self._tables[seq_id] = self._take(self.blocks_for(num_tokens))
        self._lengths[seq_id] = num_tokens
        return self._tables[seq_id]

    def append(self, seq_id: Hashable, num_tokens: int) -> list[tuple[int, int]]:
        """Grow `seq_id` to hold `num_tokens` positions (a new id is allocated).

        Returns the copy-on-write pairs (src_block, dst_block) whose contents must be copied
        before the new positions are written."""
        if seq_id not in self._tables:
            self.allocate(seq_id, num_tokens)
            return []
        have = self._lengths[seq_id]
        if num_tokens <= have:
            return []
        need = self.blocks_needed(seq_id, num_tokens)
        if need > len(self._free):
            raise NoFreeBlocks(f"need {need} blocks, {len(self._free)} free")
        table = self._tables[seq_id]
        copies: list[tuple[int, int]] = []
        if have % self.block_size and self._refs[table[-1]] > 1:
            (new,) = self._take(1)
            old = table[-1]
            self._refs[old] -= 1
            table[-1] = new
            copies.append((old, new))
        table.extend(self._take(self.blocks_for(num_tokens) - len(table)))
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
        """Drop `seq_id`; blocks no other sequence references go back to the free list."""
        for b in self._tables.pop(seq_id, ()):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)
        self._lengths.pop(seq_id, None)

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
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        for b in range(self.num_blocks):
            assert (b in free) == (refs[b] == 0), f"block {b}: free={b in free} refs={refs[b]}"

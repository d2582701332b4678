"""Prefix caching as every part sees it: a full block's name, a machine's cache of named blocks,
and how much of a prompt a cache can give.

A full block of `block_size` tokens is named by a chained hash: the hash of (the previous
block's name, its own tokens), so two blocks share a name only when every token before them and
in them is the same, at the same positions, and hence so is their K/V. The engine's block
manager (engine/block_manager.py) keeps its cached blocks by these names; `BlockCache` is the
same cache as names only (no K/V): what a simulated machine holds (sim/prefix.py) and the
router's view of what each live worker holds (serve/cluster_state.py). Both drop the least
recently freed block first, and a sequence frees its blocks last to first, so a prefix outlives
its tails.

Python's hash of a tuple of ints is deterministic across processes and runs (no hash seed for
ints); two different prefixes share a name only on a 64-bit collision.
"""

from __future__ import annotations

ROOT = 0x5EED  # the "previous hash" of a sequence's first block


def block_hash(prev: int, tokens: list[int]) -> int:
    """The name of a full block holding `tokens`, after the block named `prev` (ROOT: first)."""
    return hash((prev, tuple(tokens)))


def extend_hashes(hashes: list[int], tokens: list[int], block_size: int) -> list[int]:
    """Append to `hashes` (the names of the first len(hashes) blocks of `tokens`) the names of
    the further full blocks of `tokens`; returns `hashes`."""
    prev = hashes[-1] if hashes else ROOT
    for start in range(len(hashes) * block_size, len(tokens) - block_size + 1, block_size):
        prev = block_hash(prev, tokens[start:start + block_size])
        hashes.append(prev)
    return hashes


def attachable(hit_blocks: int, chunk: int, block_size: int) -> int:
    """Blocks of a cached prefix of `hit_blocks` blocks that a prompt whose first chunk is `chunk`
    tokens attaches: whole blocks below the chunk's end, since the chunk computes one token at
    least (the last prompt token's logits make the first output)."""
    return min(hit_blocks, (chunk - 1) // block_size)


def cached_tokens(cache: BlockCache, blocks: list[int], chunk: int, block_size: int) -> int:
    """Prompt tokens a prompt named `blocks` takes from `cache` when its first chunk is `chunk`
    tokens (`attachable` of the prefix the cache holds, in tokens)."""
    return attachable(cache.match(blocks), chunk, block_size) * block_size


class BlockCache:
    """The names of the blocks one machine holds, least recently freed first, at most `capacity`
    (its KV cache in blocks)."""

    __slots__ = ("capacity", "names")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.names: dict[int, None] = {}

    def match(self, hashes: list[int]) -> int:
        """How many of `hashes` (a prompt's block names, in order) it holds as a prefix."""
        names = self.names
        n = 0
        for h in hashes:
            if h not in names:
                break
            n += 1
        return n

    def free(self, hashes: list[int]) -> None:
        """A sequence whose blocks are named `hashes` frees them, last to first: each becomes the
        most recently freed (its first block the most recent of all), the least recent beyond
        `capacity` are dropped."""
        names = self.names
        for h in reversed(hashes):
            names.pop(h, None)
            names[h] = None
        while len(names) > self.capacity:
            del names[next(iter(names))]

    def drop(self, hashes: list[int]) -> None:
        """Forget `hashes` (a view that learnt the machine does not hold them)."""
        for h in hashes:
            self.names.pop(h, None)

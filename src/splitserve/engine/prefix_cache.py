"""Prefix caching: which of a sequence's blocks another sequence already computed.

A full block of `block_size` tokens is named by a chained hash: the hash of (the previous
block's hash, its own tokens), so two blocks share a name only when every token before them and
in them is the same, at the same positions, and hence so is their K/V. The block manager
(block_manager.py) keeps the cached blocks by these names; the scheduler (scheduler.py) attaches a
new prompt's longest cached prefix and computes only the rest, and names each block once it is
full and written.

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

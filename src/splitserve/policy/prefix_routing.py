"""Prefix-aware routing: a request goes to the machine whose cache holds its longest prompt
prefix, unless that machine's load passes the least-loaded one's by more than a slack
(RoutingConfig.prefix_slack, `--prefix-slack`, in pending tokens, the load JSQ compares), as
SGLang's cache-aware router and llm-d's prefix scorer balance reuse against load.

One rule for the simulator, whose machines' caches are modelled (sim/prefix.py), and the live
router, whose view of each worker's cache follows what it sent there and the workers' reports
(serve/cluster_state.py): both set `Machine.cache` (a policy/prefix_cache.py BlockCache) and
`Request.blocks`. A request without blocks, or machines without caches, get plain JSQ.

A request may name its cache (OpenAI's `prompt_cache_key`, hashed by `cache_key`: requests that
share a key share a prefix, as a conversation's turns do, before any of it is cached). `CacheKeys`
remembers the machine each key's last request went to (the newest `KEYS_KEPT` keys): the next one
goes there too unless that machine's pending tokens pass the least's by more than the slack, when
it is routed by `pick` and the key follows it. The cluster schedulers (pools.py) route their prompt
side through it, in the simulator and the live router alike.
"""

from __future__ import annotations

import hashlib

from .state import Machine, Request

KEYS_KEPT = 65536   # prompt cache keys remembered, least recently used out first


def least_pending(*groups: list[Machine]) -> Machine:
    """JSQ: the machine of `groups`, in their order, with the fewest pending tokens (the first
    such), as min(a + b, key=pending) gives it; a loop over the lists as they are: compiled
    (setup.py HOT), a field read per machine, no list built."""
    least: Machine | None = None
    for ms in groups:
        for m in ms:
            if least is None or m.pending < least.pending:
                least = m
    if least is None:
        raise ValueError("no machine to choose from")
    return least


def pick(ms: list[Machine], r: Request, slack: int) -> Machine:
    """The machine of `ms` for `r`: the least pending tokens (the first such), or, where `r` has
    blocks and `slack` >= 0, the one holding most of them as a prefix (fewest pending tokens among
    equals) if its pending tokens are at most the least's plus `slack`."""
    least = least_pending(ms)
    blocks = r.blocks
    if not blocks or slack < 0:
        return least
    best, most = least, 0
    for m in ms:
        c = m.cache
        if c is None:
            continue
        n = c.match(blocks)
        if n > most or (n == most and n and m.pending < best.pending):
            best, most = m, n
    return best if best.pending - least.pending <= slack else least


def cache_key(key: str) -> int:
    """`Request.cache_key` of a request's key: a 63-bit hash, the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") >> 1


class CacheKeys:
    """Each prompt cache key's machine: that of its last request (the module's docstring)."""

    def __init__(self, kept: int = KEYS_KEPT) -> None:
        self.where: dict[int, int] = {}   # key -> machine id, least recently used first
        self.kept = kept

    def pick(self, ms: list[Machine], r: Request, slack: int) -> Machine:
        """The machine of `ms` for `r`: its key's machine while that one is among `ms` and its
        pending tokens are at most the least's plus `slack`; else `pick`'s (remembered for the key).
        Without a key, or with `slack` < 0 (prefix-aware routing off), `pick`'s alone."""
        key = r.cache_key
        if key < 0 or slack < 0:
            return pick(ms, r, slack)
        mid = self.where.pop(key, -1)
        m: Machine | None = None
        if mid >= 0:
            for x in ms:
                if x.id == mid:
                    m = x
                    break
        if m is None or m.pending - least_pending(ms).pending > slack:
            m = pick(ms, r, slack)
        self.where[key] = m.id
        if len(self.where) > self.kept:
            del self.where[next(iter(self.where))]
        return m

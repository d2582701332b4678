"""Prefix-aware routing: a request goes to the machine whose cache holds its longest prompt
prefix, unless that machine's load passes the least-loaded one's by more than a slack
(RoutingConfig.prefix_slack, `--prefix-slack`, in pending tokens, the load JSQ compares), as
SGLang's cache-aware router and llm-d's prefix scorer balance reuse against load.

One rule for the simulator, whose machines' caches are modelled (sim/prefix.py), and the live
router, whose view of each worker's cache follows what it sent there and the workers' reports
(serve/cluster_state.py): both set `Machine.cache` (a policy/prefix_cache.py BlockCache) and
`Request.blocks`. A request without blocks, or machines without caches, get plain JSQ.
"""

from __future__ import annotations

from .state import Machine, Request


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

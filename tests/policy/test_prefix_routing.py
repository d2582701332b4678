"""Prefix caching as the policies see it (policy/prefix_cache.py BlockCache, policy/prefix_routing.py):
LRU order and matches by hand, and hand-computed routes."""

from splitserve.policy.prefix_cache import BlockCache, attachable
from splitserve.policy.prefix_routing import pick
from splitserve.policy.state import Machine, Pool, Request


def test_a_cache_drops_the_least_recently_freed_and_keeps_a_prefix_over_its_tails():
    c = BlockCache(3)
    c.free([1, 2])                 # freed last to first: 2, then 1 (the prefix most recent)
    assert list(c.names) == [2, 1]
    c.free([1, 2, 3, 4])           # 4, 3, 2, 1 -> order 4 3 2 1, capacity 3: 4 dropped
    assert list(c.names) == [3, 2, 1]
    assert c.match([1, 2, 3]) == 3 and c.match([1, 5, 3]) == 1 and c.match([9, 1]) == 0
    c.free([7])                    # 3 (least recent) goes
    assert list(c.names) == [2, 1, 7]
    c.drop([1, 8])
    assert list(c.names) == [2, 7] and c.match([1, 2]) == 0


def test_a_first_chunk_attaches_whole_blocks_below_its_end():
    assert attachable(5, 90, 16) == 5        # 89 // 16 = 5
    assert attachable(6, 96, 16) == 5        # a fully cached prompt computes its last block
    assert attachable(3, 33, 16) == 2 and attachable(0, 100, 16) == 0


def _machines(pending: list[int], held: list[list[int]]) -> list[Machine]:
    ms = []
    for i, (p, names) in enumerate(zip(pending, held)):
        m = Machine(i, "x", home=Pool.PROMPT, kv_capacity=10_000)
        m.pending = p
        m.cache = BlockCache(100)
        m.cache.free(names)
        ms.append(m)
    return ms


def test_routes_by_hand():
    r = Request(0, 0.0, 64, 8)
    r.blocks = [11, 12, 13, 14]
    ms = _machines([500, 100, 300], [[11, 12], [], [11, 12, 13]])
    assert pick(ms, r, 4096).id == 2          # longest prefix (3 blocks), within the slack of 100
    assert pick(ms, r, 200).id == 2           # 300 - 100 = 200: not more than the slack
    assert pick(ms, r, 199).id == 1           # more than the slack: least pending
    assert pick(ms, r, -1).id == 1            # off
    r.blocks = None
    assert pick(ms, r, 4096).id == 1          # nothing to match: least pending
    r.blocks = [11, 12, 99]
    ms[0].pending = 250                       # two machines hold 2 blocks: the less loaded of them
    assert pick(ms, r, 4096).id == 0
    r.blocks = [77]
    assert pick(ms, r, 4096).id == 1          # no machine holds any: least pending (the first such)

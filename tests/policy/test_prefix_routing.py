"""Prefix caching as the policies see it (policy/prefix_cache.py BlockCache, policy/prefix_routing.py):
LRU order and matches by hand, and hand-computed routes, prompt cache keys' too."""

from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.pools import JSQScheduler, SplitwiseScheduler
from splitserve.policy.prefix_cache import BlockCache, attachable
from splitserve.policy.prefix_routing import CacheKeys, cache_key, pick
from splitserve.policy.state import Machine, Pool, Request
from splitserve.policy.transitions import enqueue_prompt


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


def test_a_prompt_cache_key_keeps_its_prompt_worker_while_the_load_allows():
    # two prompt workers (0, 1) and a token worker (2), slack 1,000 pending tokens; A and B are keys
    ms = [Machine(0, "x", Pool.PROMPT, 10**6), Machine(1, "x", Pool.PROMPT, 10**6), Machine(2, "x", Pool.TOKEN, 10**6)]
    s = SplitwiseScheduler(ms, RoutingConfig(prefix_slack=1000))
    a, b = cache_key("conversation A"), cache_key("conversation B")

    def arrive(i: int, tokens: int, key: int) -> int:
        r = Request(i, 0.0, tokens, 4, cache_key=key)
        p, t = s.route(r)
        assert t.id == 2
        enqueue_prompt(p, r)
        return p.id

    assert arrive(0, 600, a) == 0     # A's first: JSQ, both at 0 -> the first; A -> 0 (pending 600, 0)
    assert arrive(1, 300, b) == 1     # B's first: JSQ -> 1; B -> 1 (600, 300)
    assert arrive(2, 500, a) == 0     # A: 0, though 1 is less loaded: 600 - 300 <= 1,000 (1,100, 300)
    assert arrive(3, 200, -1) == 1    # no key: JSQ (1,100, 500)
    assert arrive(4, 100, b) == 1     # B: 1 (1,100, 600)
    assert arrive(5, 400, a) == 0     # A: 1,100 - 600 = 500 <= 1,000 (1,500, 600)
    assert arrive(6, 700, a) == 0     # A: 1,500 - 600 = 900 <= 1,000 (2,200, 600)
    assert arrive(7, 100, a) == 1     # A: 2,200 - 600 = 1,600 > 1,000: the usual rule, JSQ -> 1,
                                      # and A follows it there (2,200, 700)
    assert arrive(8, 100, a) == 1     # A: now 1 (2,200, 800)
    assert arrive(9, 100, b) == 1     # B: 1 (2,200, 900)
    assert s.keys.where == {b: 1, a: 1}
    off = SplitwiseScheduler(ms[:1] + [Machine(1, "x", Pool.PROMPT, 10**6), ms[2]], RoutingConfig(prefix_slack=-1))
    assert off.route(Request(10, 0.0, 10, 4, cache_key=a))[0].id == 1 and not off.keys.where  # routing off: JSQ


def test_the_keys_kept_are_bounded_and_the_unsplit_baseline_keeps_them_too():
    keys = CacheKeys(kept=2)
    ms = _machines([0, 0], [[], []])
    for k in (1, 2, 1, 3):            # 1 used again after 2: 2 is the least recently used when 3 comes
        keys.pick(ms, Request(0, 0.0, 10, 4, cache_key=k), 100)
    assert list(keys.where) == [1, 3]
    jsq = JSQScheduler(_machines([0, 0], [[], []]), prefix_slack=100)
    jsq.machines[0].pending = 50      # a key's first request: JSQ -> 1; then 1 while within the slack
    assert [jsq.route(Request(i, 0.0, 10, 4, cache_key=7))[0].id for i in range(2)] == [1, 1]
    jsq.machines[1].pending = 151
    assert jsq.route(Request(2, 0.0, 10, 4, cache_key=7))[0].id == 0   # 151 - 50 > 100
    assert cache_key("x") == cache_key("x") != cache_key("y") and 0 <= cache_key("x") < 2**63

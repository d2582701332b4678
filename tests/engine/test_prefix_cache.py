"""Prefix caching (engine/prefix_cache.py, block_manager.py, scheduler.py): full blocks named by
the chained hash of their tokens, shared by later prompts, kept after their last reference and
evicted least recently freed first, uncached blocks taken before any cached one.

By hand: the block manager's sharing, reference counts and eviction order; the engine's
hits on a shared prefix (tokens saved in whole blocks, one prompt token always computed).
Over random request streams with shared prefixes (hypothesis): greedy tokens equal caching off,
the accounts hold after every step, a block two running sequences hold is a cached full block,
and every block comes back. The same tokens under EcoServe's scheduler and at tp 2; an aborted
sharer gives back only its own blocks; a prompt with a cached prefix hands all its K/V over."""

from __future__ import annotations

import pytest
import torch
from engine_runs import run_to_end
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.block_manager import BlockManager
from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.policy.prefix_cache import ROOT, block_hash, extend_hashes
from splitserve.engine.sampler import SamplingParams
from splitserve.policy.machine import BatchingConfig


def test_chained_names_depend_on_every_token_before():
    a = extend_hashes([], [1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(a) == 2 and a[0] == block_hash(ROOT, [1, 2, 3, 4]) and a[1] == block_hash(a[0], [5, 6, 7, 8])
    b = extend_hashes([], [0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert b[0] != a[0] and b[1] != a[1]  # same second block, different first: a different name
    assert extend_hashes(a[:1], [1, 2, 3, 4, 5, 6, 7, 8], 4) == a  # extends from where it was


def test_sharing_reference_counts_and_eviction_order_by_hand():
    bm = BlockManager(6, 4, caching=True)
    h1, h2 = 11, 22
    bm.allocate("a", 8)                        # blocks 0, 1
    assert bm.block_table("a") == [0, 1]
    bm.cache.register(0, h1)
    bm.cache.register(1, h2)
    bm.cache.register(1, 99)                         # a block has one name
    bm.free("a")                               # freed last to first: 1 then 0
    assert bm.num_free == 6 and bm.cache.num_cached == 2 and bm.cache.lookup([h1, h2, 33]) == [0, 1]
    bm.attach("b", [0, 1])
    assert [bm.ref_count(b) for b in (0, 1)] == [1, 1] and bm.num_free == 4 and bm.num_tokens("b") == 8
    bm.attach("b2", [0])                       # a second sharer of block 0
    assert bm.ref_count(0) == 2
    bm.append("b", 10)                         # grows past the shared blocks into a new one
    assert bm.block_table("b") == [0, 1, 2]
    bm.allocate("c", 12)                       # the uncached free blocks first: 3, 4, 5
    assert bm.block_table("c") == [3, 4, 5] and bm.cache.evictions == 0
    bm.free("b")                               # 2 (uncached) back; 1 cached, free; 0 still held by b2
    assert bm.ref_count(0) == 1 and bm.num_free == 2
    bm.free("b2")
    assert bm.num_free == 3 and bm.cache.lookup([h1, h2]) == [0, 1]
    bm.allocate("d", 8)                        # uncached 2, then the least recently freed cached: 1
    assert bm.block_table("d") == [2, 1] and bm.cache.evictions == 1
    assert bm.cache.lookup([h1, h2]) == [0]   # its prefix stays, its tail went
    bm.check()
    for s in ("c", "d"):
        bm.free(s)
    assert bm.num_free == 6
    bm.check()
    with pytest.raises(ValueError, match="not cached"):
        bm.attach("e", [3])


def test_nothing_is_cached_when_caching_is_off():
    bm = BlockManager(4, 4)
    bm.allocate("a", 4)
    bm.cache.register(0, 11)
    assert bm.cache.num_cached == 0 and bm.cache.lookup([11]) == []




def test_a_shared_prefix_is_computed_once():
    g = torch.Generator().manual_seed(0)
    system = [1] + torch.randint(3, 259, (40,), generator=g).tolist()          # 41 tokens: 10 full blocks of 4
    asks = [system + torch.randint(3, 259, (7,), generator=g).tolist() for _ in range(3)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    uncached = LLMEngine("tiny", EngineConfig(block_size=4, prefix_caching=False))
    off = [o.token_ids for o in run_to_end(uncached, asks, params)]
    eng = LLMEngine("tiny", EngineConfig(block_size=4))
    first = run_to_end(eng, asks[:1], params)[0]
    assert first.num_cached_tokens == 0 and eng.scheduler.prefix_hits == 0
    shapes = []
    eng.on_schedule = lambda rep: shapes.append(list(rep.chunks))
    rest = run_to_end(eng, asks[1:], params)
    # the first 40 tokens are 10 full blocks of the first request's prompt: cached; 8 computed
    assert [o.num_cached_tokens for o in rest] == [40, 40] and eng.scheduler.prefix_hits == 80
    assert shapes[0] == [(o.request_id, 48) for o in rest]  # the policy's chunks: whole prompts
    assert [first.token_ids] + [o.token_ids for o in rest] == off
    # a prompt entirely cached still computes its last token (its logits make the first output)
    eng.add_request(asks[0], params)
    outs = eng.step()
    assert eng.last_shape == [(44, 4)]  # 11 of its 12 full blocks cached: the last one computed
    while eng.has_unfinished():
        outs += eng.step()
    assert outs[-1].num_cached_tokens == 44 and outs[-1].token_ids == off[0]
    assert eng.scheduler.prefix_hits == 124
    assert eng.blocks.num_free == eng.blocks.num_blocks
    eng.blocks.check()


PREFIXES = st.lists(st.lists(st.integers(3, 258), min_size=0, max_size=30), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(prefixes=PREFIXES,
       reqs=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12), st.integers(1, 10), st.integers(0, 3)),
                     min_size=1, max_size=8),
       num_blocks=st.integers(8, 24), block_size=st.sampled_from([2, 4, 8]), chunk=st.sampled_from([0, 5, 16]),
       seed=st.integers(0, 1000))
def test_random_streams_with_shared_prefixes_equal_caching_off(prefixes, reqs, num_blocks, block_size, chunk, seed):
    """Requests arrive between steps (`wait` steps after the previous one), each a shared prefix
    and its own suffix; KV is tight, so prompts preempt and cached blocks are evicted."""
    g = torch.Generator().manual_seed(seed)
    cap = num_blocks * block_size
    work = []
    for which, suffix, max_tokens, wait in reqs:
        p = [1] + prefixes[which % len(prefixes)] + torch.randint(3, 259, (suffix,), generator=g).tolist()
        p = p[: cap - 2]
        work.append((p, SamplingParams(max_tokens=max_tokens, ignore_eos=True), wait))
    outs = {}
    for caching in (False, True):
        eng = LLMEngine("tiny", EngineConfig(num_blocks=num_blocks, block_size=block_size, prefix_caching=caching,
                                             batching=BatchingConfig(chunk_size=chunk, prompt_token_cap=32)))
        done, order = {}, []
        pending = list(work)
        while pending or eng.has_unfinished():
            if pending:
                p, params, wait = pending.pop(0)
                order.append(eng.add_request(p, params))
                steps = wait
            else:
                steps = 1
            for _ in range(steps):
                if not eng.has_unfinished():
                    break
                for out in eng.step():
                    if out.finished:
                        done[out.request_id] = out
                holders: dict[int, set] = {}
                for seq in eng.scheduler.running:
                    for b in eng.blocks.block_table(seq.request_id):
                        holders.setdefault(b, set()).add(seq.request_id)
                for b, who in holders.items():  # shared only if cached (full, written, named)
                    assert len(who) == 1 or eng.blocks.cache.is_cached(b), (b, who)
                eng.blocks.check()
        assert eng.blocks.num_free == num_blocks  # every block back (cached ones count as free)
        outs[caching] = [done[r].token_ids for r in order]
    assert outs[True] == outs[False]


def _shared_prefix_prompts(n: int, shared: int, own: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    head = [1] + torch.randint(3, 259, (shared - 1,), generator=g).tolist()
    return [head + torch.randint(3, 259, (own,), generator=g).tolist() for _ in range(n)]


def _one_by_one(eng, prompts, params):
    """Each request after the previous one's first step (so the later ones find its blocks)."""
    ids, done = [], {}
    for p in prompts:
        ids.append(eng.add_request(p, params))
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.live)])  # tp 2 starts a rank process
def test_tensor_parallel_and_ecoserve_engines_share_prefixes_losslessly(tp):
    """Rank 0 decides which blocks a prompt shares; every rank's cache holds its heads of them."""
    prompts = _shared_prefix_prompts(5, 40, 9)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    uncached = LLMEngine("tiny", EngineConfig(block_size=8, prefix_caching=False))
    want = [o.token_ids for o in _one_by_one(uncached, prompts, params)]
    for batching in (BatchingConfig(), BatchingConfig(scheduler="ecoserve", prompt_token_cap=256)):
        eng = LLMEngine("tiny", EngineConfig(block_size=8, num_blocks=64, tp=tp, batching=batching))
        try:
            outs = _one_by_one(eng, prompts, params)
            assert [o.token_ids for o in outs] == want, (tp, batching.scheduler)
            assert [o.num_cached_tokens for o in outs] == [0, 40, 40, 40, 40]
            assert eng.blocks.num_free == 64 and not eng.blocks.pools.sizes()
            eng.blocks.check()
        finally:
            eng.close()


def test_an_aborted_sharer_gives_back_only_its_own_blocks():
    eng = LLMEngine("tiny", EngineConfig(block_size=4, num_blocks=32))
    a, b = _shared_prefix_prompts(2, 24, 6)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    ra = eng.add_request(a, params)
    eng.step()
    rb = eng.add_request(b, params)
    eng.step()
    shared = eng.blocks.block_table(ra)[:6]
    assert eng.blocks.block_table(rb)[:6] == shared and all(eng.blocks.ref_count(x) == 2 for x in shared)
    eng.abort(rb)
    assert all(eng.blocks.ref_count(x) == 1 for x in shared)  # still a's
    eng.blocks.check()
    while eng.has_unfinished():
        eng.step()
    assert eng.blocks.num_free == 32
    eng.blocks.check()


@pytest.mark.parametrize("threshold", [0, 10**9], ids=["layerwise", "serialized"])
def test_a_prompt_with_a_cached_prefix_hands_its_whole_kv_over(threshold):
    """Prefill on A (whose cache holds the shared prefix), decode on B: B gets every prompt
    position's K/V, the cached ones included, and decodes what one engine alone would."""
    from splitserve.engine.kv_memory import InMemoryConnector

    prompts = _shared_prefix_prompts(3, 48, 11)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    want = [o.token_ids for o in _one_by_one(LLMEngine("tiny", EngineConfig(prefix_caching=False)), prompts, params)]
    a_conn, b_conn = InMemoryConnector(threshold=threshold), InMemoryConnector()
    a, b = LLMEngine("tiny", connector=a_conn), LLMEngine("tiny", EngineConfig(prefix_caching=False), connector=b_conn)
    got, cached = [], []
    for i, p in enumerate(prompts):
        rid = f"r{i}"
        a_conn.send_to(rid, b_conn.reserve(rid, p, params))
        a.add_request(p, params, rid, prefill_only=True)
        while a.has_unfinished():
            cached += [o.num_cached_tokens for o in a.step()]
        while b.has_unfinished():
            got += [o.token_ids for o in b.step() if o.finished]
    assert cached == [0, 48, 48] and got == want
    mode = "layerwise" if threshold == 0 else "serialized"
    assert [e for e in b_conn.events if e[0] != "kv_in"] == [] and {e[2] for e in b_conn.events} == {mode}


@pytest.mark.parametrize("threshold", [0, 10**9], ids=["layerwise", "serialized"])
def test_the_token_side_takes_a_conversations_earlier_turn_from_its_own_cache(threshold):
    """Turn 1 (40 prompt tokens, 10 out) is prefilled on A and decoded on B; B computed its
    positions 0..48, so 3 full blocks (48 tokens) are in B's cache. Turn 2's prompt is turn 1's
    prompt, its answer and 12 new tokens (62): B's reservation takes those 48 tokens' blocks from
    its cache and only positions 48.. are handed over; both turns decode as one engine alone."""
    from splitserve.engine.kv_memory import InMemoryConnector

    g = torch.Generator().manual_seed(3)
    turn1 = [1] + torch.randint(3, 259, (39,), generator=g).tolist()
    ask = torch.randint(3, 259, (12,), generator=g).tolist()
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    alone = LLMEngine("tiny", EngineConfig(prefix_caching=False))
    answer1 = alone.generate([turn1], [params])[0].token_ids
    turn2 = turn1 + answer1 + ask
    want2 = alone.generate([turn2], [params])[0].token_ids
    a_conn, b_conn = InMemoryConnector(threshold=threshold), InMemoryConnector()
    a, b = LLMEngine("tiny", connector=a_conn), LLMEngine("tiny", connector=b_conn)
    got, skipped = [], []
    for rid, p in (("t1", turn1), ("t2", turn2)):
        a_conn.send_to(rid, b_conn.reserve(rid, p, params))
        skipped.append(b.kv_host.kv_cached(rid))
        a.add_request(p, params, rid, prefill_only=True)
        while a.has_unfinished():
            a.step()
        while b.has_unfinished():
            got += [o.token_ids for o in b.step() if o.finished]
    assert skipped == [0, 48] and got == [answer1, want2]
    assert all(e[0] == "kv_in" for e in b_conn.events)
    for eng in (a, b):
        eng.blocks.check()
        assert eng.blocks.num_free == eng.blocks.num_blocks

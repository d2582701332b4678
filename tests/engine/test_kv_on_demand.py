"""The engine allocating KV on demand (policy/kv_allocation.py through engine/scheduler.py): the
hand-computed schedule of tests/policy/test_kv_allocation.py, run on real sequences and blocks;
on random workloads under memory pressure, greedy tokens equal to runs without it, every block
back, no block freed while referenced, and the view holding exactly the blocks the engine holds."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

import pytest

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.kv_cache import KVExport
from splitserve.engine.sampler import SamplingParams
from splitserve.engine.scheduler import NoRoom
from splitserve.policy.machine import BatchingConfig

from test_scheduler import alone, ids, record, run

ON_DEMAND = BatchingConfig(kv_allocation="on-demand", kv_watermark=0.0)


def test_the_hand_computed_schedule_runs_on_real_blocks():
    """Three 6-token prompts, 10 tokens each, 6 blocks of 4 (tests/policy/test_kv_allocation.py
    computes it by hand): all prefill at once; at token 4 C goes so that A and B grow, at token 8 B
    goes for A; B recomputes when A is done. Every token is the one a run alone makes."""
    eng = LLMEngine("tiny", EngineConfig(num_blocks=6, block_size=4, batching=ON_DEMAND, prefix_caching=False))
    steps = record(eng)
    prompts = {name: ids(6, i) for i, name in enumerate("ABC")}
    for name, p in prompts.items():
        eng.add_request(p, SamplingParams(max_tokens=10, ignore_eos=True), name)
    out = run(eng)
    work = [sorted(r for r, _ in s) for s, _ in steps]
    assert work[:11] == [["A", "B", "C"], ["A", "B", "C"], ["A", "B", "C"], ["A", "B"], ["A", "B"], ["A", "B"],
                         ["A", "B"], ["A"], ["A"], ["A"], ["B"]]
    assert [p for _, p in steps[:11]] == [[], [], [], ["C"], [], [], [], ["B"], [], [], []]
    assert steps[10][0] == [("B", 13)]                        # B recomputes 6 + 7 tokens
    assert out == {name: alone(p, 10) for name, p in prompts.items()}
    assert eng.blocks.num_free == 6 and eng.scheduler.m.kv_used == 0


def test_a_chat_request_without_max_tokens_holds_its_prompt_not_the_context():
    """The issue's case: on demand, a request that may run to the end of the context holds the
    blocks of what it has: on a cache of one context (tiny's 512 tokens, 32 blocks), 8 such
    requests of 50 prompt tokens run at once where reserve runs one (without preemption: under
    the splitwise rules each new prompt would preempt it in turn)."""
    running = {}
    for alloc in ("reserve", "on-demand"):
        eng = LLMEngine("tiny", EngineConfig(num_blocks=32, block_size=16,
                                             batching=BatchingConfig(kv_allocation=alloc, preemption_limit=0),
                                             prefix_caching=False))
        for i in range(8):
            eng.add_request(ids(50, i), SamplingParams(max_tokens=512 - 50, ignore_eos=True), str(i))
        eng.step()                                             # the prefills
        eng.step()                                             # the first decode step
        running[alloc] = len(eng.scheduler.m.running)
    assert running == {"reserve": 1, "on-demand": 8}


def test_a_reservation_that_does_not_fit_now_says_so():
    """A token engine's reservation beyond its free blocks raises NoRoom (the router lets the
    request wait); one that fits takes the prompt's and the first token's blocks only."""
    eng = LLMEngine("tiny", EngineConfig(num_blocks=4, block_size=16, batching=ON_DEMAND))
    eng.kv_host.reserve_kv(ids(30, 1), SamplingParams(max_tokens=200, ignore_eos=True), "a")
    assert eng.scheduler.m.kv_used == 32                      # kv_round(30 + 1), not 230
    eng.kv_host.reserve_kv(ids(20, 2), SamplingParams(max_tokens=200, ignore_eos=True), "b")
    try:
        eng.kv_host.reserve_kv(ids(20, 3), SamplingParams(max_tokens=5, ignore_eos=True), "c")
    except NoRoom as e:
        assert "no room" in str(e)
    else:
        raise AssertionError("a reservation of 32 tokens into 0 free was taken")


@st.composite
def pressure(draw):
    bs = draw(st.sampled_from([1, 4, 16]))
    num_blocks = draw(st.integers(4, 24))
    cap = num_blocks * bs
    reqs = []
    for i in range(draw(st.integers(2, 10))):
        p = draw(st.integers(1, max(1, cap // 3)))
        o = draw(st.integers(1, max(1, min(48, cap - p))))
        reqs.append((p, o, draw(st.integers(0, 4)), draw(st.sampled_from([False, False, False, True]))))
    cfg = BatchingConfig(kv_allocation="on-demand", kv_watermark=draw(st.sampled_from([0.0, 0.1])),
                         scheduler=draw(st.sampled_from(["splitwise", "vllm", "sarathi", "lightllm"])),
                         preemption_limit=draw(st.integers(0, 3)))
    return bs, num_blocks, reqs, cfg, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(pressure())
def test_under_pressure_tokens_are_unchanged_and_every_block_comes_back(w):
    bs, num_blocks, reqs, cfg, caching = w
    eng = LLMEngine("tiny", EngineConfig(num_blocks=num_blocks, block_size=bs, batching=cfg, prefix_caching=caching))
    m = eng.scheduler.m
    want, done, todo = {}, {}, list(enumerate(reqs))
    while todo or eng.has_unfinished():
        while todo and todo[0][1][2] <= 0:
            i, (p, o, _, iso) = todo.pop(0)
            prompt = ids(p, i % 3)                             # shared prefixes when caching
            rid = eng.add_request(prompt, SamplingParams(max_tokens=o, ignore_eos=True), str(i), isolated=iso)
            want[rid] = alone(prompt, o)
        todo = [(i, (p, o, k - 1, iso)) for i, (p, o, k, iso) in todo]
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        held = eng.blocks.num_blocks - eng.blocks.num_free
        assert held * bs <= m.kv_used <= m.kv_capacity         # the view holds what the engine allocated
        if not caching and not cfg.chunk_size:                 # nothing shared, prefills whole: exactly
            assert held * bs == m.kv_used
        assert m.pending == m.recount_pending() >= 0
        eng.blocks.check()                                      # reference counts: none freed while held
    assert done == want
    assert m.kv_used == 0 and eng.blocks.num_free == num_blocks
    event(f"decodes preempted: {eng.scheduler.num_preemptions > 0}")


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=15, ignore_eos=True),
    SamplingParams(max_tokens=15, ignore_eos=True, temperature=0.9, top_p=0.9, seed=7),
    SamplingParams(max_tokens=15, ignore_eos=True, temperature=0.8, seed=3, frequency_penalty=0.5,
                   presence_penalty=0.3, repetition_penalty=1.2),
], ids=["greedy", "seeded", "seeded-penalties"])
def test_a_decode_resumed_through_the_prompt_pool_makes_the_tokens_it_would_have(params):
    """`--recompute prompt-pool`: a request preempted after 6 tokens is prefilled anew on another
    engine with its prompt and those 6 (`resumed`: they are its outputs, for the penalties and
    the seeds), which ships the KV of all of them and makes token 7; a third engine decodes the
    rest: the same 15 tokens as a run alone."""
    prompt = ids(20, 4)
    alone_tokens = LLMEngine("tiny").generate([prompt], params)[0].token_ids
    g = 6
    a, b = LLMEngine("tiny", EngineConfig(seed=11)), LLMEngine("tiny", EngineConfig(seed=22))
    first = a.prefill_only(prompt + alone_tokens[:g], params, resumed=g)
    assert first.token == alone_tokens[g] and first.kv.num_tokens == len(prompt) + g
    wire = KVExport.from_bytes(first.kv.metadata(), first.kv.to_bytes())
    rid = b.kv_host.add_request_with_kv(prompt + alone_tokens[:g], first.token, wire, params, resumed=g)
    out = None
    while b.has_unfinished():
        for o in b.step():
            out = o
    assert out.request_id == rid and out.token_ids == alone_tokens
    assert a.blocks.num_free == a.blocks.num_blocks and b.blocks.num_free == b.blocks.num_blocks


def test_a_decode_preempted_in_the_step_it_joins_leaves_for_the_prompt_pool():
    """4 blocks of 4: A (6 + 10 tokens, here: the whole cache at its end) holds 2 after 3 steps; B's KV arrives (6 tokens and
    its first: 2 blocks, the last free). In the next step A's 9th token needs a third block: B, the
    last to join, is preempted in the step it joins and, its prompt having run elsewhere under
    --recompute prompt-pool, leaves (the report names it joined, preempted and left, as the
    router's view replays form_batch); A decodes on to the tokens it makes alone."""
    cfg = BatchingConfig(kv_allocation="on-demand", kv_watermark=0.0, recompute="prompt-pool")
    eng = LLMEngine("tiny", EngineConfig(num_blocks=4, block_size=4, batching=cfg, prefix_caching=False))
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    pa, pb = ids(6, 1), ids(6, 2)
    eng.add_request(pa, params, "A")
    for _ in range(3):
        eng.step()
    first = LLMEngine("tiny", EngineConfig(prefix_caching=False)).prefill_only(pb, params)
    eng.kv_host.add_request_with_kv(pb, first.token, first.kv, params, "B")
    assert eng.blocks.num_free == 0
    eng.step()
    rep = eng.scheduler.report
    assert (rep.joined, rep.preempted, rep.left, rep.decoding) == (["B"], ["B"], ["B"], ["A"])
    out = run(eng)
    assert out["A"] == alone(pa, 10) and "B" not in out
    assert eng.blocks.num_free == 4 and eng.scheduler.m.kv_used == 0

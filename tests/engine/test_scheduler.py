"""The engine batches by the simulator's machine-level policy (engine/scheduler.py runs form_batch
on its view of itself): hand-computed schedules, unchanged tokens, and on random workloads a view
that always covers the blocks the engine really holds."""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.engine import EngineConfig, LLMEngine
from splitserve.engine.sampler import SamplingParams
from splitserve.policy.machine import BatchingConfig


def record(eng: LLMEngine) -> list[tuple[list[tuple[str, int]], list[str]]]:
    """Every step's work as [(request id, new tokens)] (decodes, then prompt chunks) and the
    decodes it preempted, from the scheduler's report of the step."""
    steps = []
    real = eng.step

    def step():
        out = real()
        rep = eng.scheduler.report
        if rep.decoding or rep.chunks:
            steps.append(([(r, 1) for r in rep.decoding] + list(rep.chunks), list(rep.preempted)))
        return out
    eng.step = step
    return steps


def ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, 259, (n - 1,), generator=g).tolist()


@functools.cache
def reference_engine() -> LLMEngine:
    """One engine for every `alone` run: without a prefix cache each prompt is computed from
    scratch, as on a new engine (building one per call was a third of the view test's time)."""
    return LLMEngine("tiny", EngineConfig(prefix_caching=False))


def alone(prompt: list[int], max_tokens: int) -> list[int]:
    return reference_engine().generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0].token_ids


def run(eng: LLMEngine, until_steps: int | None = None) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    while eng.has_unfinished() and (until_steps is None or until_steps > 0):
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o.token_ids
        if until_steps is not None:
            until_steps -= 1
    return done


# ---- hand-computed schedules on a 8-block cache (16 tokens a block) --------------------------------
def test_prompt_preempts_the_youngest_decode_which_is_recomputed_next():
    eng = LLMEngine("tiny", EngineConfig(num_blocks=8, block_size=16, batching=BatchingConfig(preemption_limit=1)))
    steps = record(eng)
    pa, pb, pc = ids(20, 1), ids(20, 2), ids(10, 3)
    eng.add_request(pa, SamplingParams(max_tokens=40, ignore_eos=True), "A")   # reserves 60 -> 4 blocks
    eng.add_request(pb, SamplingParams(max_tokens=40, ignore_eos=True), "B")   # 4 blocks: cache full
    run(eng, until_steps=2)
    eng.add_request(pc, SamplingParams(max_tokens=1, ignore_eos=True), "C")    # needs 1 block
    out = run(eng)
    assert steps[0] == ([("A", 20), ("B", 20)], [])
    assert steps[1] == ([("A", 1), ("B", 1)], [])
    # C has priority: B (younger than A) is preempted; A keeps decoding beside C's prefill
    assert steps[2] == ([("A", 1), ("C", 10)], ["B"])
    # C finished at its first token and freed its block: B recomputes its 20 + 2 tokens
    assert steps[3] == ([("A", 1), ("B", 22)], [])
    assert all(not p and all(n == 1 for _, n in s) for s, p in steps[4:])    # decodes to the end
    assert out == {"A": alone(pa, 40), "B": alone(pb, 40), "C": alone(pc, 1)}
    assert eng.blocks.num_free == 8


def test_no_decode_is_preempted_past_the_limit_so_the_prompt_waits():
    eng = LLMEngine("tiny", EngineConfig(num_blocks=8, block_size=16, batching=BatchingConfig(preemption_limit=0)))
    steps = record(eng)
    eng.add_request(ids(20, 1), SamplingParams(max_tokens=40, ignore_eos=True), "A")
    eng.add_request(ids(20, 2), SamplingParams(max_tokens=30, ignore_eos=True), "B")  # 50 -> 4 blocks
    run(eng, until_steps=2)
    eng.add_request(ids(10, 3), SamplingParams(max_tokens=4, ignore_eos=True), "C")
    run(eng)
    assert not any(p for _, p in steps)
    first_c = next(i for i, (s, _) in enumerate(steps) if ("C", 10) in s)
    last_b = max(i for i, (s, _) in enumerate(steps) if any(r == "B" for r, _ in s))
    assert first_c == last_b + 1 == 30        # B's 30th token at step 30 frees its 4 blocks
    assert eng.blocks.num_free == 8


def test_prompt_cap_counts_prompt_tokens_only_and_a_long_prompt_runs_alone():
    eng = LLMEngine("tiny", EngineConfig(batching=BatchingConfig(prompt_token_cap=64)))
    steps = record(eng)
    eng.add_request(ids(5, 9), SamplingParams(max_tokens=20, ignore_eos=True), "D")
    run(eng, until_steps=1)                                                # D decodes from now on
    for name, n in (("P0", 30), ("P1", 25), ("P2", 20), ("P3", 100)):
        eng.add_request(ids(n, n), SamplingParams(max_tokens=2, ignore_eos=True), name)
    run(eng, until_steps=3)
    batches = [[(r, n) for r, n in s if n > 1] for s, _ in steps[1:4]]
    # 30 + 25 = 55 <= 64 (D's decode token not counted); + 20 would be 75; 100 > 64 runs alone
    assert batches == [[("P0", 30), ("P1", 25)], [("P2", 20)], [("P3", 100)]]
    assert all(("D", 1) in s for s, _ in steps[1:4])


def test_under_kv_pressure_tokens_are_unchanged_and_the_limit_holds():
    cfg = BatchingConfig(preemption_limit=2)
    eng = LLMEngine("tiny", EngineConfig(num_blocks=12, block_size=16, batching=cfg))
    steps = record(eng)
    prompts = [ids(n, i) for i, n in enumerate([1, 5, 17, 33, 64, 3, 120])]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    rids, out = [], {}
    for p in prompts:                               # staggered: new prompts meet running decodes
        rids.append(eng.add_request(p, params))
        out |= run(eng, until_steps=2)
    out |= run(eng)
    assert [out[r] for r in rids] == [alone(p, 12) for p in prompts]
    preempted = [r for _, p in steps for r in p]
    assert preempted, "the cache is small enough that prompts must preempt decodes"
    assert max(preempted.count(r) for r in set(preempted)) <= cfg.preemption_limit
    assert eng.blocks.num_free == 12


# ---- the policy's view always covers what the engine holds ------------------------------------------
@st.composite
def workloads(draw):
    bs = draw(st.sampled_from([1, 4, 16]))
    num_blocks = draw(st.integers(6, 40))
    cap = num_blocks * bs
    reqs = []
    for i in range(draw(st.integers(1, 8))):
        p = draw(st.integers(1, max(1, cap // 2)))
        o = draw(st.integers(1, max(1, min(40, cap - p))))
        reqs.append((p, o, draw(st.integers(0, 3)), draw(st.booleans())))  # arrives after k steps; isolated
    cfg = BatchingConfig(prompt_token_cap=draw(st.sampled_from([16, 64, 2048])),
                         chunk_size=draw(st.sampled_from([0, 0, 24])),
                         preemption_limit=draw(st.integers(0, 3)), max_seqs=draw(st.sampled_from([0, 2])),
                         kv_allocation=draw(st.sampled_from(["reserve", "on-demand"])),
                         kv_watermark=draw(st.sampled_from([0.0, 0.05])))
    return bs, num_blocks, reqs, cfg


@settings(max_examples=100, deadline=None)
@given(workloads())
def test_the_view_covers_every_block_and_tokens_are_unchanged(w):
    bs, num_blocks, reqs, cfg = w
    eng = LLMEngine("tiny", EngineConfig(num_blocks=num_blocks, block_size=bs, batching=cfg))
    m = eng.scheduler.m
    want, done, todo = {}, {}, list(enumerate(reqs))
    while todo or eng.has_unfinished():
        while todo and todo[0][1][2] <= 0:
            i, (p, o, _, iso) = todo.pop(0)
            prompt = ids(p, i)
            rid = eng.add_request(prompt, SamplingParams(max_tokens=o, ignore_eos=True), str(i), isolated=iso)
            want[rid] = alone(prompt, o)
        todo = [(i, (p, o, k - 1, iso)) for i, (p, o, k, iso) in todo]
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        held = eng.blocks.num_blocks - eng.blocks.num_free
        assert held * bs <= m.kv_used <= m.kv_capacity          # reserved (or taken on demand) covers allocated
        assert m.pending == m.recount_pending() >= 0
        eng.blocks.check()
    assert done == want
    assert m.kv_used == 0 and eng.blocks.num_free == num_blocks and m.isolated == 0

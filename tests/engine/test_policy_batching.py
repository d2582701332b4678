"""The machine-level policy running the live engine (engine/policy_batching.py): the same
decisions as the simulator's form_batch, hand-computed schedules, and unchanged tokens."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.block_manager import BlockManager
from splitserve.engine.engine import LLMEngine
from splitserve.engine.policy_batching import PolicySelect
from splitserve.engine.sampler import SamplingParams
from splitserve.engine.scheduler import BatchLimits
from splitserve.engine.sequence import Sequence, Status
from splitserve.policy.machine import BatchingConfig, enqueue_prompt, form_batch
from splitserve.policy.state import Machine, Phase, Pool, Request


class Recording(PolicySelect):
    """PolicySelect that keeps every step's decision: [(request id, new tokens)], [preempted]."""

    def __init__(self, cfg: BatchingConfig) -> None:
        super().__init__(cfg)
        self.steps: list[tuple[list[tuple[str, int]], list[str]]] = []

    def __call__(self, running, waiting, limits, blocks):
        sel = super().__call__(running, waiting, limits, blocks)
        self.steps.append(([(s.request_id, n) for s, n in sel.scheduled],
                           [s.request_id for s in sel.preempt]))
        return sel


def ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, 259, (n - 1,), generator=g).tolist()


def alone(prompt: list[int], max_tokens: int) -> list[int]:
    return LLMEngine("tiny").generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0].token_ids


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
    sel = Recording(BatchingConfig(preemption_limit=1))
    eng = LLMEngine("tiny", num_blocks=8, block_size=16, select=sel)
    pa, pb, pc = ids(20, 1), ids(20, 2), ids(10, 3)
    eng.add_request(pa, SamplingParams(max_tokens=40, ignore_eos=True), "A")   # reserves 60 -> 4 blocks
    eng.add_request(pb, SamplingParams(max_tokens=40, ignore_eos=True), "B")   # 4 blocks: cache full
    run(eng, until_steps=2)
    eng.add_request(pc, SamplingParams(max_tokens=1, ignore_eos=True), "C")    # needs 1 block
    out = run(eng)
    steps = sel.steps
    assert steps[0] == ([("A", 20), ("B", 20)], [])
    assert steps[1] == ([("A", 1), ("B", 1)], [])
    # C has priority: B (younger than A) is preempted; A keeps decoding beside C's prefill
    assert steps[2] == ([("A", 1), ("C", 10)], ["B"])
    # C finished at its first token and freed its block: B recomputes its 20 + 2 tokens
    assert steps[3] == ([("A", 1), ("B", 22)], [])
    assert all(not p and all(n == 1 for _, n in s) for s, p in steps[4:])    # decodes to the end
    assert out == {"A": alone(pa, 40), "B": alone(pb, 40), "C": alone(pc, 1)}
    assert eng.blocks.num_free == 8 and sel.forced == 0


def test_no_decode_is_preempted_past_the_limit_so_the_prompt_waits():
    sel = Recording(BatchingConfig(preemption_limit=0))
    eng = LLMEngine("tiny", num_blocks=8, block_size=16, select=sel)
    eng.add_request(ids(20, 1), SamplingParams(max_tokens=40, ignore_eos=True), "A")
    eng.add_request(ids(20, 2), SamplingParams(max_tokens=30, ignore_eos=True), "B")  # 50 -> 4 blocks
    run(eng, until_steps=2)
    eng.add_request(ids(10, 3), SamplingParams(max_tokens=4, ignore_eos=True), "C")
    run(eng)
    assert not any(p for _, p in sel.steps)
    first_c = next(i for i, (s, _) in enumerate(sel.steps) if ("C", 10) in s)
    last_b = max(i for i, (s, _) in enumerate(sel.steps) if any(r == "B" for r, _ in s))
    assert first_c == last_b + 1 == 30        # B's 30th token at step 30 frees its 4 blocks
    assert eng.blocks.num_free == 8


def test_prompt_cap_counts_prompt_tokens_only_and_a_long_prompt_runs_alone():
    sel = Recording(BatchingConfig(prompt_token_cap=64))
    eng = LLMEngine("tiny", select=sel)
    eng.add_request(ids(5, 9), SamplingParams(max_tokens=20, ignore_eos=True), "D")
    run(eng, until_steps=1)                                                # D decodes from now on
    for name, n in (("P0", 30), ("P1", 25), ("P2", 20), ("P3", 100)):
        eng.add_request(ids(n, n), SamplingParams(max_tokens=2, ignore_eos=True), name)
    run(eng, until_steps=3)
    batches = [[(r, n) for r, n in s if n > 1] for s, _ in sel.steps[1:4]]
    # 30 + 25 = 55 <= 64 (D's decode token not counted); + 20 would be 75; 100 > 64 runs alone
    assert batches == [[("P0", 30), ("P1", 25)], [("P2", 20)], [("P3", 100)]]
    assert all(("D", 1) in s for s, _ in sel.steps[1:4])


def test_under_kv_pressure_tokens_are_unchanged_and_the_limit_holds():
    cfg = BatchingConfig(preemption_limit=2)
    sel = Recording(cfg)
    eng = LLMEngine("tiny", num_blocks=12, block_size=16, select=sel)
    prompts = [ids(n, i) for i, n in enumerate([1, 5, 17, 33, 64, 3, 120])]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    rids, out = [], {}
    for p in prompts:                               # staggered: new prompts meet running decodes
        rids.append(eng.add_request(p, params))
        out |= run(eng, until_steps=2)
    out |= run(eng)
    assert [out[r] for r in rids] == [alone(p, 12) for p in prompts]
    preempted = [r for _, p in sel.steps for r in p]
    assert preempted, "the cache is small enough that prompts must preempt decodes"
    assert max(preempted.count(r) for r in set(preempted)) <= cfg.preemption_limit
    assert sel.forced == 0 and eng.blocks.num_free == 12


# ---- the same decisions as the simulator's form_batch, on random machine states -------------------
@st.composite
def machine_states(draw):
    bs = draw(st.sampled_from([1, 4, 16]))
    num_blocks = draw(st.integers(4, 60))
    running = []
    used = 0
    for _ in range(draw(st.integers(0, 6))):
        p, o = draw(st.integers(1, 40)), draw(st.integers(2, 40))
        g = draw(st.integers(1, o - 1))
        need = -(-(p + o) // bs)
        if used + need > num_blocks:
            break
        used += need
        running.append((p, o, g, draw(st.integers(0, 3))))
    waiting = [(draw(st.integers(1, 60)), draw(st.integers(1, 40)), draw(st.integers(0, 3)))
               for _ in range(draw(st.integers(0, 6)))]
    cfg = BatchingConfig(prompt_token_cap=draw(st.sampled_from([16, 64, 2048])),
                         chunk_size=draw(st.sampled_from([0, 0, 24])),
                         preemption_limit=draw(st.integers(0, 3)))
    return bs, num_blocks, running, waiting, cfg


@settings(max_examples=300, deadline=None)
@given(machine_states())
def test_engine_selection_equals_form_batch(state):
    bs, num_blocks, running, waiting, cfg = state
    m = Machine(0, "x", Pool.MIXED, kv_capacity=num_blocks * bs, kv_block=bs)
    blocks = BlockManager(num_blocks, bs)
    seqs_running, seqs_waiting = [], []
    arrival = 0
    for p, o, g, pre in running:                    # decoding: g tokens out, KV for p + g - 1 positions
        r = Request(arrival, float(arrival), p, o, generated=g, preemptions=pre, phase=Phase.DECODE,
                    prompt_machine=0, token_machine=0)
        m.running.append(r)
        m.kv_used += m.kv_round(p + o)
        s = Sequence(str(arrival), [1] * p, SamplingParams(max_tokens=o), arrival, 10**6,
                     output_ids=[1] * g, num_computed=p + g - 1, status=Status.RUNNING, preemptions=pre)
        blocks.allocate(s.request_id, p + g - 1)
        seqs_running.append(s)
        arrival += 1
    for p, o, pre in waiting:                       # new (pre == 0) or preempted: recompute p + g
        g = min(pre, o - 1)
        r = Request(arrival, float(arrival), p, o, generated=g, preemptions=pre, prompt_machine=0,
                    token_machine=0)
        enqueue_prompt(m, r)
        seqs_waiting.append(Sequence(str(arrival), [1] * p, SamplingParams(max_tokens=o), arrival, 10**6,
                                     output_ids=[1] * g, preemptions=pre))
        arrival += 1
    batch = form_batch(m, cfg)
    select = PolicySelect(cfg)
    sel = select(seqs_running, seqs_waiting, BatchLimits(max_num_seqs=10**6), blocks)
    if batch is None:
        assert sel.scheduled == [] and sel.preempt == []
        return
    prompts = [(s.request_id, n) for s, n in sel.scheduled if s.status is Status.WAITING]
    decodes = sorted(s.request_id for s, n in sel.scheduled if s.status is Status.RUNNING)
    assert prompts == [(str(r.id), n) for r, n in zip(batch.prompts, batch.chunks)]
    assert [s.request_id for s in sel.preempt] == [str(r.id) for r in batch.preempted]
    assert decodes == sorted(str(r.id) for r in m.running if r not in batch.prompts)
    assert select.forced == 0

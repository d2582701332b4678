"""The named machine-level schedulers (policy/schedulers/), each on a schedule computed by hand:
a small machine, a few requests, form_batch / finish_iteration step by step, and the exact
iterations asserted (who prefills how many tokens, who decodes, who is preempted). Then, for every
scheduler, random request streams: everyone finishes, and KV never exceeds the capacity."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.errors import UserError
from splitserve.policy.config import make_policy
from splitserve.policy.kv_allocation import configure, decode_reservation
from splitserve.policy.machine import BatchingConfig, finish_iteration
from splitserve.policy.schedulers import SCHEDULERS, form_batch
from splitserve.policy.schedulers.lightllm import peak_kv
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.transitions import enqueue_prompt, join_decode, reserve_decode

NAMES = "ABCDEFGH"


def machine(cap: int, pool: Pool = Pool.MIXED, block: int = 1, stages: int = 1) -> Machine:
    return Machine(id=0, hardware="x", home=pool, kv_capacity=cap, kv_block=block, stages=stages)


def req(i: int, prompt: int, out: int) -> Request:
    """Request NAMES[i], arriving at time i, prefilled and decoded on machine 0."""
    r = Request(i, float(i), prompt, out)
    r.token_machine = 0
    return r


def step(b) -> tuple[dict[str, int], str, str]:
    """An iteration as ({prefilling: tokens}, decoding, preempted)."""
    return ({NAMES[r.id]: n for r, n in zip(b.prompts, b.chunks)}, "".join(NAMES[r.id] for r in b.decoding),
            "".join(NAMES[r.id] for r in b.preempted))


def drive(m: Machine, cfg: BatchingConfig, arrivals: dict[int, list[Request]]) -> list:
    """Iterations 0, 1, ... until nothing is left: the requests of arrivals[i] join the prompt
    queue before iteration i is formed; an iteration with nothing to run is None."""
    out: list = []
    rs = [r for a in arrivals.values() for r in a]
    while len(out) < 200:
        for r in arrivals.get(len(out), []):
            enqueue_prompt(m, r)
        b = form_batch(m, cfg)
        if b is None:
            if all(k <= len(out) for k in arrivals):
                break
            out.append(None)
            continue
        out.append(step(b))
        assert m.kv_used <= m.kv_capacity
        finish_iteration(m, b)
        assert m.pending == m.recount_pending()
    assert all(r.phase is Phase.DONE for r in rs) and m.kv_used == 0
    return out


def decodes(names: str, times: int) -> list:
    return [({}, names, "")] * times


# ---- two request mixes used by several schedulers ----------------------------------------------
def mix_s():
    """A (20 prompt, 4 out), B (30, 3) at iteration 0; C (40, 2) at 1. 100 tokens of KV: all fit."""
    return {0: [req(0, 20, 4), req(1, 30, 3)], 1: [req(2, 40, 2)]}


def mix_p():
    """A (30, 10), B (30, 10) at iteration 0 hold 80 of 100 tokens; C (40, 1) at 2 needs 41."""
    return {0: [req(0, 30, 10), req(1, 30, 10)], 2: [req(2, 40, 1)]}


CAP64 = dict(prompt_token_cap=64)


# ---- splitwise -----------------------------------------------------------------------------------
def test_splitwise_mixes_prompts_into_the_decode_batch():
    got = drive(machine(100), BatchingConfig(**CAP64), mix_s())
    # 0: A 20 + B 30 = 50 <= 64 prefill (KV 24 + 33). 1: C (42 KV, 99 of 100) prefills beside the
    # decodes of A, B. 2: all decode: B (3 tokens) and C (2) make their last. 3: A its 4th.
    assert got == [({"A": 20, "B": 30}, "", ""), ({"C": 40}, "AB", ""), ({}, "ABC", ""), ({}, "A", "")]


def test_splitwise_prompt_preempts_the_youngest_decode():
    got = drive(machine(100), BatchingConfig(**CAP64), mix_p())
    # 0: A, B prefill (80 KV). 1: both decode (2 tokens each). 2: C needs 41, 20 free: B (younger,
    # 40 KV) is preempted; C prefills beside A's decode (A: 3) and is done at its first token.
    # 3: B recomputes 30 + 2 = 32 tokens (its 3rd token) beside A (4). 4-9: A 5..10, B 4..9. 10: B 10.
    assert got == ([({"A": 30, "B": 30}, "", ""), ({}, "AB", ""), ({"C": 40}, "A", "B"), ({"B": 32}, "A", "")]
                   + decodes("AB", 6) + decodes("B", 1))


# ---- vllm ----------------------------------------------------------------------------------------
def test_vllm_runs_prefills_alone_then_decodes():
    got = drive(machine(100), BatchingConfig(scheduler="vllm", **CAP64), mix_s())
    # 0: A, B prefill. 1: C can start, so only C prefills (A, B wait). 2: no prompt: all decode,
    # C's last (2). 3: A 3, B 3 (last). 4: A 4.
    assert got == [({"A": 20, "B": 30}, "", ""), ({"C": 40}, "", ""), ({}, "ABC", ""), ({}, "AB", ""),
                   ({}, "A", "")]


def test_vllm_prefill_preempts_and_the_victim_recomputes_in_a_prefill_iteration():
    got = drive(machine(100), BatchingConfig(scheduler="vllm", **CAP64), mix_p())
    # 0: A, B prefill (80 KV). 1: decode A, B (2 each). 2: C needs 41, 20 free: B preempted, C alone
    # (done at its first token, 41 freed). 3: B recomputes 32 tokens alone (its 3rd). 4-10: A 3..9,
    # B 4..10. 11: A 10.
    assert got == ([({"A": 30, "B": 30}, "", ""), ({}, "AB", ""), ({"C": 40}, "", "B"), ({"B": 32}, "", "")]
                   + decodes("AB", 7) + decodes("A", 1))


def test_vllm_token_cap_and_seats_bound_a_prefill_iteration():
    rs = {0: [req(0, 30, 2), req(1, 30, 2), req(2, 30, 2)]}
    got = drive(machine(1000), BatchingConfig(scheduler="vllm", prompt_token_cap=64, max_seqs=3), rs)
    # 0: A + B = 60 <= 64, C would make 90. 1: C prefills alone (the decodes wait). 2: all decode.
    assert got == [({"A": 30, "B": 30}, "", ""), ({"C": 30}, "", ""), ({}, "ABC", "")]
    rs = {0: [req(0, 30, 2), req(1, 30, 2), req(2, 30, 2)]}
    got = drive(machine(1000), BatchingConfig(scheduler="vllm", prompt_token_cap=100, max_seqs=2), rs)
    # two seats: A, B; C waits for one: 1: A, B decode and finish; 2: C.
    assert got == [({"A": 30, "B": 30}, "", ""), ({}, "AB", ""), ({"C": 30}, "", ""), ({}, "C", "")]


# ---- orca ----------------------------------------------------------------------------------------
def test_orca_reserves_max_len_per_request_and_batches_prompts_with_decodes():
    rs = {0: [req(0, 10, 5), req(1, 10, 5), req(2, 10, 5)], 6: [req(3, 10, 2)]}
    got = drive(machine(100), BatchingConfig(scheduler="orca", max_len=40), rs)
    # Each request reserves 40 of 100 tokens: A, B start (80), C would make 120. 1-4: A, B decode to
    # their 5th token. 5: C. 6: D (40 + 40 <= 100) prefills beside C's decode (selective batching).
    # 7: C, D decode (D's last). 8, 9: C to its 5th.
    assert got == ([({"A": 10, "B": 10}, "", "")] + decodes("AB", 4)
                   + [({"C": 10}, "", ""), ({"D": 10}, "C", ""), ({}, "CD", "")] + decodes("C", 2))
    rs = {0: [req(0, 10, 5), req(1, 10, 5), req(2, 10, 5)]}
    got = drive(machine(100), BatchingConfig(scheduler="orca"), rs)
    # max_len 0: each reserves its own 15: all three start together
    assert got == [({"A": 10, "B": 10, "C": 10}, "", "")] + decodes("ABC", 4)


def test_orca_never_preempts_the_prompt_waits_for_memory():
    got = drive(machine(100), BatchingConfig(scheduler="orca", **CAP64), mix_p())
    # 0: A, B (80 KV). 1-9: A, B decode to their 10th token; C (41) never fits meanwhile. 10: C.
    assert got == [({"A": 30, "B": 30}, "", "")] + decodes("AB", 9) + [({"C": 40}, "", "")]


# ---- sarathi -------------------------------------------------------------------------------------
def test_sarathi_chunks_prompts_under_a_512_token_budget_after_the_decodes():
    def rs():
        return {0: [req(0, 10, 3)], 1: [req(1, 1000, 2)]}
    got = drive(machine(2000), BatchingConfig(scheduler="sarathi"), rs())
    # 0: A's 10. 1: A decodes (1 token of the 512), B's first 511. 2: A (its 3rd, last), B's other
    # 489, its first token. 3: B's 2nd.
    assert got == [({"A": 10}, "", ""), ({"B": 511}, "A", ""), ({"B": 489}, "A", ""), ({}, "B", "")]
    got = drive(machine(2000), BatchingConfig(scheduler="sarathi", chunk_size=300), rs())
    # a budget of 300: B in 299 + 299 (A decodes beside them; done at its 3rd), then 300 + 102
    assert got == [({"A": 10}, "", ""), ({"B": 299}, "A", ""), ({"B": 299}, "A", ""), ({"B": 300}, "", ""),
                   ({"B": 102}, "", ""), ({}, "B", "")]


# ---- fastertransformer ---------------------------------------------------------------------------
def test_fastertransformer_forms_a_static_batch_nobody_joins_until_it_is_done():
    rs = {0: [req(0, 10, 3), req(1, 10, 5), req(2, 10, 2)], 1: [req(3, 10, 1)]}
    got = drive(machine(100), BatchingConfig(scheduler="fastertransformer", max_seqs=2), rs)
    # 0: a batch of two: A, B prefill. 1-2: A, B decode (A's 3rd and last at 2). 3-4: B alone to its
    # 5th, though a seat is free. 5: the next batch: C and D prefill (D done at its first token).
    # 6: C's 2nd.
    assert got == [({"A": 10, "B": 10}, "", "")] + decodes("AB", 2) + decodes("B", 2) + [
        ({"C": 10, "D": 10}, "", ""), ({}, "C", "")]


def test_fastertransformer_ready_decodes_wait_for_the_next_batch():
    m = machine(100, pool=Pool.TOKEN)
    a, b = req(0, 10, 3), req(1, 10, 2)
    for r in (a, b):
        r.generated = 1                 # their first token came from a prompt machine
        assert reserve_decode(m, r)
    cfg = BatchingConfig(scheduler="fastertransformer")
    join_decode(m, a)
    b0 = form_batch(m, cfg)
    join_decode(m, b)                   # lands while A's batch runs
    finish_iteration(m, b0)
    b1 = form_batch(m, cfg)             # A alone again: B waits in `ready`
    assert (b0.joined, step(b0), b1.joined, step(b1)) == ([a], ({}, "A", ""), [], ({}, "A", ""))
    assert m.ready == [b]
    finish_iteration(m, b1)             # A's 3rd, last
    b2 = form_batch(m, cfg)
    assert b2.joined == [b] and step(b2) == ({}, "B", "")


# ---- lightllm ------------------------------------------------------------------------------------
def test_lightllm_peak_kv_estimate():
    # (used, left): sorted by left, 5 then 1: max(10 + 5*1, 10 + 20 + 1*2) = 32 (at the 1st step
    # 11 + 21)
    assert peak_kv([(20, 1), (10, 5)]) == 32
    # three: left 8, 4, 0: max(30 + 8, 30 + 50 + 8, 30 + 50 + 41 + 0) = 121
    assert peak_kv([(41, 0), (30, 8), (50, 4)]) == 121
    assert peak_kv([]) == 0


LIGHTLLM = BatchingConfig(scheduler="lightllm", kv_allocation="on-demand", **CAP64)


def on_demand(cap: int) -> Machine:
    """A machine of `cap` KV tokens allocating on demand by the token (watermark: 1% of 100 = 1)."""
    m = machine(cap)
    configure(m, LIGHTLLM)
    return m


def test_lightllm_prefills_first_and_never_preempts():
    got = drive(on_demand(100), LIGHTLLM, mix_s())
    # as vllm: estimates 24, then 24 + 33... all fit 100: 0: A, B. 1: C alone. 2-4: decodes.
    assert got == [({"A": 20, "B": 30}, "", ""), ({"C": 40}, "", ""), ({}, "ABC", ""), ({}, "AB", ""),
                   ({}, "A", "")]
    got = drive(on_demand(100), LIGHTLLM, mix_p())
    # 0: A, B: estimate max(30 + 10, 60 + 2*10) = 80. 2: C (40, 1) beside A, B at (30 + g, 10 - g):
    # 60 + 2g + 40 + 1*3 > 100 while they run: no preemption, it waits while A, B decode to their
    # 10th (1-9). 10: C.
    assert got == [({"A": 30, "B": 30}, "", "")] + decodes("AB", 9) + [({"C": 40}, "", "")]


def test_lightllm_admits_by_the_estimated_peak_not_by_reservation_or_prompt_blocks():
    def running_a(cfg: BatchingConfig) -> Machine:
        """100 KV tokens; A (prompt 9, output 51) prefilled: it holds 10 tokens and has 50 to go."""
        m = machine(100)
        configure(m, cfg)
        enqueue_prompt(m, req(0, 9, 51))
        finish_iteration(m, form_batch(m, cfg))
        a = m.running[0]
        assert (a.prompt_tokens + a.generated, a.output_tokens - a.generated) == (10, 50)
        for r in (req(1, 20, 30), req(2, 20, 30)):
            enqueue_prompt(m, r)
        return m

    m = running_a(LIGHTLLM)
    # B (20, 30) beside A (10, 50): max(10 + 50*1, 30 + 30*2) = 90 <= 100: B starts. C (20, 30)
    # too: max(60, 90, 50 + 30*3 = 140) > 100: C waits.
    assert [peak_kv([(10, 50), (20, 30)]), peak_kv([(10, 50), (20, 30), (20, 30)])] == [90, 140]
    assert step(form_batch(m, LIGHTLLM)) == ({"B": 20}, "", "")
    # Reserving, A holds 10 + 50 = 60: B's 20 + 30 = 50 is more than the 40 free (110 > 100).
    reserve = running_a(BatchingConfig(**CAP64))
    assert (reserve.kv_free, decode_reservation(reserve, reserve.prompt_queue[0])) == (40, 50)
    # vLLM's prompt-block admission takes both: A's 10 + 20 + 20 + the watermark's 1 <= 100.
    vllm = BatchingConfig(scheduler="vllm", kv_allocation="on-demand", **CAP64)
    assert step(form_batch(running_a(vllm), vllm)) == ({"B": 20, "C": 20}, "", "")


def test_lightllm_allocates_on_demand_and_refuses_reserve():
    assert make_policy({"batching.scheduler": "lightllm"}).batching.kv_allocation == "on-demand"
    assert make_policy({"batching.scheduler": "lightllm"}, "vllm").batching.kv_allocation == "on-demand"
    with pytest.raises(UserError, match="lightllm allocates KV by its own rule: it takes --kv-allocation on-demand"):
        make_policy({"batching.scheduler": "lightllm", "batching.kv_allocation": "reserve"})
    assert make_policy({"batching.scheduler": "orca"}, "vllm").batching.kv_allocation == "reserve"


# ---- options -------------------------------------------------------------------------------------
def test_the_option_names_the_valid_schedulers():
    assert make_policy({"batching.scheduler": "orca", "batching.max_len": 100}).batching.max_len == 100
    with pytest.raises(UserError, match="splitwise, vllm, orca, sarathi, fastertransformer, lightllm"):
        make_policy({"batching.scheduler": "tgi"})
    with pytest.raises(UserError, match="--chunk-size applies to"):
        make_policy({"batching.scheduler": "vllm", "batching.chunk_size": 64})
    with pytest.raises(UserError, match="--orca-max-len applies to"):
        make_policy({"batching.max_len": 64})


# ---- every scheduler on random streams -----------------------------------------------------------
@st.composite
def streams(draw):
    block = draw(st.sampled_from([1, 4, 16]))
    cap = block * draw(st.integers(max(1, 48 // block), 256 // block))
    rs = []
    for i in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, cap - 1))
        rs.append((draw(st.integers(0, 30)), prompt, draw(st.integers(1, cap - prompt))))
    return block, cap, rs


@settings(max_examples=300, deadline=None)
@given(streams(), st.sampled_from(sorted(SCHEDULERS)), st.integers(1, 3), st.integers(0, 3), st.integers(0, 4),
       st.integers(8, 300), st.integers(0, 64), st.integers(0, 300))
def test_every_scheduler_finishes_everyone_within_kv(stream, name, stages, limit, seats, cap, chunk, max_len):
    block, kv, specs = stream
    cfg = BatchingConfig(scheduler=name, preemption_limit=limit, max_seqs=seats, prompt_token_cap=cap,
                         chunk_size=chunk if name in ("splitwise", "sarathi") else 0,
                         max_len=max_len if name == "orca" else 0, kv_allocation=SCHEDULERS[name].allocation or "reserve",
                         recompute="in-place")   # on demand (lightllm): a preempted decode recomputes here
    m = machine(kv, block=block, stages=stages)
    configure(m, cfg)
    arrivals: dict[int, list[Request]] = {}
    rs = []
    for i, (t, p, o) in enumerate(specs):
        r = Request(i, float(t), p, o)
        r.token_machine = 0
        arrivals.setdefault(t, []).append(r)
        rs.append(r)
    flight: deque = deque()   # batches in the machine's stages, oldest first
    tick = 0
    for _ in range(20_000):
        for r in arrivals.pop(tick, []):
            enqueue_prompt(m, r)
        b = form_batch(m, cfg) if len(flight) < stages else None
        if b is not None:
            held = {id(r) for f in flight for r in (*f.prompts, *f.decoding)}
            assert not held & {id(r) for r in (*b.prompts, *b.decoding)}   # nobody in two batches
            assert all(r.phase is Phase.DECODE for r in b.decoding)
            flight.append(b)
        elif flight:
            finish_iteration(m, flight.popleft())
        elif arrivals:
            tick += 1
        else:
            break
        assert 0 <= m.kv_used <= m.kv_capacity
        assert m.pending == m.recount_pending()
        if seats and stages == 1:
            assert len(m.running) <= seats
    assert all(r.phase is Phase.DONE for r in rs), name
    assert m.kv_used == 0 and not m.has_work()


# ---- the simulator runs each ---------------------------------------------------------------------
@pytest.mark.parametrize("design", ["splitwise-hh", "baseline-h100"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_simulate_runs_every_scheduler(design, name):
    from splitserve.sim.run import run_simulation

    policy = make_policy({"batching.scheduler": name})
    _, res = run_simulation(design=design, duration=4, rps=3, seed=1, policy=policy, return_result=True)
    assert res.metrics.requests > 0 and res.metrics.completed == res.metrics.requests


# ---- tetriinfer ----------------------------------------------------------------------------------
def test_tetriinfer_orders_prompts_then_cuts_512_token_chunks():
    def rs():   # prefill only (one output token each): A 600, B 100, C 300 tokens, all at iteration 0
        return {0: [req(0, 600, 1), req(1, 100, 1), req(2, 300, 1)]}

    def order(name):
        return [list(d.items()) for d, _, _ in drive(machine(2000), BatchingConfig(scheduler=name), rs())]

    # FCFS: A's first 512; then the rest of A (it holds its KV: non-preemptive), B, C
    assert order("tetriinfer-fcfs") == [[("A", 512)], [("A", 88), ("B", 100), ("C", 300)]]
    # SJF: B 100, C 300, then A's first 112 of the 512; A's other 488
    assert order("tetriinfer-sjf") == [[("B", 100), ("C", 300), ("A", 112)], [("A", 488)]]
    # LJF: A's first 512; A's last 88 (started first), then C before B
    assert order("tetriinfer-ljf") == [[("A", 512)], [("A", 88), ("C", 300), ("B", 100)]]

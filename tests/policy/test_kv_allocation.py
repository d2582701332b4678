"""KV on demand (policy/kv_allocation.py, policy/preemption.py), checked with hand-computed
schedules: who holds how many blocks after each step, who is preempted when, and their recompute;
and against reserve, on the same requests."""

from __future__ import annotations

import pytest

from splitserve.policy.cluster import RoutingConfig, admit, admit_freed, readmit
from splitserve.policy.cluster_schedulers import make_cluster_scheduler
from splitserve.policy.kv_allocation import admission_kv, configure
from splitserve.policy.machine import BatchingConfig, finish_iteration
from splitserve.policy.preemption import sent_back
from splitserve.policy.schedulers import form_batch
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.transitions import enqueue_prompt, kv_landed

ON_DEMAND = BatchingConfig(kv_allocation="on-demand", kv_watermark=0.0)


def machine(cap: int, block: int = 4, cfg: BatchingConfig = ON_DEMAND, pool: Pool = Pool.MIXED, mid: int = 0):
    m = Machine(mid, "x", home=pool, kv_capacity=cap, kv_block=block)
    configure(m, cfg)
    return m


def request(i: int, prompt: int, out: int, machine_id: int = 0) -> Request:
    r = Request(i, float(i), prompt, out)
    r.prompt_machine = r.token_machine = machine_id
    return r


def step(m: Machine, cfg: BatchingConfig = ON_DEMAND):
    """One iteration: (prompts run, decodes run, preempted, kv_used while it runs), then its end."""
    b = form_batch(m, cfg)
    assert b is not None
    row = ([r.id for r in b.prompts], [r.id for r in b.decoding], [r.id for r in b.preempted], m.kv_used)
    assert 0 <= m.kv_used <= m.kv_capacity and m.pending == m.recount_pending()
    finish_iteration(m, b)
    return row


def test_decodes_grow_a_block_at_a_time_and_the_last_joined_is_preempted():
    """Three requests of 6 prompt + 10 output tokens on 24 tokens of KV in blocks of 4 (by hand):
    all three prefill at once (8 tokens each: two blocks); at their 4th token each needs a third
    block, none is free, and C, the last to join, is preempted so that A and B grow; at the 8th, B
    goes for A. They recompute in the order they were preempted, latest first, once room is back."""
    m = machine(24)
    a, b, c = (request(i, 6, 10) for i in range(3))
    for r in (a, b, c):
        enqueue_prompt(m, r)
    rows = [step(m) for _ in range(11)]
    assert rows == [
        ([0, 1, 2], [], [], 24),   # 3 x kv_round(6) = 3 x 8
        ([], [0, 1, 2], [], 24),   # token 2: positions 0..6 in 8
        ([], [0, 1, 2], [], 24),   # token 3: 0..7
        ([], [0, 1], [2], 24),     # token 4 needs 0..8: 12 each; C (joined last) goes, A and B grow
        ([], [0, 1], [], 24),      # C would recompute 6 + 3 tokens (12): none free; no prompt joined
        ([], [0, 1], [], 24),
        ([], [0, 1], [], 24),
        ([], [0], [1], 16),        # token 8 needs 0..12: 16; B goes for A
        ([], [0], [], 16),         # B's recompute (6 + 7 = 13 tokens: 16) waits, C behind it (FCFS)
        ([], [0], [], 16),         # A's last token
        ([1], [], [], 16),         # A freed its 16: B recomputes (16 of 24); C (12) waits
    ]
    assert (a.phase, a.generated, a.preemptions) == (Phase.DONE, 10, 0)
    assert (b.phase, b.generated, b.preemptions, b.kv_held) == (Phase.DECODE, 8, 1, 16)
    assert (c.phase, c.generated, c.preemptions, c.kv_held) == (Phase.QUEUED, 3, 1, 0)
    while m.has_work():
        step(m)
    assert all(r.generated == 10 and r.phase is Phase.DONE for r in (a, b, c))
    assert m.kv_used == 0 and m.pending == 0 and (b.kv_held, c.kv_held) == (0, 0)


def test_the_same_requests_under_reserve_run_one_at_a_time():
    """Reserve: each of the three holds kv_round(6 + 10) = 16 of the 24 from its prefill, so one runs
    at a time (with preemption off: under the splitwise rules a waiting prompt would preempt the
    decode to take its 16, back and forth, up to the preemption limit)."""
    cfg = BatchingConfig(preemption_limit=0)
    m = machine(24, cfg=cfg)
    rs = [request(i, 6, 10) for i in range(3)]
    for r in rs:
        enqueue_prompt(m, r)
    first = [step(m, cfg) for _ in range(3)]
    assert first == [([0], [], [], 16), ([], [0], [], 16), ([], [0], [], 16)]
    steps = 3
    while m.has_work():
        step(m, cfg)
        steps += 1
    assert steps == 30 and m.kv_used == 0   # 3 x (1 prefill + 9 decodes), one after another


def test_a_request_at_the_preemption_limit_is_passed_over_until_none_is_left():
    """The limit picks who goes: C, the last to join, has been preempted its limit, so B goes
    first; then A, the only one left under the limit, goes itself rather than C; with every decode
    at the limit, the last to join goes anyway (so the oldest runs)."""
    cfg = BatchingConfig(kv_allocation="on-demand", kv_watermark=0.0, preemption_limit=1)
    m = machine(24, cfg=cfg)
    a, b, c = (request(i, 6, 10) for i in range(3))
    for r in (a, b, c):
        enqueue_prompt(m, r)
    step(m, cfg)
    c.preemptions = 1                          # as if it had been preempted once already
    assert [step(m, cfg)[2] for _ in range(3)] == [[], [], [1]]   # token 4: B (under the limit), not C
    assert [step(m, cfg)[2] for _ in range(4)] == [[], [], [], [0]]  # token 8: A itself, not C
    m2 = machine(24, cfg=cfg)
    rs = [request(i, 6, 10) for i in range(3)]
    for r in rs:
        enqueue_prompt(m2, r)
        r.preemptions = 1
    assert [step(m2, cfg)[2] for _ in range(4)] == [[], [], [], [2]]  # all at the limit: C, the last


def test_an_admission_leaves_the_watermark_free_unless_the_machine_is_empty():
    """10% of 10 blocks of 4: a prompt starts when its blocks and 4 more tokens are free."""
    cfg = BatchingConfig(kv_allocation="on-demand", kv_watermark=0.1)
    m = machine(40, cfg=cfg)
    assert m.kv_watermark == 4
    big, small, last = request(0, 36, 2), request(1, 4, 2), request(2, 1, 2)
    for r in (big, small, last):
        enqueue_prompt(m, r)
    assert step(m, cfg)[0] == [0]              # 36 of 40 into an empty machine: no watermark then
    assert step(m, cfg) == ([], [0], [], 40)   # small (4) would leave 0 < 4 free: it waits


def test_a_token_machine_takes_the_prompt_and_first_token_blocks_then_grows():
    """Split: the token machine reserves kv_round(prompt + 1) before the prefill; the prompt
    machine holds kv_round(prompt) until the KV lands."""
    p, t = machine(64, pool=Pool.PROMPT, mid=0), machine(64, pool=Pool.TOKEN, mid=1)
    cls = make_cluster_scheduler([p, t], RoutingConfig(mixed_pool=False), split=True)
    r = Request(0, 0.0, 7, 3)
    assert admit(cls, r)
    assert (r.prompt_machine, r.token_machine) == (0, 1)
    assert t.kv_used == r.kv_held == admission_kv(t, r) == 8
    step(p)
    assert r.phase is Phase.HANDOFF and p.kv_used == 8
    kv_landed(p, t, r)
    assert p.kv_used == 0
    assert step(t)[1:] == ([0], [], 8)         # token 2 writes position 7: still 8
    assert step(t)[1:] == ([0], [], 12)        # token 3 writes 8: a third block
    assert t.kv_used == 0 and r.phase is Phase.DONE


def test_prompt_pool_recompute_sends_a_preempted_decode_back_through_a_prompt_machine():
    """`--recompute prompt-pool`: a decode preempted on its token machine leaves it holding
    nothing; admitted again, a prompt machine recomputes its prompt and outputs (6 + 3) and the
    token machine reserves those and its next token (kv_round(10) = 12)."""
    cfg = BatchingConfig(kv_allocation="on-demand", kv_watermark=0.0, recompute="prompt-pool")
    p = machine(64, cfg=cfg, pool=Pool.PROMPT, mid=0)
    t = machine(24, cfg=cfg, pool=Pool.TOKEN, mid=1)
    cls = make_cluster_scheduler([p, t], RoutingConfig(mixed_pool=False), split=True)
    rs = [Request(i, float(i), 6, 10) for i in range(3)]
    for r in rs:
        assert admit(cls, r)                   # each reserves kv_round(7) = 8 of t's 24
    step(p, cfg)
    for r in rs:
        kv_landed(p, t, r)
    assert [step(t, cfg)[2] for _ in range(2)] == [[], []]
    b = form_batch(t, cfg)                     # token 4 of each needs a third block: C goes
    gone = sent_back(t, b.preempted)
    assert gone == [rs[2]] and rs[2].phase is Phase.QUEUED and rs[2] not in t.prompt_queue
    finish_iteration(t, b)
    assert not readmit(cls, rs[2])             # t is full: it waits in t's admit queue, holding nothing
    assert t.admit_queue[0] is rs[2] and not p.prompt_queue
    while rs[0].phase is not Phase.DONE:
        step(t, cfg)
    admitted = admit_freed(cls, t)             # A's blocks freed: C reserves 12 and queues on p
    assert admitted == [rs[2]] and rs[2].kv_held == 12 and p.prompt_queue[0] is rs[2]
    assert step(p, cfg)[0] == [2] and p.kv_used == 12 and rs[2].generated == 4   # 6 + 3 recomputed
    kv_landed(p, t, rs[2])
    assert p.kv_used == 0


@pytest.mark.parametrize("scheduler", ["splitwise", "vllm", "sarathi", "tetriinfer-sjf", "lightllm"])
def test_every_scheduler_that_allocates_on_demand_finishes_everyone_within_the_cache(scheduler):
    import random

    cfg = BatchingConfig(kv_allocation="on-demand", scheduler=scheduler, preemption_limit=2)
    m = machine(256, block=16, cfg=cfg)
    rng = random.Random(7)
    rs = [request(i, rng.randint(1, 100), rng.randint(1, 120)) for i in range(40)]
    for r in rs:
        enqueue_prompt(m, r)
    preempted = 0
    while m.has_work():
        b = form_batch(m, cfg)
        preempted += len(b.preempted)
        assert 0 <= m.kv_used <= m.kv_capacity and m.pending == m.recount_pending()
        finish_iteration(m, b)
    assert all(r.phase is Phase.DONE and r.generated == r.output_tokens for r in rs)
    assert m.kv_used == 0 and m.pending == 0 and preempted > 0

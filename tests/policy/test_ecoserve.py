"""EcoServe's machine-level scheduler (policy/schedulers/ecoserve/): hand-computed schedules for
its pipelined allocation, time-synced groups, queue order and an under-prediction; on random
streams with wrong predictions, everyone finishes within the KV and every family's writes stay
within what it holds.

Unless said otherwise: block 1 (an unpaged cache), the reserve is ceil(3% of the capacity), a
deadline is arrival + 2 x (0.1 + 0.05 x predicted) seconds in buckets of 0.5 s."""

from __future__ import annotations

import math
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.policy.machine import BatchingConfig, finish_iteration

from splitserve.policy.schedulers import form_batch
from splitserve.policy.schedulers.ecoserve.order import host, reserve
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.release import release
from splitserve.policy.sized_kv import park_decode
from splitserve.policy.transitions import enqueue_prompt

NAMES = "ABCDEFGH"
ECO = BatchingConfig(scheduler="ecoserve")


def machine(cap: int, block: int = 1, stages: int = 1) -> Machine:
    return Machine(id=0, hardware="x", home=Pool.MIXED, kv_capacity=cap, kv_block=block, stages=stages)


def requests(specs) -> list[Request]:
    """Request NAMES[i] from (arrival, prompt, output, predicted output)."""
    rs = []
    for i, (arrival, prompt, out, pred) in enumerate(specs):
        r = Request(i, arrival, prompt, out, predicted=pred)
        r.token_machine = 0
        rs.append(r)
    return rs


def drive(m: Machine, rs: list[Request], cfg: BatchingConfig = ECO) -> list:
    """Every iteration until all are done, as ({prefilling: tokens}, decoding, preempted, KV used
    when formed, {guest: host}); repeated iterations collapsed into (iteration, times)."""
    for r in rs:
        enqueue_prompt(m, r)
    out: list = []
    while len(out) < 1000:
        b = form_batch(m, cfg)
        if b is None:
            break
        it = ({NAMES[r.id]: n for r, n in zip(b.prompts, b.chunks)}, "".join(NAMES[r.id] for r in b.decoding),
              "".join(NAMES[r.id] for r in b.preempted), m.kv_used,
              {NAMES[r.id]: NAMES[host(r).id] for r in b.decoding if host(r) not in (None, r)})
        assert m.kv_used <= m.kv_capacity
        if out and out[-1][0] == it:
            out[-1] = (it, out[-1][1] + 1)
        else:
            out.append((it, 1))
        finish_iteration(m, b)
        assert m.pending == m.recount_pending()
    assert all(r.phase is Phase.DONE for r in rs) and m.kv_used == 0 and not m.has_work()
    return out


# ---- (a) KV-cache pipelining ---------------------------------------------------------------------
def test_a_long_reservation_hosts_a_short_request_and_a_third_recursively():
    # A (10-token prompt, 40 out, predicted 40), B (12, 12) at t = 3 s, C (3, 3) at t = 4 s.
    # Deadlines 4.2, 4.4, 4.5 s: buckets 8, 8, 9; A's group (39 left: 2) before B's (11 left: 1).
    # Capacity 80, reserve 3. Iteration 0 prefills all three (30 tokens held). Iteration 1: A
    # reserves its prompt + 40 (70 held; 7 left above the reserve), B's 12 more do not fit: A
    # hosts. b = 0.15 x 39 = 5.85; level 1: at most 39/2 - b = 13.65 -> B (11 left), at A's
    # middle; level 2 (two slots): at most 39/4 - b = 3.9 -> C (2 left), inside A's first half;
    # level 3: 39/8 - b < 1, none. B and C reserve nothing more.
    m = machine(80)
    a, b, c = rs = requests([(0.0, 10, 40, 40), (3.0, 10, 12, 12), (4.0, 10, 3, 3)])
    got = drive(m, rs)
    assert got == [
        (({"A": 10, "B": 10, "C": 10}, "", "", 30, {}), 1),
        (({}, "ABC", "", 70, {"B": "A", "C": "A"}), 2),     # C's 2 tokens, inside A's [10, 20)
        (({}, "AB", "", 60, {"B": "A"}), 9),                # C freed its prompt; B in A's [20, 40)
        (({}, "A", "", 50, {}), 28),                        # B done (11 tokens) before A reaches 20
    ]
    assert m.counts == {"pipelined": 2}
    assert (a.kv_held, b.kv_held, c.kv_held) == (0, 0, 0)


def test_a_the_family_writes_within_what_it_holds_step_by_step():
    # The same run, iteration by iteration: what A's family has written after it (prompt +
    # generated - 1 of each member alive) against what its members hold (A 50, B 10, C 10).
    m = machine(80)
    rs = requests([(0.0, 10, 40, 40), (3.0, 10, 12, 12), (4.0, 10, 3, 3)])
    for r in rs:
        enqueue_prompt(m, r)
    finish_iteration(m, form_batch(m, ECO))
    seen = []
    while m.running or m.decode_queue:
        b = form_batch(m, ECO)
        finish_iteration(m, b)
        fam = [r for r in rs if r.phase is Phase.DECODE]
        seen.append((sum(r.prompt_tokens + r.generated - 1 for r in fam), sum(r.kv_held for r in fam)))
    # after decode k: A wrote 10 + k; B 10 + k until k = 11; C 10 + k until k = 2, then done
    assert seen[:3] == [(33, 70), (24, 60), (26, 60)]
    assert seen[9:12] == [(40, 60), (21, 50), (22, 50)]
    assert seen[-2:] == [(48, 50), (0, 0)]
    assert all(w <= h for w, h in seen)


# ---- (b) time-synced groups ----------------------------------------------------------------------
def test_b_same_length_groups_start_together_and_end_together():
    # A and C predicted 40 (group 2), B and D predicted 20 (group 1); deadlines all in bucket 8
    # (4.2, 4.2, 4.3, 4.1 s). Capacity 134, reserve 5: after the four prompts (40), 89 free above
    # the reserve: A (+40) and C (+40) start; D (+20) does not fit, so the 20-token group waits.
    # Neither 20-token request fits A's slots (19 left > 39/2 - 5.85). When A and C end together,
    # D and B start together and end together.
    m = machine(134)
    rs = requests([(0.0, 10, 40, 40), (2.0, 10, 20, 20), (0.1, 10, 40, 40), (1.9, 10, 20, 20)])
    assert drive(m, rs) == [
        (({"A": 10, "C": 10, "D": 10, "B": 10}, "", "", 40, {}), 1),
        (({}, "AC", "", 120, {}), 39),
        (({}, "DB", "", 60, {}), 19),
    ]


# ---- (c) queue order -----------------------------------------------------------------------------
def test_c_queues_by_deadline_then_occupied_kv_then_length():
    # A (arrival 0, predicted 30): deadline 3.2 s, bucket 6. B (t = 4, a 300-token prompt,
    # predicted 20), C (t = 2, predicted 40), D (t = 3.5, predicted 25): deadlines all 6.2 s,
    # bucket 12. Prompts: A, then the longest prompt B, then C and D (first come first served).
    # GTs: A (earliest deadline), then B (occupies 300 tokens: KV bucket 2), then C (group 2)
    # before D (group 1). Capacity 377 (reserve 12): with the prompts held (330), 35 free above
    # the reserve: one reservation at a time until B's 300 tokens go, then C and D together.
    m = machine(377)
    rs = requests([(0.0, 10, 30, 30), (4.0, 300, 20, 20), (2.0, 10, 40, 40), (3.5, 10, 25, 25)])
    assert drive(m, rs) == [
        (({"A": 10, "B": 300, "C": 10, "D": 10}, "", "", 330, {}), 1),
        (({}, "A", "", 360, {}), 29),
        (({}, "B", "", 340, {}), 19),
        (({}, "CD", "", 85, {}), 24),
        (({}, "C", "", 50, {}), 15),
    ]


def test_c_prompt_order_longest_first_within_a_deadline_bucket():
    m = machine(10_000)
    rs = requests([(0.0, 5, 5, 100), (1.0, 20, 5, 10), (1.1, 50, 5, 10), (1.2, 20, 5, 10)])
    for r in rs:
        enqueue_prompt(m, r)
    b = form_batch(m, BatchingConfig(scheduler="ecoserve", prompt_token_cap=1))  # one prompt each
    # deadlines: A 10.2 s (bucket 20); B, C, D 2.2-2.4 s (bucket 4): C (50 tokens), B, D, then A
    assert [NAMES[r.id] for r in b.prompts] == ["C"]
    assert [NAMES[r.id] for r in m.prompt_queue] == ["B", "D", "A"]


# ---- (d) under-prediction ------------------------------------------------------------------------
def test_d_an_under_predicted_request_takes_the_reserve_then_is_regrouped():
    # A: 10-token prompt, 16 out, predicted 8. B: 10, 20 out, predicted 20. Capacity 50, reserve 2.
    # Iteration 1: A holds 18, B 30 (48 held, 2 free). Decode k writes 10 + k tokens of A:
    # k = 9 and 10 take the 2 free tokens (the reserve); k = 11 finds none: A stops, holding its
    # 20, and is regrouped, predicted to make 11 + 8 = 19 in all (8 left). B runs alone until it
    # ends (decode 19); then A resumes with 10 + 19 = 29 reserved and makes its last 5 tokens.
    m = machine(50)
    a, b = rs = requests([(0.0, 10, 16, 8), (0.0, 10, 20, 20)])
    assert drive(m, rs) == [
        (({"A": 10, "B": 10}, "", "", 20, {}), 1),
        (({}, "AB", "", 48, {}), 8),
        (({}, "AB", "", 49, {}), 1),
        (({}, "AB", "", 50, {}), 1),
        (({}, "B", "", 50, {}), 9),
        (({}, "A", "", 29, {}), 5),
    ]
    assert m.counts == {"reserve": 2, "regrouped": 1}
    assert a.predicted == 19 and a.preemptions == 0


def test_d_a_guest_that_outlives_its_slot_takes_the_free_kv_then_is_preempted():
    # A (predicted 40, right) hosts B (t = 3.5 s, predicted 10, makes 40): capacity 72, reserve 3;
    # after the prompts, A's +40 leaves 9 above the reserve, less than B's +10, so B goes in A's
    # slot (9 left <= 13.65). They hold 50 + 10 = 60. Decode k writes 10 + k tokens of each: from
    # k = 21 the family takes 2 free tokens a decode (12 free: 6 decodes); at k = 27 none is free
    # and B, past its prediction, is preempted (offload-free) and recomputes its 10 + 27 tokens
    # when A has ended, then is re-predicted 28 + 10 = 38 tokens (48 held) and takes 1 more.
    m = machine(72)
    a, b = rs = requests([(0.0, 10, 40, 40), (3.5, 10, 40, 10)])
    ab = {"B": "A"}
    assert drive(m, rs) == [
        (({"A": 10, "B": 10}, "", "", 20, {}), 1),
        (({}, "AB", "", 60, ab), 20),
        (({}, "AB", "", 62, ab), 1), (({}, "AB", "", 64, ab), 1), (({}, "AB", "", 66, ab), 1),
        (({}, "AB", "", 68, ab), 1), (({}, "AB", "", 70, ab), 1), (({}, "AB", "", 72, ab), 1),
        (({}, "A", "B", 62, {}), 1),
        (({}, "A", "", 62, {}), 12),
        (({"B": 37}, "", "", 37, {}), 1),
        (({}, "B", "", 48, {}), 11),
        (({}, "B", "", 49, {}), 1),
    ]
    assert m.counts == {"pipelined": 1, "reserve": 7, "preempted": 1}
    assert b.preemptions == 1 and b.predicted == 38


def test_release_of_a_waiting_request_frees_its_kv():
    m = machine(100)
    (a,) = rs = requests([(0.0, 10, 5, 5)])
    enqueue_prompt(m, a)
    finish_iteration(m, form_batch(m, ECO))
    m.running.remove(a)
    park_decode(m, a)
    assert a.phase is Phase.WAITING and m.kv_used == 10
    release(a, m, m)
    assert a.phase is Phase.DONE and m.kv_used == 0 and m.pending == m.recount_pending() == 0
    assert rs


# ---- random streams, wrong predictions -----------------------------------------------------------
@st.composite
def streams(draw):
    block = draw(st.sampled_from([1, 4, 16]))
    cap = block * draw(st.integers(max(1, 48 // block), 256 // block))
    rs = []
    for i in range(draw(st.integers(1, 14))):
        prompt = draw(st.integers(1, cap - 1))
        out = draw(st.integers(1, cap - prompt))
        pred = draw(st.sampled_from([0, 1, out // 3, out // 2, out, out + 5, 3 * out]))
        rs.append((draw(st.integers(0, 20)), prompt, out, max(pred, 0)))
    return block, cap, rs


@settings(max_examples=300, deadline=None)
@given(streams(), st.integers(1, 3), st.integers(0, 4), st.integers(8, 300))
def test_random_streams_finish_within_kv_whatever_the_predictions(stream, stages, seats, tcap):
    block, kv, specs = stream
    cfg = BatchingConfig(scheduler="ecoserve", max_seqs=seats, prompt_token_cap=tcap)
    m = machine(kv, block=block, stages=stages)
    arrivals: dict[int, list[Request]] = {}
    rs = requests([(float(t), p, o, pred) for t, p, o, pred in specs])
    for r in rs:
        arrivals.setdefault(int(r.arrival), []).append(r)
    flight: deque = deque()
    tick = 0
    for _ in range(50_000):
        for r in arrivals.pop(tick, []):
            enqueue_prompt(m, r)
        b = form_batch(m, cfg) if len(flight) < stages else None
        if b is not None:
            held = {id(r) for f in flight for r in (*f.prompts, *f.decoding)}
            assert not held & {id(r) for r in (*b.prompts, *b.decoding)}
            flight.append(b)
        elif flight:
            finish_iteration(m, flight.popleft())
        elif arrivals:
            tick += 1
        else:
            break
        assert 0 <= m.kv_used <= m.kv_capacity
        assert m.kv_used == sum(r.kv_held or (m.kv_round(r.kv_need) if r.phase is Phase.DECODE else 0)
                                for r in rs if r.phase in (Phase.PREFILL, Phase.DECODE, Phase.WAITING))
        assert m.pending == m.recount_pending()
        fams: dict[int, list[Request]] = {}
        for r in m.running:
            if host(r) is not None:
                fams.setdefault(id(host(r)), []).append(r)
        for fam in fams.values():   # what a family wrote fits what its members hold
            assert sum(m.kv_round(x.prompt_tokens + x.generated - 1) for x in fam) <= sum(x.kv_held for x in fam)
        if seats and stages == 1:
            assert len(m.running) <= seats
    assert all(r.phase is Phase.DONE for r in rs)
    assert m.kv_used == 0 and not m.has_work()


def test_reserve_and_buffer_constants():
    assert reserve(machine(80)) == math.ceil(0.03 * 80) == 3
    assert reserve(machine(160, block=16)) == 16


def test_waiting_gts_go_on_alone_when_an_isolated_prompt_does_not_fit_beside_them():
    # Capacity 256. A (10-token prompt, 2 out) and B (121, 2) prefill together (B first: longer)
    # and wait as GTs holding their prompts' 131 tokens. C, isolated (a suspect: it runs alone,
    # reserving prompt + output = 126), arrives: 125 are free. Without a rule the isolated turn
    # cannot start C and the GTs wait while an isolated request is here: nothing ever runs (found
    # by tests/serve/test_cluster_state.py). The GTs go on alone (135 held: prompts + 2 + 2), end,
    # and C then prefills alone (126 held), its one token its prefill's.
    m = machine(256)
    a, b = rs = requests([(0.0, 10, 2, 2), (0.0, 121, 2, 2)])
    for r in rs:
        enqueue_prompt(m, r)
    first = form_batch(m, ECO)
    assert [NAMES[r.id] for r in first.prompts] == ["B", "A"]
    finish_iteration(m, first)
    assert m.kv_used == 131 and (a.kv_held, b.kv_held) == (10, 121)   # parked at the next form_batch
    c = Request(2, 0.1, 125, 1, predicted=1, isolated=True)
    c.token_machine = 0
    enqueue_prompt(m, c)
    steps = []
    while (batch := form_batch(m, ECO)) is not None:
        steps.append(([NAMES[r.id] for r in batch.prompts], "".join(NAMES[r.id] for r in batch.decoding), m.kv_used))
        finish_iteration(m, batch)
    assert steps == [([], "AB", 135), (["C"], "", 126)]
    assert all(r.phase is Phase.DONE for r in (a, b, c)) and m.kv_used == 0 and not m.has_work()

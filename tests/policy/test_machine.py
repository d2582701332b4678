"""Machine-level batching rules, checked case by case with hand-computed numbers."""

from splitserve.policy.machine import BatchingConfig, finish_iteration

from splitserve.policy.schedulers import form_batch
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.release import release
from splitserve.policy.transitions import admit_waiting, enqueue_prompt, join_decode, release_prompt_kv, reserve_decode


def machine(cap=100_000, pool=Pool.MIXED, mid=0):
    return Machine(id=mid, hardware="x", home=pool, kv_capacity=cap)


def req(i, prompt, out, arrival=0.0, token_machine=0):
    r = Request(i, arrival, prompt, out)
    r.token_machine = token_machine
    return r


def test_prompt_batches_capped_at_2048_tokens_fcfs():
    m = machine(pool=Pool.PROMPT)
    for i, p in enumerate([1000, 900, 500, 3000]):
        enqueue_prompt(m, req(i, p, 5, token_machine=9))        # decodes elsewhere
    sizes = []
    while (b := form_batch(m, BatchingConfig())) is not None:
        sizes.append([r.prompt_tokens for r in b.prompts])
        res = finish_iteration(m, b)
        assert m.pending == m.recount_pending()
        assert all(r.phase is Phase.HANDOFF for r in res.first_tokens)
        for r in res.first_tokens:                               # KV sent: prompt copy freed
            release_prompt_kv(m, r)
    # 1000+900 fit (1900); +500 would make 2400 > 2048; then 500 alone (500+3000 > 2048); 3000 alone
    assert sizes == [[1000, 900], [500], [3000]]
    assert m.kv_used == 0 and m.queued_prompt_tokens == 0


def test_decode_batch_runs_every_admitted_request_until_done():
    m = machine(pool=Pool.TOKEN)
    rs = [req(i, 10, out, token_machine=0) for i, out in enumerate([2, 4, 3])]
    for r in rs:
        r.generated, r.phase = 1, Phase.HANDOFF                  # first token came from the prompt machine
        assert reserve_decode(m, r)
        join_decode(m, r)
    assert m.kv_used == (10 + 2) + (10 + 4) + (10 + 3)
    batches = []
    while (b := form_batch(m, BatchingConfig())) is not None:
        batches.append(b.decodes)
        assert b.context == sum(r.prompt_tokens + r.generated for r in m.running)
        finish_iteration(m, b)
    # outputs 2,4,3 with one token already: 1,3,2 more decode steps -> batch sizes 3,2,1
    assert batches == [3, 2, 1]
    assert all(r.generated == r.output_tokens and r.phase is Phase.DONE for r in rs)
    assert m.kv_used == 0 and m.context_tokens == 0 and m.decode_tokens_left == 0
    assert m.pending == m.recount_pending() == 0


def test_token_admission_waits_for_memory_in_fcfs_order():
    m = machine(cap=100, pool=Pool.TOKEN)
    a, b, c = req(0, 40, 20), req(1, 50, 10), req(2, 5, 5)
    assert reserve_decode(m, a)            # 60 of 100
    assert not reserve_decode(m, b)        # needs 60, 40 free: waits
    assert not reserve_decode(m, c)        # would fit (10) but must not overtake b
    assert list(m.admit_queue) == [b, c] and m.queued_decode_tokens == 15
    release(a, None, m)                    # a left
    assert admit_waiting(m) == [b, c]
    assert m.kv_used == 70 and m.queued_decode_tokens == 0


def test_chunked_prefill_fills_budget_after_decodes():
    m = machine()
    d = req(0, 10, 50)
    d.generated = 1
    assert reserve_decode(m, d)
    join_decode(m, d)
    p = req(1, 1000, 3, arrival=1.0)
    enqueue_prompt(m, p)
    cfg = BatchingConfig(chunk_size=512)
    chunks = []
    while p.phase is not Phase.DECODE:
        b = form_batch(m, cfg)
        chunks.append((b.decodes, b.prompt_tokens))
        finish_iteration(m, b)
    # 1 decode + 511, then 1 decode + 489 prompt tokens (1000 in all)
    assert chunks == [(1, 511), (1, 489)]
    assert p.generated == 1 and d.generated == 3


def test_prompt_preempts_youngest_decodes_first_within_the_limit():
    m = machine(cap=100)
    old = req(0, 20, 10, arrival=0.0)
    young = req(1, 20, 10, arrival=2.0)
    capped = req(2, 20, 10, arrival=3.0)
    capped.preemptions = 3                  # already at the limit
    for r in (old, young, capped):
        r.generated = 1
        assert reserve_decode(m, r)         # 90 used
        join_decode(m, r)
    form_batch(m, BatchingConfig())         # they start decoding
    head = req(3, 40, 5, arrival=4.0)       # needs 45, 10 free
    enqueue_prompt(m, head)
    b = form_batch(m, BatchingConfig(preemption_limit=3))
    # `capped` is exempt; `young` (30) is not enough, so `old` (30) goes too: 10 + 60 >= 45
    assert b.preempted == [young, old] and young.preemptions == old.preemptions == 1
    assert b.prompts == [head] and b.decodes == 1 and m.running == [capped]
    # the preempted recompute next, ahead of younger prompts, oldest first
    assert list(m.prompt_queue) == [old, young]
    assert m.queued_prompt_tokens == old.prefill_len + young.prefill_len
    assert m.kv_used == 90 - 60 + 45


def test_no_preemption_when_victims_cannot_free_enough():
    m = machine(cap=100)
    young = req(1, 20, 10, arrival=2.0)
    young.generated = 1
    assert reserve_decode(m, req(9, 60, 5)) and reserve_decode(m, young)  # 65 for another, 30 young's
    join_decode(m, young)
    form_batch(m, BatchingConfig())
    enqueue_prompt(m, req(3, 60, 5, arrival=1.0))   # needs 65, freeing young gives 35
    b = form_batch(m, BatchingConfig())
    assert b.preempted == [] and b.prompts == [] and b.decodes == 1

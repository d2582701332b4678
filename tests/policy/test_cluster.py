"""Cluster-level routing: JSQ pairs, overflow to the mixed pool, borrowing, going home."""

import pytest

from splitserve.policy.cluster import ClusterScheduler, RoutingConfig
from splitserve.policy.cluster_schedulers import CLUSTER_SCHEDULERS
from splitserve.policy.pools import JSQScheduler, SplitwiseScheduler, move
from splitserve.policy.transitions import enqueue_prompt
from splitserve.policy.state import Machine, Pool, Request


def load(m, **counters):
    """Set a machine's queue counters (and the pending total JSQ reads)."""
    for k, v in counters.items():
        setattr(m, k, v)
    m.pending = m.recount_pending()


def cluster(n_prompt, n_token):
    ms = [Machine(i, "x", Pool.PROMPT, 10**6) for i in range(n_prompt)]
    ms += [Machine(n_prompt + i, "x", Pool.TOKEN, 10**6) for i in range(n_token)]
    return ms


def test_pair_is_shortest_queue_by_pending_tokens():
    ms = cluster(3, 2)
    load(ms[0], queued_prompt_tokens=500)
    load(ms[1], queued_prompt_tokens=100)
    load(ms[2], running_prompt_tokens=300)
    load(ms[3], decode_tokens_left=40)
    load(ms[4], decode_tokens_left=7)
    s = SplitwiseScheduler(ms)
    p, t = s.route(Request(0, 0.0, 10, 10))
    assert (p.id, t.id) == (1, 4)


def test_full_prompt_pool_borrows_a_token_machine_into_the_mixed_pool():
    ms = cluster(1, 2)
    s = SplitwiseScheduler(ms, RoutingConfig(prompt_queue_threshold=1000, overflow_rule="queued"))
    load(ms[0], queued_prompt_tokens=1500)
    load(ms[1], decode_tokens_left=10)
    load(ms[2], decode_tokens_left=3)
    p, t = s.route(Request(0, 0.0, 10, 10))
    assert p is t is ms[2] and ms[2].pool is Pool.MIXED and s.borrowed == 1
    # the mixed machine is used again before anything else is borrowed
    p2, t2 = s.route(Request(1, 0.0, 10, 10))
    assert p2 is ms[2] and s.borrowed == 1
    # once it holds no prompt work it goes back to the token pool
    s.settle(ms[2])
    assert ms[2].pool is Pool.TOKEN


def test_last_machine_of_a_pool_is_never_borrowed():
    ms = cluster(1, 1)
    s = SplitwiseScheduler(ms, RoutingConfig(prompt_queue_threshold=0, overflow_rule="queued",
                                             borrow_rule="splitserve"))
    load(ms[0], queued_prompt_tokens=10)
    p, t = s.route(Request(0, 0.0, 10, 10))
    assert (p.id, t.id) == (0, 1) and s.borrowed == 0


def test_memory_bound_token_pool_overflows_to_a_prompt_machine():
    ms = cluster(2, 1)
    s = SplitwiseScheduler(ms, RoutingConfig(borrow_rule="splitserve"))
    ms[2].queued_decode_tokens = 50           # waiting for KV memory
    load(ms[0], queued_prompt_tokens=10)
    p, t = s.route(Request(0, 0.0, 10, 10))
    assert p is ms[1] and t is ms[0] and t.pool is Pool.MIXED
    enqueue_prompt(ms[0], Request(1, 0.0, 5, 5))
    s.settle(ms[0])                           # no decode work: home again
    assert ms[0].pool is Pool.PROMPT


def test_baseline_routes_whole_requests_by_jsq():
    ms = [Machine(i, "x", Pool.MIXED, 10**6) for i in range(3)]
    load(ms[0], decode_tokens_left=5)
    load(ms[2], queued_prompt_tokens=1)
    s = JSQScheduler(ms)
    p, t = s.route(Request(0, 0.0, 1, 1))
    assert p is t is ms[1]


def test_splitwise_needs_both_pools():
    with pytest.raises(ValueError):
        SplitwiseScheduler(cluster(2, 0))


def test_when_every_candidate_is_full_jsq_spans_pool_and_mixed_pool():
    ms = cluster(2, 2)
    s = SplitwiseScheduler(ms, RoutingConfig(prompt_queue_threshold=100, overflow_rule="queued",
                                             borrow_rule="splitserve"))
    move(s.pools, ms[0], Pool.MIXED)                 # borrowed earlier, and now full like the rest
    move(s.pools, ms[2], Pool.MIXED)
    load(ms[0], queued_prompt_tokens=500)
    load(ms[1], queued_prompt_tokens=900)      # the last prompt machine: full, most loaded
    load(ms[2], queued_prompt_tokens=300)
    load(ms[3], decode_tokens_left=5)          # the last token machine cannot be borrowed
    p, t = s.route(Request(0, 0.0, 10, 10))
    # not the last prompt machine: the least-loaded of prompt + mixed pools, which runs it whole
    assert p is t is ms[2]


def _queued(m, *prompts):
    """Queue prompts of these sizes on `m` (enqueue_prompt keeps the counters)."""
    for i, n in enumerate(prompts):
        enqueue_prompt(m, Request(100 + i, 0.0, n, 10))


@pytest.mark.parametrize("rule, running, queued, arriving, full", [
    # the authors' rule: queued + running + the arriving prompt past 8192, with a prompt queued
    ("authors", 2048, (5000,), 1500, True),    # 8,548 > 8,192
    ("authors", 2048, (5000,), 1000, False),   # 8,048
    ("authors", 8000, (), 1500, False),        # nothing queued: never full, however much runs
    # splitserve's earlier rule: queued prompt tokens alone past 8192
    ("queued", 2048, (5000,), 1500, False),
    ("queued", 0, (5000, 3500), 10, True),     # 8,500 queued
])
def test_overflow_rules_by_hand(rule, running, queued, arriving, full):
    ms = cluster(1, 2)
    s = SplitwiseScheduler(ms, RoutingConfig(prompt_queue_threshold=8192, overflow_rule=rule))
    _queued(ms[0], *queued)
    load(ms[0], running_prompt_tokens=running)
    p, _ = s.route(Request(0, 0.0, arriving, 10))
    assert (p is not ms[0]) == full
    assert (ms[1].pool is Pool.MIXED or ms[2].pool is Pool.MIXED) == full  # a token machine borrowed


def test_the_authors_rule_is_the_default():
    assert RoutingConfig().overflow_rule == "authors"


def test_pull_prefills_at_once_and_the_token_machine_takes_the_kv_when_it_has_memory():
    from splitserve.policy.cluster import admit, admit_freed, pull_kv
    from splitserve.policy.machine import BatchingConfig, finish_iteration
    from splitserve.policy.schedulers import form_batch
    from splitserve.policy.state import Phase
    from splitserve.policy.transitions import decode_tokens, kv_landed

    p, t = Machine(0, "x", Pool.PROMPT, 1000), Machine(1, "x", Pool.TOKEN, 300)
    s = SplitwiseScheduler([p, t], RoutingConfig(mixed_pool=False, kv_pull=True))
    a, b = Request(0, 0.0, 200, 3), Request(1, 0.0, 200, 3)
    # push: b could not even start its prefill (t holds 300 tokens; a reserved 203)
    assert admit(s, a, pull=True) and admit(s, b, pull=True)
    assert (t.kv_used, p.queued_prompt_tokens) == (0, 400)          # nothing reserved on t yet
    batch = form_batch(p, BatchingConfig())
    assert batch.prompts == [a, b] and p.kv_used == 400             # both prefill, their KV on p
    finish_iteration(p, batch)
    assert a.phase is b.phase is Phase.HANDOFF
    assert pull_kv(t, a) and t.kv_used == 203                       # a's KV moves now
    assert not pull_kv(t, b) and list(t.admit_queue) == [b]         # b waits, its KV still on p
    kv_landed(p, t, a)
    assert p.kv_used == 200                                         # b's KV is p's queue
    run = form_batch(t, BatchingConfig())
    decode_tokens(t, run.decoding, k=2)                             # a finishes: 203 tokens freed
    assert admit_freed(s, t) == [b] and b.phase is Phase.HANDOFF    # pulled, not queued for a prefill
    assert p.queued_prompt_tokens == 0 and t.kv_used == 203


@pytest.mark.parametrize("name", sorted(CLUSTER_SCHEDULERS))
def test_every_cluster_scheduler_has_every_hook(name):
    """Each registered scheduler is a ClusterScheduler: the simulator and the router call every
    hook without probing; the defaults watch nothing, accept every machine, report no scaling."""
    ms = cluster(2, 2)
    cls = CLUSTER_SCHEDULERS[name](ms, RoutingConfig(cluster_scheduler=name), True)
    assert isinstance(cls, ClusterScheduler)
    for hook in ("route", "pick_prompt", "settle", "add", "remove", "watch", "accepting", "bind_latency",
                 "activity"):
        assert callable(getattr(cls, hook))
    assert cls.borrowed == 0 and list(cls.flips) == []
    assert all(cls.accepting(m) for m in ms)
    if name in ("splitwise", "jsq"):
        assert cls.watch_interval == 0 and cls.watch(1.0) == [] and cls.activity(1.0) is None

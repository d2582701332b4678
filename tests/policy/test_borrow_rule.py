"""The authors' borrowing rule (RoutingConfig.borrow_rule="authors", SplitwiseSim's
MixedPoolScheduler.schedule) by hand, beside splitserve's earlier rule on the same states.

Threshold 8,192 prompt tokens, the authors' overflow rule: a prompt machine with a prompt queued is
full when its queued + running prompt tokens + the arriving prompt's pass 8,192."""

from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.pools import SplitwiseScheduler, move
from splitserve.policy.state import Machine, Pool, Request
from splitserve.policy.transitions import enqueue_prompt

AUTHORS = RoutingConfig(prompt_queue_threshold=8192, overflow_rule="authors", borrow_rule="authors")
SPLITSERVE = RoutingConfig(prompt_queue_threshold=8192, overflow_rule="authors", borrow_rule="splitserve")


def cluster(n_prompt, n_token):
    ms = [Machine(i, "x", Pool.PROMPT, 10**6) for i in range(n_prompt)]
    ms += [Machine(n_prompt + i, "x", Pool.TOKEN, 10**6) for i in range(n_token)]
    return ms


def busy(m, running=0, queued=(), decoding=0):
    """`m` runs `running` prompt tokens, has prompts of these sizes queued, and `decoding` decode
    tokens still to make."""
    for i, n in enumerate(queued):
        enqueue_prompt(m, Request(100 * m.id + i, 0.0, n, 10))
    m.running_prompt_tokens += running
    m.decode_tokens_left += decoding
    m.pending = m.recount_pending()


def overloaded():
    """Two prompt machines with prompts queued, pending 7,048 and 7,000; one token machine, 9,040."""
    ms = cluster(2, 1)
    busy(ms[0], running=2048, queued=(5000,))
    busy(ms[1], running=3000, queued=(4000,))
    busy(ms[2], decoding=9040)
    return ms


def test_the_last_token_machine_is_borrowed_and_then_a_request_runs_whole_on_the_shortest_queue():
    ms = overloaded()
    s = SplitwiseScheduler(ms, AUTHORS)
    # A, 1,500 tokens: the shortest prompt queue (machine 1) is full, 4,000 + 3,000 + 1,500 = 8,500 >
    # 8,192, and the mixed pool is empty: the token pool's last machine is borrowed; it was also the
    # token side's pick (made before the borrow), so A runs whole on it
    a = Request(0, 0.0, 1500, 10)
    p, t = s.route(a)
    assert (p.id, t.id) == (2, 2) and ms[2].pool is Pool.MIXED and s.borrowed == 1
    assert s.pools[Pool.TOKEN] == []
    enqueue_prompt(ms[2], a)                       # machine 2: pending 9,040 + 1,500 = 10,540
    # B, 1,000 tokens: machine 1 takes it (8,000 <= 8,192); the token side's pool is empty, so the
    # mixed machine decodes it: split, machine 1 -> machine 2
    b = Request(1, 0.0, 1000, 10)
    p, t = s.route(b)
    assert (p.id, t.id) == (1, 2) and s.borrowed == 1
    enqueue_prompt(ms[1], b)                       # machine 1: pending 8,000
    # C, 7,000 tokens: machine 0 (7,048) is full (5,000 + 2,048 + 7,000), so is the mixed machine
    # (1,500 + 7,000), and the token pool has nothing left to lend: C runs whole on the shortest
    # queue of all machines, prompt machine 0 (7,048 < 8,000 < 10,540), which stays in its pool
    p, t = s.route(Request(2, 0.0, 7000, 10))
    assert (p.id, t.id) == (0, 0) and ms[0].pool is Pool.PROMPT and s.borrowed == 1


def test_splitserves_rule_on_the_same_state_keeps_the_last_token_machine():
    ms = overloaded()
    s = SplitwiseScheduler(ms, SPLITSERVE)
    # A: the prompt pool is full and the token pool's last machine is never lent: JSQ over the prompt
    # and mixed pools, machine 1 (7,000), the token machine decodes
    p, t = s.route(Request(0, 0.0, 1500, 10))
    assert (p.id, t.id) == (1, 2) and s.borrowed == 0 and ms[2].pool is Pool.TOKEN


def test_a_mixed_machine_prefills_for_another_token_machine():
    ms = cluster(1, 2)
    busy(ms[0], running=4000, queued=(4000,))      # full for any prompt over 192 tokens
    busy(ms[1], decoding=300)                       # borrowed earlier, room for prompts
    busy(ms[2], decoding=500)
    for cfg, pair in ((AUTHORS, (1, 2)), (SPLITSERVE, (1, 1))):
        s = SplitwiseScheduler(ms, cfg)
        move(s.pools, ms[1], Pool.MIXED)
        p, t = s.route(Request(0, 0.0, 1000, 10))
        # the authors: the prompt from the mixed pool, the token machine from the token pool (a KV
        # transfer 1 -> 2); splitserve's rule: the mixed machine runs it whole
        assert (p.id, t.id) == pair, cfg.borrow_rule
        ms[1].pool = Pool.TOKEN


def test_a_borrowed_machine_goes_home_only_when_idle():
    for cfg, home_while_decoding in ((AUTHORS, False), (SPLITSERVE, True)):
        ms = cluster(1, 2)
        s = SplitwiseScheduler(ms, cfg)
        move(s.pools, ms[1], Pool.MIXED)
        ms[1].running.append(Request(0, 0.0, 10, 10))   # decodes, no prompt work
        s.settle(ms[1])
        assert (ms[1].pool is Pool.TOKEN) == home_while_decoding, cfg.borrow_rule
        ms[1].running.clear()                            # idle
        s.settle(ms[1])
        assert ms[1].pool is Pool.TOKEN


def test_the_authors_borrowing_rule_is_the_default():
    assert RoutingConfig().borrow_rule == "authors"

"""A latency-aware full token machine (RoutingConfig.token_tbt_slo): full when its next decode step
with the arriving request would pass the SLO, by the latency model bound to the scheduler; by
default (0) only a token machine whose KV is short counts as full. Numbers by hand.

Latency: t_d = k2 * context + c2 * batch + c3 = 1e-6 * context + 1e-3 * batch + 0.020 s."""

import pytest

from splitserve.errors import UserError
from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.config import make_policy
from splitserve.policy.latency import LinearLatency
from splitserve.policy.pools import SplitwiseScheduler
from splitserve.policy.state import Machine, Pool, Request

LAT = LinearLatency(k1=1e-4, c1=0.0, k2=1e-6, c2=1e-3, c3=0.020)


def cluster():
    """Prompt machine 0, idle; token machines 1 and 2, each decoding 29 requests holding 10,000 KV
    tokens (machine 2 with more tokens still to make: JSQ picks machine 1)."""
    ms = [Machine(0, "x", Pool.PROMPT, 10**6), Machine(1, "x", Pool.TOKEN, 10**6), Machine(2, "x", Pool.TOKEN, 10**6)]
    for m, left in ((ms[1], 1000), (ms[2], 2000)):
        m.running = [Request(100 * m.id + i, 0.0, 300, 50) for i in range(29)]
        m.context_tokens = 10_000
        m.decode_tokens_left = left
        m.pending = m.recount_pending()
    return ms


def route(slo: float, prompt: int):
    ms = cluster()
    s = SplitwiseScheduler(ms, RoutingConfig(token_tbt_slo=slo))
    s.bind_latency(LAT)
    p, t = s.route(Request(0, 0.0, prompt, 10))
    return p.id, t.id, s.borrowed, ms[0].pool


def test_under_the_slo_the_shortest_token_queue_decodes():
    # machine 1 with the request: 30 decodes, 10,000 + 1,000 KV: 0.011 + 0.030 + 0.020 = 0.061 s <= 0.062
    assert route(0.062, 1000) == (0, 1, 0, Pool.PROMPT)


def test_past_the_slo_the_token_side_borrows_a_prompt_machine():
    # 0.061 s > 0.060: machine 1 (the token pool's shortest queue) is full; the authors' rule then
    # borrows the prompt pool's shortest queue, machine 0, which is also the prompt side: it runs whole
    assert route(0.060, 1000) == (0, 0, 1, Pool.MIXED)
    # a longer prompt, 3,000 tokens: 0.013 + 0.030 + 0.020 = 0.063 s > 0.062
    assert route(0.062, 3000) == (0, 0, 1, Pool.MIXED)


def test_off_by_default_a_slow_batch_is_not_full():
    assert RoutingConfig().token_tbt_slo == 0.0
    assert route(0.0, 1000) == (0, 1, 0, Pool.PROMPT)


def test_the_option_takes_seconds_not_below_zero():
    assert make_policy({"routing.token_tbt_slo": 0.05}).routing.token_tbt_slo == 0.05
    with pytest.raises(UserError, match="--token-tbt-slo"):
        make_policy({"routing.token_tbt_slo": -1.0})

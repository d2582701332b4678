"""TetriInfer's decode dispatch, by hand: memory filters, two of the rest, the lower heavy share."""

from splitserve.policy.cluster import RoutingConfig
from splitserve.policy.pools import SplitwiseScheduler
from splitserve.policy.predictor import BucketPredictor, OraclePredictor
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.tetriinfer import Registry, heavy, pick_decode


def decoding(rid, m, output):
    r = Request(rid, 0.0, 10, output, phase=Phase.DECODE)
    r.token_machine = m.id
    return r


def test_dispatch_by_hand():
    t0, t1, t2 = (Machine(i, "x", Pool.TOKEN, cap) for i, cap in enumerate([100, 10_000, 10_000]))
    reg = Registry()
    reg.add(t1, decoding(90, t1, 500), True)
    reg.add(t1, decoding(91, t1, 20), False)
    old = decoding(92, t2, 20)
    reg.add(t2, old, False)
    t1.pending, t2.pending = 500, 0
    oracle = OraclePredictor()
    # heavy (300 > 128), needs 100 + 300 of KV: t0 (100 free) is out, the two are t1 and t2;
    # heavy share with it: t1 2/3, t2 1/2 -> t2
    a = Request(1, 0.0, 100, 300)
    assert pick_decode([t0, t1, t2], a, oracle, reg) is t2
    # light (50): t1 1/3, t2 1/3 (a heavy, one light, itself light) -> tie, fewer pending: t2
    b = Request(2, 0.0, 100, 50)
    assert pick_decode([t0, t1, t2], b, oracle, reg) is t2
    assert reg.counts(t2) == (1, 2)
    old.phase = Phase.DONE                        # finished requests no longer count
    assert reg.counts(t2) == (1, 1) and reg.counts(t1) == (1, 1)
    # no machine has room: all three are candidates (the request will wait for memory)
    c = Request(3, 0.0, 20_000, 10)
    assert pick_decode([t0, t1, t2], c, oracle, reg) in (t0, t1, t2)


def test_heavy_is_judged_on_the_predicted_range():
    p = BucketPredictor(granularity=200, accuracy=1.0)
    assert not heavy(p.predict(0, 1, 100))        # bucket 1..200: midpoint 100.5
    assert heavy(p.predict(0, 1, 250))            # 201..400


def test_the_scheduler_dispatches_split_requests_this_way():
    ms = [Machine(0, "x", Pool.PROMPT, 10**6)] + [Machine(i, "x", Pool.TOKEN, 10**6) for i in (1, 2, 3)]
    s = SplitwiseScheduler(ms, RoutingConfig(decode_dispatch="tetriinfer", predictor="tetriinfer-200"))
    picks = [s.route(Request(i, 0.0, 100, 20 + 37 * i))[1].id for i in range(60)]
    assert set(picks) <= {1, 2, 3} and len(set(picks)) == 3
    # spread: heavy requests land evenly (no machine gets more than half of them)
    hv = [t for t, i in zip(picks, range(60)) if heavy(s.predictor.predict(i, 100, 20 + 37 * i))]
    assert max(hv.count(t) for t in (1, 2, 3)) <= len(hv) / 2

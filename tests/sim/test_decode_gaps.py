"""`Metrics.decode_gaps`, the per-iteration bookkeeping of decode tokens, against the per-token
definition it replaces: every gap added to the TBT histogram, and gap / reference to the
slowdown histogram (`Histogram.add`). Over random batches (decodes that continue share a last-
token time, joiners have their own, in any order): the TBT histogram is equal (counts, n, lo,
hi; the sum to rounding), the slowdown histogram has the same n, lo and hi and each gap lands in
the quotient's bucket or a neighbour, so its percentiles are within one 0.1% bucket."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.policy.state import Request
from splitserve.report.histogram import Histogram
from splitserve.sim.metrics import Metrics, ref_bucket


def request(i: int, last: float, ref: float) -> Request:
    r = Request(i, 0.0, 100, 50)
    r.last_token_at, r.ref_tbt, r.log_ref = last, ref, ref_bucket(ref)
    r.token_times = []
    return r


batches = st.lists(st.lists(st.tuples(st.sampled_from((0.0, 0.0, 0.0, 0.013, 0.2)),  # 0: continues
                                      st.floats(0.005, 0.08)), min_size=0, max_size=40),
                   min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(batches, st.floats(0.01, 0.2))
def test_grouped_gaps_equal_the_per_token_record(steps, step_s):
    got, want = Metrics(), (Histogram(), Histogram())
    now, made = 1.0, 0
    for k, batch in enumerate(steps):
        prev = now
        now = prev + step_s * (1 + k % 3)
        rs = [request(i, prev - back, ref) for i, (back, ref) in enumerate(batch)]
        for r in rs:
            want[0].add(now - r.last_token_at)
            want[1].add((now - r.last_token_at) / r.ref_tbt)
        made += got.decode_gaps(rs, now)
        assert all(r.last_token_at == now and r.token_times == [now] for r in rs)
    tbt, slow = got.tbt, got.slow_tbt
    assert made == tbt.n == want[0].n == slow.n == want[1].n
    assert tbt.buckets() == want[0].buckets() and (tbt.lo, tbt.hi) == (want[0].lo, want[0].hi)
    assert math.isclose(tbt.total, want[0].total, rel_tol=1e-12, abs_tol=1e-12)
    assert (slow.lo, slow.hi) == (want[1].lo, want[1].hi)
    assert math.isclose(slow.total, want[1].total, rel_tol=1e-9, abs_tol=1e-9)
    moved = 0
    have = slow.buckets()
    for i, c in want[1].buckets().items():   # each bucket's gaps are in it or a neighbour
        near = sum(have.get(j, 0) for j in (i - 1, i, i + 1))
        assert near >= c
        moved += abs(have.get(i, 0) - c)
    assert moved <= made // 10 + 2       # neighbours rarely: only at a bucket's edge
    for q in (0.5, 0.9, 0.99) if made else ():
        assert abs(math.log(slow.quantile(q) / want[1].quantile(q))) <= 2 * math.log(1.001) + 1e-12

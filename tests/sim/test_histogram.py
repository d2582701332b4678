"""report/histogram.py's bucket list against its definition: bucket int(log(x / 1e-7) / log(1.001))
+ 1 (0 at or below 1e-7), nearest-rank quantiles at the bucket's geometric centre clamped to the
extremes; over random values of any magnitude, added in any order and merged."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.report.histogram import BUCKETS_PER_LOG, LOW, RATIO, Histogram

values = st.lists(st.one_of(st.just(0.0), st.floats(1e-9, 1e-6), st.floats(1e-3, 10.0), st.floats(10.0, 1e6)),
                  max_size=60)


def want_quantile(xs: list[float], q: float) -> float:
    counts = Counter(int(math.log(x / LOW) * BUCKETS_PER_LOG) + 1 if x > LOW else 0 for x in xs)
    rank, seen = max(1, math.ceil(q * len(xs))), 0
    for i in sorted(counts):
        seen += counts[i]
        if seen >= rank:
            return min(min(xs), LOW) if i == 0 else min(max(LOW * RATIO ** (i - 0.5), min(xs)), max(xs))
    raise AssertionError


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_buckets_quantiles_and_merge_follow_the_definition(xs, ys):
    a, b = Histogram(), Histogram()
    for x in xs:
        a.add(x)
    for y in ys:
        b.add(y, 2)
    a.merge(b)
    everything = xs + [y for y in ys for _ in range(2)]
    assert a.n == len(everything) and sum(a.buckets().values()) == len(everything)
    assert a.buckets() == dict(Counter(int(math.log(x / LOW) * BUCKETS_PER_LOG) + 1 if x > LOW else 0 for x in everything))
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        if everything:
            assert a.quantile(q) == want_quantile(everything, q)
        else:
            assert math.isnan(a.quantile(q))

"""Streaming latency histogram: constant memory whatever the trace length.

Values fall into logarithmic buckets 0.1% wide, so every percentile is reported within 0.05% of
the exact order statistic (the bucket's geometric centre); count, sum (mean), min and max are
exact. An hour of traffic records millions of token gaps; this keeps the simulator's memory
proportional to requests in flight, not to the trace.
"""

from __future__ import annotations

import math

LOW = 1e-7                      # smallest distinguished value; anything below lands in bucket 0
RATIO = 1.001                   # one bucket to the next: 0.1% apart
BUCKETS_PER_LOG = 1.0 / math.log(RATIO)   # a value's bucket: log(x / LOW) * this, plus one


class Histogram:
    """`counts[k]` values in bucket `base + k`: one list over the buckets seen so far (a gap's or a
    slowdown's bucket is an index, not a dict key: no hashing and no boxed key per value on the
    simulator's hot path)."""

    __slots__ = ("counts", "base", "n", "total", "lo", "hi")

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.base = 0
        self.n = 0
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, x: float, weight: int = 1) -> None:
        self.bump(int(math.log(x / LOW) * BUCKETS_PER_LOG) + 1 if x > LOW else 0, weight)
        self.n += weight
        self.total += x * weight
        if x < self.lo:
            self.lo = x
        if x > self.hi:
            self.hi = x

    def bump(self, i: int, weight: int) -> None:
        """`weight` more values in bucket `i` (count, sum and extremes are the caller's)."""
        k = i - self.base
        c = self.counts
        if k < 0 or k >= len(c):
            self._cover(i)
            c = self.counts
            k = i - self.base
        c[k] += weight

    def _cover(self, i: int) -> None:
        """Grow the list to hold bucket `i`, with as much room again past it (amortised)."""
        c = self.counts
        if not c:
            self.base, self.counts = i - 32, [0] * 65
            return
        room = max(32, len(c))
        lo = min(self.base, i - room)
        hi = max(self.base + len(c), i + room + 1)
        grown = [0] * (hi - lo)
        grown[self.base - lo:self.base - lo + len(c)] = c
        self.base, self.counts = lo, grown

    def buckets(self) -> dict[int, int]:
        """{bucket: count} of the buckets holding values."""
        return {self.base + k: w for k, w in enumerate(self.counts) if w}

    def merge(self, other: Histogram) -> None:
        for i, w in other.buckets().items():
            self.bump(i, w)
        self.n += other.n
        self.total += other.total
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile: the smallest recorded value v with at least q of the mass <= v."""
        if not self.n:
            return math.nan
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for k, w in enumerate(self.counts):
            seen += w
            if seen >= rank:
                i = self.base + k
                if i == 0:
                    return min(self.lo, LOW)
                v = LOW * RATIO ** (i - 0.5)
                return min(max(v, self.lo), self.hi)
        return self.hi

    def summary(self) -> dict[str, float]:
        return {"p50": self.quantile(0.50), "p90": self.quantile(0.90),
                "p99": self.quantile(0.99), "mean": self.mean}

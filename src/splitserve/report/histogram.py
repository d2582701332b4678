"""Streaming latency histogram: constant memory whatever the trace length.

Values fall into logarithmic buckets 0.1% wide, so every percentile is reported within 0.05% of
the exact order statistic (the bucket's geometric centre); count, sum (mean), min and max are
exact. An hour of traffic records millions of token gaps; this keeps the simulator's memory
proportional to requests in flight, not to the trace.
"""

from __future__ import annotations

import math

_LOW = 1e-7                      # smallest distinguished value; anything below lands in bucket 0
_RATIO = 1.001
_K = 1.0 / math.log(_RATIO)


class Histogram:
    __slots__ = ("counts", "n", "total", "lo", "hi")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, x: float, weight: int = 1) -> None:
        i = int(math.log(x / _LOW) * _K) + 1 if x > _LOW else 0
        c = self.counts
        c[i] = c.get(i, 0) + weight
        self.n += weight
        self.total += x * weight
        if x < self.lo:
            self.lo = x
        if x > self.hi:
            self.hi = x

    def merge(self, other: Histogram) -> None:
        for i, w in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + w
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
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                if i == 0:
                    return min(self.lo, _LOW)
                v = _LOW * _RATIO ** (i - 0.5)
                return min(max(v, self.lo), self.hi)
        return self.hi

    def summary(self) -> dict[str, float]:
        return {"p50": self.quantile(0.50), "p90": self.quantile(0.90),
                "p99": self.quantile(0.99), "mean": self.mean}

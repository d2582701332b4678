"""Arrival times with a chosen burstiness: gamma-distributed gaps, as `vllm bench serve --burstiness`.

The gaps between requests are gamma(shape=B, scale=1/(rate*B)): mean 1/rate whatever B, variance
1/(rate^2 B). B = 1 is a Poisson process (exponential gaps); B < 1 is burstier, B > 1 more even.
As in `workload/` (a Poisson workload's first request arrives one gap after 0), the i-th arrival is
the sum of the first i+1 gaps. Drawn in blocks from `numpy.random.default_rng([seed, SALT])`, so
a run is reproducible from its seed and independent of the request sizes' stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

ARRIVAL_SEED_SALT = 0xA77   # the arrivals' own stream of the run's seed
BLOCK = 4096


def gamma_arrivals(rate: float, burstiness: float, seed: int, *, duration: float | None = None,
                   count: int | None = None) -> Iterator[float]:
    """Arrival times (seconds) strictly before `duration` and at most `count` of them (at least
    one of the two must be given)."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be positive, got {rate}")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if duration is None and count is None:
        raise ValueError("give a duration or a count")
    rng = np.random.default_rng([seed, ARRIVAL_SEED_SALT])
    scale = 1.0 / (rate * burstiness)
    end = math.inf if duration is None else duration
    left = math.inf if count is None else count
    t = 0.0
    while True:
        arrival = t + np.cumsum(rng.gamma(burstiness, scale, BLOCK))
        t = float(arrival[-1])
        for a in arrival.tolist():
            if a >= end or left <= 0:
                return
            left -= 1
            yield a

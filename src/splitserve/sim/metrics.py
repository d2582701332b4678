"""What a simulated run measures: latency distributions, SLO slowdowns, transfers, machines; and
the run's result (`SimResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..cluster.designs import ClusterSpec
from ..policy.state import Request
from ..report.histogram import _K, _LOW, Histogram


@dataclass(slots=True)
class MachineStats:
    hardware: str
    pool: str
    busy_s: float = 0.0
    energy_j: float = 0.0
    iterations: int = 0
    prompt_tokens: int = 0
    decode_tokens: int = 0
    peak_kv_used: int = 0
    kv_capacity: int = 0


@dataclass(slots=True)
class Metrics:
    ttft: Histogram = field(default_factory=Histogram)
    tbt: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue: Histogram = field(default_factory=Histogram)        # arrival -> first prefill starts
    slow_ttft: Histogram = field(default_factory=Histogram)    # per-request TTFT / reference
    slow_tbt: Histogram = field(default_factory=Histogram)     # per-gap TBT / reference
    slow_e2e: Histogram = field(default_factory=Histogram)     # per-request E2E / reference
    transfer_visible: Histogram = field(default_factory=Histogram)  # non-overlapped KV transfer
    requests: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    preemptions: int = 0
    transfers: int = 0
    transfer_bytes: float = 0.0
    transfer_layerwise: int = 0
    attained: int = 0                  # completed requests meeting the goodput SLOs (report/goodput.py)
    first_arrival: float = math.inf
    last_arrival: float = 0.0
    last_completion: float = 0.0
    machines: list[MachineStats] = field(default_factory=list)

    def decode_gaps(self, rs, now: float) -> int:
        """Each request of `rs` made a token at `now`: record its gap since its last (and that gap
        against its uncontended reference, for the SLO). The simulator's hottest loop: histogram
        buckets inline, totals once. Returns the number of gaps."""
        tbt, slow = self.tbt, self.slow_tbt
        tc, sc = tbt.counts, slow.counts
        log = math.log
        ngap = 0
        gap_sum = slow_sum = 0.0
        glo = slo_ = math.inf
        ghi = shi = 0.0
        for r in rs:
            g = now - r.last_token_at
            r.last_token_at = now
            i = int(log(g / _LOW) * _K) + 1
            tc[i] = tc.get(i, 0) + 1
            s = g / r.ref_tbt
            j = int(log(s / _LOW) * _K) + 1
            sc[j] = sc.get(j, 0) + 1
            ngap += 1
            gap_sum += g
            slow_sum += s
            if g < glo:
                glo = g
            if g > ghi:
                ghi = g
            if s < slo_:
                slo_ = s
            if s > shi:
                shi = s
            if r.token_times is not None:
                r.token_times.append(now)
        if ngap:
            tbt.n += ngap
            tbt.total += gap_sum
            tbt.lo = min(tbt.lo, glo)
            tbt.hi = max(tbt.hi, ghi)
            slow.n += ngap
            slow.total += slow_sum
            slow.lo = min(slow.lo, slo_)
            slow.hi = max(slow.hi, shi)
        return ngap


@dataclass(slots=True)
class SimResult:
    metrics: Metrics
    cluster: ClusterSpec
    model: str
    events: int
    wall_s: float
    sim_end: float
    borrowed: int
    perf_sources: dict[str, str]
    requests: list[Request] = field(default_factory=list)
    hardware: dict = field(default_factory=dict)  # name -> spec with cost_per_hour and power_kw
    scaling: dict | None = None                   # a scaling scheduler's activity (policy/aladdin.py)

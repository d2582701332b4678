"""What a simulated run measures: latency distributions, SLO slowdowns, transfers, machines; and
the run's result (`SimResult`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..cluster.designs import ClusterSpec
from ..policy.machine import Batch
from ..policy.state import Request
from ..report.goodput import GoodputSLO
from ..report.histogram import BUCKETS_PER_LOG, LOW, Histogram


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

    def ran(self, busy_s: float, energy_j: float, batch: Batch, kv_used: int) -> None:
        """One iteration of `batch`, busy for `busy_s` (a pipeline stage: its share), drawing
        `energy_j`, with `kv_used` KV tokens held."""
        self.busy_s += busy_s
        self.energy_j += energy_j
        self.iterations += 1
        self.prompt_tokens += batch.prompt_tokens
        self.decode_tokens += batch.decodes
        if kv_used > self.peak_kv_used:
            self.peak_kv_used = kv_used


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
    recomputed_tokens: int = 0         # prefill tokens run again after a preemption (their KV was dropped)
    transfers: int = 0
    transfer_bytes: float = 0.0
    transfer_layerwise: int = 0
    transfer_skipped: int = 0          # prompt tokens not sent: the token machine's cache held them
    prefix_queries: int = 0            # prompt tokens of prefills that looked up a prefix cache
    prefix_hits: int = 0               # of them, the cached ones (not computed)
    attained: int = 0                  # completed requests meeting the goodput SLOs (report/goodput.py)
    first_arrival: float = math.inf
    last_arrival: float = 0.0
    last_completion: float = 0.0
    machines: list[MachineStats] = field(default_factory=list)
    # told of each request as it completes: (request, TTFT, E2E) as the client sees them (simulate
    # --requests-out: sim/requests_out.py); None: nothing kept per request
    on_complete: Callable[[Request, float, float], None] | None = None

    def complete(self, r: Request, now: float, path_s: float, prompt_ref: float,
                 goodput: GoodputSLO | None) -> None:
        """`r` made its last token at `now` (the client sees it `path_s` later): its E2E, against
        its reference (`prompt_ref`: its prompt alone, then uncontended decodes), and the goodput
        SLOs (report/goodput.py GoodputSLO, or None)."""
        self.completed += 1
        e2e = now - r.arrival + path_s
        self.e2e.add(e2e)
        self.slow_e2e.add(e2e / (prompt_ref + (r.output_tokens - 1) * r.ref_tbt))
        if goodput is not None and goodput.meets(r.first_token_at - r.arrival + path_s, r.first_token_at, now,
                                                 r.output_tokens):
            self.attained += 1
        if now > self.last_completion:
            self.last_completion = now
        if self.on_complete is not None:
            self.on_complete(r, r.first_token_at - r.arrival + path_s, e2e)

    def prompts_started(self, batch: Batch, now: float) -> None:
        """`batch`'s prompt chunks start at `now`: a prompt's first, its time queued; a recompute's
        after a preemption, its tokens computed again."""
        for r, n in zip(batch.prompts, batch.chunks):
            if r.prompt_started_at < 0:
                r.prompt_started_at = now
                self.queue.add(now - r.arrival)
            elif r.generated:
                self.recomputed_tokens += n

    def decode_gaps(self, rs: list[Request], now: float) -> int:
        """Each request of `rs` made a token at `now`: record its gap since its last (and that gap
        against its uncontended reference, for the SLO). The simulator's hottest loop, so a gap
        costs no logarithm: decodes whose last tokens came at one time (those that continue in a
        batch) share one gap, recorded once with their count; each one's slowdown bucket is the
        gap's less its reference's, stored at arrival (`ref_bucket`), so it may fall one bucket
        (0.1%) off the bucket of the quotient. Count, sum, min and max of the gaps are exact.
        Returns the number of gaps."""
        tbt, slow = self.tbt, self.slow_tbt
        sc, sb = slow.counts, slow.base   # its buckets, inline: a call per decode costs pure Python 13%
        t = math.nan            # the group's last-token time (nan: none yet)
        g = lg = 0.0            # its gap, and the gap in histogram buckets
        n = 0                   # its count
        rlo, rhi, inv = math.inf, -math.inf, 0.0   # its smallest and largest reference, sum of 1 / reference
        gap_sum = 0.0
        for r in rs:
            if r.last_token_at != t:
                if n:
                    self._gap_group(g, lg, n, rlo, rhi, inv)
                t = r.last_token_at
                g = now - t
                lg = math.log(g / LOW) * BUCKETS_PER_LOG
                n = 0
                rlo, rhi, inv = math.inf, -math.inf, 0.0
            r.last_token_at = now
            n += 1
            gap_sum += g
            k = int(lg - r.log_ref) + 1 - sb
            if 0 <= k < len(sc):
                sc[k] += 1
            else:
                slow.bump(k + sb, 1)
                sc, sb = slow.counts, slow.base
            ref = r.ref_tbt
            inv += 1.0 / ref
            if ref < rlo:
                rlo = ref
            if ref > rhi:
                rhi = ref
            if r.token_times is not None:
                r.token_times.append(now)
        if n:
            self._gap_group(g, lg, n, rlo, rhi, inv)
        ngap = len(rs)
        tbt.n += ngap
        tbt.total += gap_sum
        slow.n += ngap
        return ngap

    def _gap_group(self, g: float, lg: float, n: int, ref_lo: float, ref_hi: float, inv: float) -> None:
        """`n` decodes made a token `g` (`lg` in buckets) after their last: the gap's bucket once;
        the slowdowns' extremes from the group's smallest and largest references, their sum from
        `inv`."""
        tbt, slow = self.tbt, self.slow_tbt
        tbt.bump(int(lg) + 1, n)
        if g < tbt.lo:
            tbt.lo = g
        if g > tbt.hi:
            tbt.hi = g
        slow.total += g * inv
        if g / ref_hi < slow.lo:
            slow.lo = g / ref_hi
        if g / ref_lo > slow.hi:
            slow.hi = g / ref_lo


def ref_bucket(ref: float) -> float:
    """A reference TBT in histogram buckets (Request.log_ref): a slowdown's bucket is its gap's
    less this."""
    return math.log(ref) * BUCKETS_PER_LOG


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
    hardware: dict[str, object] = field(default_factory=dict)  # name -> spec with cost_per_hour and power_kw
    scaling: dict[str, object] | None = None                   # a scaling scheduler's activity (policy/aladdin.py)

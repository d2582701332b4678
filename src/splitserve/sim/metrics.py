"""What a simulated run measures: latency distributions, SLO slowdowns, transfers, machines."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..report.histogram import Histogram


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
    first_arrival: float = math.inf
    last_arrival: float = 0.0
    last_completion: float = 0.0
    machines: list[MachineStats] = field(default_factory=list)

"""Aladdin's SLOs per worker (policy/aladdin.py; Table 2 and §6.1), and the latency model they
and its placement and scaling read.

T_pre is the prefill time of the model's context (TTFT_CONTEXT tokens), T_dec 1.3 times a lone
request's decode step at that context, unless `aladdin_ttft_slo` / `aladdin_atgt_slo` give them
(seconds). The latency model comes through `BatchLatency` (policy/latency.py): the simulator binds
its machines' perf models, the live router keeps `LIVE_FIT`.
"""

from __future__ import annotations

from .cluster import RoutingConfig
from .latency import ATGT_FACTOR, TTFT_CONTEXT, BatchLatency
from .state import Machine


class Slos:
    """(T_pre, T_dec) of each worker, computed once from the latency model `lat`."""

    def __init__(self, cfg: RoutingConfig, lat: BatchLatency) -> None:
        self.ttft, self.atgt = cfg.aladdin_ttft_slo, cfg.aladdin_atgt_slo   # 0: from the latency model
        self.lat = lat
        self.by_id: dict[int, tuple[float, float]] = {}

    def bind(self, lat: BatchLatency) -> None:
        """Another latency model (the simulator's): the SLOs are computed again from it."""
        self.lat = lat
        self.by_id.clear()

    def forget(self, mid: int) -> None:
        """Machine `mid` (re)joins: its SLOs are computed again."""
        self.by_id.pop(mid, None)

    def of(self, m: Machine) -> tuple[float, float]:
        """(T_pre, T_dec) of `m`, seconds."""
        s = self.by_id.get(m.id)
        if s is None:
            s = self.by_id[m.id] = (self.ttft or self.lat.prefill_time(m, TTFT_CONTEXT),
                                    self.atgt or ATGT_FACTOR * self.lat.decode_time(m, 1, TTFT_CONTEXT))
        return s

"""What the simulation's parts share, typed in one place: the machines, each one's step in flight,
the event heap and the metrics. `Simulation` (sim/simulator.py) builds one and hands it to each of
its parts (sim/prefix.py, handoff.py, stages.py, sharing.py, reservation.py); each part keeps its
own state besides."""

from __future__ import annotations

import heapq
from typing import Any

from ..policy.machine import Batch
from ..policy.state import Machine, Request
from .metrics import Metrics

# the prompts of a batch whose KV streams to their token machines layer by layer (sim/handoff.py)
Layerwise = list[Request] | tuple[Request, ...]
# a machine's step in flight: (batch, start, seconds, end, its prompts whose KV streams layer by layer)
InFlight = tuple[Batch, float, float, float, Layerwise]
# an event on the heap: (time, seq, kind, object), the object what its kind says (sim/events.py)
Event = tuple[float, int, int, Any]


class SimState:
    """The machines (by id), each one's step in flight (`running[id]`: (batch, start, seconds, end,
    the prompts whose KV streams layer by layer) or None; a pipelined machine's are the stages'),
    the event heap of (time, seq, kind, object) (sim/events.py) and what the run records."""

    def __init__(self, machines: list[Machine], metrics: Metrics) -> None:
        self.machines = machines
        self.metrics = metrics
        self.running: list[InFlight | None] = [None] * len(machines)
        self.heap: list[Event] = []
        self.seq = 0    # events pushed: the heap's tie-break

    def push(self, t: float, kind: int, obj: object) -> None:
        """An event of `kind` about `obj` due at `t`."""
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

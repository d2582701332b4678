"""What the simulation's parts share, typed in one place: the machines, each one's step in flight,
the event heap and the metrics. `Simulation` (sim/simulator.py) builds one and hands it to each of
its parts (sim/prefix.py, handoff.py, stages.py, sharing.py, reservation.py); each part keeps its
own state besides."""

from __future__ import annotations

import heapq

from ..policy.state import Machine
from .metrics import Metrics


class SimState:
    """The machines (by id), each one's step in flight (`running[id]`: (batch, start, seconds, end,
    the prompts whose KV streams layer by layer) or None; a pipelined machine's are the stages'),
    the event heap of (time, seq, kind, object) (sim/events.py) and what the run records."""

    def __init__(self, machines: list[Machine], metrics: Metrics) -> None:
        self.machines = machines
        self.metrics = metrics
        self.running: list[tuple | None] = [None] * len(machines)
        self.heap: list = []
        self.seq = 0    # events pushed: the heap's tie-break

    def push(self, t: float, kind: int, obj: object) -> None:
        """An event of `kind` about `obj` due at `t`."""
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

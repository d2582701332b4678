"""The simulator's hosts whose workers share CPU cores (a measured machine: twin/host_step.py
HostStep, whose `shares_cores` is set). A step there is an amount of work, done at the speed its
worker has while the step runs, and that speed changes whenever another worker of the host starts
or ends a step (processor sharing): every such change re-times each step in flight, taking off
the work done so far at the old speed and running the rest at the new one; the event of a step's
old end is then dropped (each machine's pending end has a version). Timing a step once, when it
starts, charges the slowdown of a worker that joins later only to the joiner's step, never to
the steps it slows. Steps of the catalog's machines keep the time they are given when they
start. A part of `Simulation` (sim/simulator.py)."""

from __future__ import annotations

from mypy_extensions import trait

from ..perf.step import StepModel
from ..policy.machine import Batch
from ..policy.state import Machine
from .events import SHARED_END
from .metrics import Metrics


@trait
class SharedCores:
    """Simulation's steps on shared cores: for each machine the work its step in flight has left
    (seconds alone), since when, at which speed, and the version of its pending end."""

    machines: list[Machine]
    steps: list[StepModel]
    batches: list[tuple | None]
    metrics: Metrics
    sharing: bool
    left: list[float]
    since: list[float]
    speed: list[float]
    version: list[int]

    def _push(self, t: float, kind: int, obj: object) -> None: ...

    def _iter_end(self, m: Machine, now: float) -> None: ...

    def _sharing_init(self) -> None:
        n = len(self.machines)
        self.sharing = any(getattr(s, "shares_cores", False) for s in self.steps)
        self.left, self.since, self.speed, self.version = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n

    def _shared_start(self, m: Machine, batch: Batch, now: float) -> float:
        """Machine `m` starts `batch` (already busy): its work, and its time at the host's speeds
        now; `_reshare` pushes its end once the batch is in flight."""
        step = self.steps[m.id]
        work = step.work(m, batch)  # type: ignore[attr-defined]  # a HostStep
        self.left[m.id] = work
        self.since[m.id] = now
        self.speed[m.id] = 0.0     # not yet timed
        return work / step.speed(m, batch)  # type: ignore[attr-defined]

    def _reshare(self, now: float) -> None:
        """Re-time every step in flight whose speed the host's busy workers changed."""
        for j in range(len(self.machines)):
            b = self.batches[j]
            if b is None:
                continue
            m = self.machines[j]
            batch, start, dur, _, layerwise = b
            sp: float = self.steps[j].speed(m, batch)  # type: ignore[attr-defined]
            old = self.speed[j]
            if sp == old:
                continue
            left = self.left[j] - (now - self.since[j]) * old
            self.left[j] = left if left > 0.0 else 0.0
            self.since[j] = now
            self.speed[j] = sp
            end = now + self.left[j] / sp
            self.metrics.machines[j].busy_s += end - start - dur
            self.batches[j] = (batch, start, end - start, end, layerwise)
            self.version[j] += 1
            self._push(end, SHARED_END, (m, self.version[j]))

    def _shared_end(self, ev: tuple[Machine, int], now: float) -> None:
        """A step's end on shared cores, unless it was re-timed since this event was pushed."""
        m, version = ev
        if version == self.version[m.id]:
            self._iter_end(m, now)
            self._reshare(now)

"""The simulator's hosts whose workers share CPU cores (a measured machine: twin/host_step.py
HostStep, whose `shares_cores` is set). A step there is an amount of work, done at the speed its
worker has while the step runs, and that speed changes whenever another worker of the host starts
or ends a step (processor sharing): every such change re-times each step in flight, taking off
the work done so far at the old speed and running the rest at the new one; the event of a step's
old end is then dropped (each machine's pending end has a version). Timing a step once, when it
starts, would charge the slowdown of a worker that joins later only to the joiner's step, never to
the steps it slows. Steps of the catalog's machines keep the time they are given when they
start."""

from __future__ import annotations

from ..perf.step import SharedStep
from ..policy.machine import Batch
from ..policy.state import Machine
from .events import SHARED_END
from .state import SimState


class SharedCores:
    """For each machine, the work its step in flight has left (seconds alone), since when, at which
    speed, and the version of its pending end (a SHARED_END event of (machine, version))."""

    def __init__(self, state: SimState, steps: list[SharedStep]) -> None:
        n = len(state.machines)
        self.state = state
        self.steps = steps
        self.left, self.since, self.speed, self.version = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n

    def start(self, m: Machine, batch: Batch, now: float) -> float:
        """Machine `m` starts `batch` (already busy): its work, and its time at the host's speeds
        now; `reshare` pushes its end once the batch is in flight."""
        step = self.steps[m.id]
        work = step.work(m, batch)
        self.left[m.id] = work
        self.since[m.id] = now
        self.speed[m.id] = 0.0     # not yet timed
        return work / step.speed(m, batch)

    def reshare(self, now: float) -> None:
        """Re-time every step in flight whose speed the host's busy workers changed."""
        state = self.state
        running = state.running
        for j in range(len(state.machines)):
            b = running[j]
            if b is None:
                continue
            m = state.machines[j]
            batch, start, dur, _, layerwise = b
            sp: float = self.steps[j].speed(m, batch)
            old = self.speed[j]
            if sp == old:
                continue
            left = self.left[j] - (now - self.since[j]) * old
            self.left[j] = left if left > 0.0 else 0.0
            self.since[j] = now
            self.speed[j] = sp
            end = now + self.left[j] / sp
            state.metrics.machines[j].busy_s += end - start - dur
            running[j] = (batch, start, end - start, end, layerwise)
            self.version[j] += 1
            state.push(end, SHARED_END, (m, self.version[j]))

    def current(self, ev: tuple[Machine, int]) -> bool:
        """Whether SHARED_END event `ev` is its machine's step's end, not re-timed since it was pushed."""
        m, version = ev
        return version == self.version[m.id]

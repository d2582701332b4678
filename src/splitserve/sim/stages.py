"""The simulator's pipelined machines (pp > 1, perf/pipeline.py): a batch goes through the stages
one after the other, stage s starting when the batch is out of stage s - 1 (and has hopped to it)
and stage s is free, so up to pp batches are in flight; the machine forms its next batch when its
first stage is free. A part of `Simulation` (sim/simulator.py)."""

from __future__ import annotations

from typing import cast

from mypy_extensions import trait

from ..perf.pipeline import PipelinePerf
from ..perf.step import StepModel
from ..policy.machine import Batch
from ..policy.state import Machine
from .events import STAGE_FREE


@trait
class PipelineStages:
    """Simulation's stages of pipelined machines (its state is the simulation's: `stage_free`,
    when each stage of a machine is free, and `flight`, its batches in flight, oldest first)."""

    stage_free: dict[int, list[float]]
    machines: list[Machine]

    def _push(self, t: float, kind: int, obj: object) -> None: ...

    def _start(self, m: Machine, now: float) -> None: ...

    def _through_stages(self, mid: int, step: StepModel, batch: Batch, now: float) -> tuple[float, float]:
        """Batch `batch` of machine `mid` through its stages from `now`. Returns (the stages'
        compute, when the batch leaves the last stage)."""
        stage = step.stage_time(batch)
        hop = cast(PipelinePerf, step.perf).hop_time
        tokens = batch.prompt_tokens + batch.decodes
        free = self.stage_free[mid]
        t = now
        last = len(free) - 1
        for s in range(last + 1):
            if free[s] > t:
                t = free[s]
            t += stage
            free[s] = t
            if s < last:
                t += hop(s, tokens)
        self._push(free[0], STAGE_FREE, self.machines[mid])
        return stage * (last + 1), t

    def _stage_free(self, m: Machine, now: float) -> None:
        """A pipelined machine's first stage is free: it may start another batch."""
        if m.busy and now >= self.stage_free[m.id][0]:
            m.busy = False
            self._start(m, now)

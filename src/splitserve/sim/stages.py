"""The simulator's pipelined machines (pp > 1, perf/pipeline.py): a batch goes through the stages
one after the other, stage s starting when the batch is out of stage s - 1 (and has hopped to it)
and stage s is free, so up to pp batches are in flight; the machine forms its next batch when its
first stage is free (a STAGE_FREE event)."""

from __future__ import annotations

from collections import deque
from typing import cast

from ..perf.pipeline import PipelinePerf
from ..perf.step import StepModel
from ..policy.machine import Batch
from ..policy.state import Machine
from .events import STAGE_FREE
from .state import InFlight, SimState


class PipelineStages:
    """For each pipelined machine (by id): when each of its stages is free (`stage_free`), and its
    batches in flight, oldest first (`flight`: as `SimState.running`'s entries)."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        piped = [m for m in state.machines if m.stages > 1]
        self.flight: dict[int, deque[InFlight]] = {m.id: deque() for m in piped}
        self.stage_free: dict[int, list[float]] = {m.id: [0.0] * m.stages for m in piped}

    def through_stages(self, mid: int, step: StepModel, batch: Batch, now: float) -> tuple[float, float]:
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
        self.state.push(free[0], STAGE_FREE, self.state.machines[mid])
        return stage * (last + 1), t

    def first_free(self, m: Machine, now: float) -> bool:
        """A STAGE_FREE event of `m`: whether its first stage is free now (then it is no longer busy,
        and may start another batch)."""
        if m.busy and now >= self.stage_free[m.id][0]:
            m.busy = False
            return True
        return False

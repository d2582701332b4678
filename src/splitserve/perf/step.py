"""The step-time model the simulator is given: how long one batch takes on one instance, and what
it costs the host. The simulator holds one per machine and asks it about every batch it starts,
as Vidur's simulator asks its injected execution-time predictor; it knows nothing of what is
behind it. `PerfStep` is the roofline / profile model's (perf/roofline.py, perf/profile.py: the
batch alone on its instance); a measured host's workers have theirs (twin/host_step.py HostStep:
padded KV reads, co-run slowdown, the KV its worker sends inside the step).

A batch here is policy/machine.py's `Batch`, a machine policy/state.py's `Machine`; they are read,
never changed. These sit on the simulator's hot path: no allocation, nothing looked up twice.
"""

from __future__ import annotations

from typing import Protocol, cast

from ..policy.machine import Batch
from ..policy.state import Machine
from .model import PerfModel, PowerModel
from .pipeline import PipelinePerf


class StepModel(Protocol):
    perf: PerfModel       # the instance's batch latencies (Aladdin's placement, pipeline hops)
    power: PowerModel     # its watts
    kv_capacity: int      # KV tokens one instance holds

    def batch_time(self, m: Machine, batch: Batch) -> float:
        """Seconds one iteration of `batch` takes on machine `m`, with the cluster as it is now."""

    def stage_time(self, batch: Batch) -> float:
        """Seconds one pipeline stage of a pipelined instance takes over `batch` (perf/pipeline.py)."""

    def context(self, batch: Batch) -> int:
        """KV tokens the batch's decodes read (what the trace records)."""


class SharedStep(StepModel, Protocol):
    """The step model of a host whose workers share CPU cores (`shares_cores`; twin/host_step.py
    HostStep): a step is an amount of work, done at a speed that changes while it runs
    (sim/sharing.py)."""

    shares_cores: bool

    def work(self, m: Machine, batch: Batch) -> float:
        """Seconds the step takes alone."""

    def speed(self, m: Machine, batch: Batch) -> float:
        """The step's work done per second with the host's workers busy as they are now."""


def prompt_squares(batch: Batch) -> int:
    """The attention term of a batch's prompts (perf/mixed.py): each chunk of n tokens attends to
    its own, n * n; a first chunk whose first c tokens a prefix cache gave computes n * n - c * c."""
    sq = 0
    if batch.cached:
        for r, n in zip(batch.prompts, batch.chunks):
            c = r.cached if r.prefilled == 0 else 0
            sq += n * n - c * c
        return sq
    for n in batch.chunks:
        sq += n * n
    return sq


class PerfStep:
    """The perf model's time for the batch alone on its instance: `mixed_time` of its prompt
    tokens, decodes and their context, with the prompts' squared tokens where the model has an
    attention term (perf/mixed.py)."""

    __slots__ = ("perf", "power", "kv_capacity", "_mixed", "_attention")

    def __init__(self, perf: PerfModel, power: PowerModel, kv_capacity: int) -> None:
        self.perf, self.power, self.kv_capacity = perf, power, kv_capacity
        self._mixed = perf.mixed_time
        self._attention = perf.attention

    def batch_time(self, m: Machine, batch: Batch) -> float:
        sq = prompt_squares(batch) if self._attention else 0
        return self._mixed(batch.prompt_tokens - batch.cached, batch.decodes, batch.context, sq)

    def stage_time(self, batch: Batch) -> float:
        sq = prompt_squares(batch) if self._attention else 0
        perf = cast(PipelinePerf, self.perf)   # a pipelined instance's (make_perf_model)
        return perf.stage_time(batch.prompt_tokens - batch.cached, batch.decodes, batch.context, sq)

    def context(self, batch: Batch) -> int:
        return batch.context

"""A serving worker's step on a measured host, as the simulator runs it (perf/step.py StepModel):
the profile's time for the batch, decodes reading KV padded as the engine pads it, with the KV it
sends inside the step, slowed by the co-run of what the host's other workers run beside it and
the time-sharing of the cores (twin/worker_timing.py WorkerTiming.slowdown)."""

from __future__ import annotations

import random
from typing import Any, Protocol

from ..perf.step import prompt_squares
from ..policy.machine import Batch
from ..policy.state import Machine
from .corun import BESIDE_DECODE, BESIDE_PROMPT
from .worker_timing import WorkerTiming


class Host(Protocol):
    """What a HostStep reads of its host (twin/machine.py MachineProfile)."""

    @property
    def perf(self) -> Any: ...

    @property
    def power(self) -> Any: ...

    @property
    def pinned(self) -> bool: ...

    @property
    def spread(self) -> tuple[tuple[float, ...], tuple[float, ...]]: ...

    @property
    def kv_capacity(self) -> int: ...

    @property
    def timing(self) -> WorkerTiming: ...

    def send_s(self, prompt_tokens: float) -> float: ...


class HostStep:
    """A serving worker's step on a measured host (perf/step.py StepModel): the profile's time for
    the batch, decodes reading KV padded as the engine pads it (`decode_kv`), with the KV it sends
    inside the step, x a factor drawn from the host's `spread` if any (`work`), slowed by the co-run
    and the time-sharing of the cores (`speed`: pinned, each worker's own core as serve places it;
    else all cores evenly). The simulator re-times a step in flight whenever another worker of the
    host starts or ends one (`shares_cores`: sim/sharing.py)."""

    __slots__ = ("host", "timing", "perf", "power", "kv_capacity", "machines", "cores", "rng", "kinds")
    shares_cores = True

    def __init__(self, host: Host, machines: list[Machine]) -> None:
        self.host, self.perf, self.power, self.kv_capacity = host, host.perf, host.power, host.kv_capacity
        self.timing = host.timing  # its workers' steps on the shared cores
        self.machines = machines
        self.cores: dict[int, frozenset[int]] = {}  # each pinned worker's cores
        self.rng = random.Random(0)  # draws from host.spread
        self.kinds: dict[int, tuple[int, int]] = {}  # each machine's step in flight (or last): (kind, size)

    def context(self, batch: Batch) -> int:
        if batch.decodes:  # the engine reads padded KV
            return self.timing.decode_kv(max(r.prompt_tokens + r.generated for r in batch.decoding), batch.decodes)
        return batch.context

    def work(self, m: Machine, batch: Batch) -> float:
        """CPU seconds of the step alone (WorkerTiming.work_s)."""
        sq = prompt_squares(batch) if self.perf.attention else 0
        computed = batch.prompt_tokens - batch.cached
        self.kinds[m.id] = (BESIDE_PROMPT, computed) if computed > 0 else (BESIDE_DECODE, batch.decodes)
        alone = self.perf.mixed_time(batch.prompt_tokens - batch.cached, batch.decodes, self.context(batch), sq)
        if factors := self.host.spread[0 if batch.prompt_tokens > 0 else 1]:  # the host's noise, drawn
            alone *= self.rng.choice(factors)
        return self.timing.work_s(alone, batch.prompt_tokens > 0, self.sent_s(m.id, batch))

    def speed(self, m: Machine, batch: Batch) -> float:
        """The step's work done per second with the host's workers busy as they are now, running
        the kinds of step they run."""
        others = sum(o.busy for o in self.machines) - 1
        beside = tuple(self.kinds[o.id] for o in self.machines if o.busy and o.id != m.id and o.id in self.kinds)
        if not self.host.pinned:
            return 1.0 / self.timing.slowdown(batch.prompt_tokens > 0, others, beside=beside)
        mine = self._cores(m.id)
        busy = [self._cores(o.id) for o in self.machines if o.busy]
        core = sum(1 for c in busy if not mine.isdisjoint(c))
        idle = self.timing.host_cores - len(frozenset().union(*busy))
        return 1.0 / self.timing.slowdown(batch.prompt_tokens > 0, others, core, max(0, idle), beside)

    def batch_time(self, m: Machine, batch: Batch) -> float:
        return self.work(m, batch) / self.speed(m, batch)

    def _cores(self, mid: int) -> frozenset[int]:
        c = self.cores.get(mid)
        if c is None:
            c = self.cores[mid] = self.timing.cores_of(mid)
        return c

    def stage_time(self, batch: Batch) -> float:
        raise ValueError("a measured machine runs one stage (its instances have pp = 1)")

    def sent_s(self, mid: int, batch: Batch) -> float:
        """CPU seconds worker `mid` spends in this step sending the KV of the prompts it ends and
        hands over now (a live worker sends inside its engine step)."""
        sent = 0.0
        for r, n in zip(batch.prompts, batch.chunks):
            if (r.token_machine != mid and r.kv_on_token_machine and r.prefilled + n == r.prefill_len
                    and r.generated + 1 < r.output_tokens):
                sent += self.host.send_s(r.prompt_tokens)
        return sent

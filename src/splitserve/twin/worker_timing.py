"""A serving worker's step on a measured host whose cores its workers share (`WorkerTiming`, the
part of twin/machine.py MachineProfile that times them): the step's work at the host's speed now,
with the serving path's step overhead and the KV it sends; its slowdown beside the host's other
workers (the measured co-run, the time-sharing of the cores with them and the background load);
the KV a decode step reads; the cores a pinned worker runs on."""

from __future__ import annotations

from dataclasses import dataclass

from .corun import Beside, figure


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerTiming:
    """The worker-step timing of a measured host: its profile's `facts` (machine.json), the steps'
    speed now against the profiled (`drift`: prompt, decode) and the cores the background takes
    (`background_cores`). MachineProfile builds it from its own fields, anew whenever they change."""

    facts: dict
    drift: tuple[float, float] = (1.0, 1.0)
    background_cores: float = 0.0

    @property
    def host_cores(self) -> int:
        """The cores the host's workers share (the profile's)."""
        return int(self.facts.get("host_cores") or 1)

    @property
    def step_overhead(self) -> float:
        """Seconds each engine step of a serving worker costs outside the model (twin/path.py)."""
        return float(self.facts.get("path", {}).get("step_overhead_s", 0.0))

    def decode_kv(self, longest: int, decodes: int) -> int:
        """KV tokens a decode step of this engine reads: every decode's blocks are gathered and
        padded to the longest one's (engine/attention.py), so `decodes` x the longest context,
        in whole blocks."""
        bs = int(self.facts.get("block_size", 1))
        return decodes * (-(-longest // bs) * bs)

    def work_s(self, alone_s: float, prompt: bool, sent_s: float = 0.0) -> float:
        """CPU seconds of a serving worker's step that takes `alone_s` on an idle machine (the perf
        model, at the host's speed now: `drift`) and sends KV for `sent_s` (MachineProfile.send_s
        of the prompts it hands over), with the serving path's step overhead."""
        return alone_s * self.drift[0 if prompt else 1] + sent_s + self.step_overhead

    def slowdown(self, prompt: bool, others_busy: int, core_busy: int | None = None, idle_cores: int = 0,
                 beside: Beside = ()) -> float:
        """How many times longer a step's work takes while `others_busy` other workers of this
        host compute (running the steps in `beside`, (kind, size) each; (): not known): the
        measured co-run slowdown (caches, memory bandwidth)
        once any other is busy, times the time-sharing of the cores. Given `core_busy`, the busy
        workers on this one's core (with it), it shares that core with them and with its part of
        the background (`background_cores`: the serving path, the client, KV transfers) that the
        `idle_cores` do not take; without it, the host's cores are shared evenly between every
        computing worker and the background. While its core is time-shared a step's work grows
        by the measured `same_core` (the processes evict each other's caches) for the shared part."""
        f = 1.0 + max(0.0, self.corun_of(prompt, beside)) if others_busy else 1.0
        if not self.facts.get("time_sharing", True):  # MachineProfile.without("corun")
            return f
        if core_busy is None:
            share = (others_busy + 1 + self.background_cores) / self.host_cores
        else:
            share = core_busy + max(0.0, self.background_cores - idle_cores) / max(1, self.host_cores - idle_cores)
        if share <= 1.0:
            return f
        grown = max(0.0, self.corun_of(prompt, beside, same_core=True))
        return max(f, 1.0 + grown * min(1.0, share - 1.0)) * share  # `same_core` holds the co-run's part

    def corun_of(self, prompt: bool, beside: Beside, same_core: bool = False) -> float:
        """The profile's co-run figure (`same_core`: the time-shared core's) for a prompt or a
        decode step beside the steps in `beside` (corun.figure)."""
        return figure(self.facts.get("corun", {}), prompt, beside, same_core)

    def step_time(self, alone_s: float, prompt: bool, others_busy: int, sent_s: float = 0.0,
                  core_busy: int | None = None, idle_cores: int = 0, beside: Beside = ()) -> float:
        """A serving worker's step (work_s) with the host as it is when it starts (slowdown)."""
        return self.work_s(alone_s, prompt, sent_s) * self.slowdown(prompt, others_busy, core_busy, idle_cores, beside)

    def cores_of(self, worker: int) -> frozenset[int]:
        """The cores worker `worker` runs on when pinned (serve's placement, worker_cpus)."""
        from ..serve.worker_args import worker_cpus
        threads = int(self.facts.get("how", {}).get("threads_per_worker", 1))
        return frozenset(worker_cpus(worker, threads, list(range(self.host_cores))))

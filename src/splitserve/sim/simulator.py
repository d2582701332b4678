"""The discrete-event simulation of one cluster.

A heap of (time, seq, kind, object) drives its events (sim/events.py): a request arrives, a
machine finishes an iteration (on a host's shared cores: sim/sharing.py), a KV transfer lands
(sim/handoff.py), a pipelined machine's first stage is free (sim/stages.py), the cluster
scheduler's watcher is due. Everything that decides *what* happens — routing, batching,
preemption, memory admission, the transfer mode — is the shared policy code in `policy/`; how long
a batch takes is the injected step-time model's (perf/step.py, one per machine, from the `Hosts`
it runs on: sim/hosts.py); this module only advances time and records what it sees. Arrivals are
pulled from the workload one at a time, so memory follows the requests in flight."""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..catalog import Catalog, ModelSpec
from ..cluster.designs import ClusterSpec
from ..errors import UserError
from ..perf.mixed import prompt_alone
from ..perf.step import StepModel
from ..policy.cluster import arrive
from ..policy.cluster_schedulers import make_cluster_scheduler
from ..policy.config import PolicyConfig
from ..policy.kv_transfer import TransferMode, choose_mode
from ..policy.latency import PerfLatency
from ..policy.machine import finish_iteration
from ..policy.schedulers import batch_former
from ..policy.predictor import arrival_predictor
from ..policy.state import Machine, Phase, Request
from ..policy.kv_allocation import DoesNotFit, configure
from ..report.goodput import GoodputSLO
from .chrome_trace import ChromeTrace
from .events import ARRIVAL, ITER_END, SHARED_END, STAGE_FREE, TRANSFER_END, TURN, WATCH
from .handoff import KVHandoff
from .hosts import CatalogHosts, Hosts
from .kv_transfer import Link
from .metrics import MachineStats, Metrics, SimResult, ref_bucket
from .prefix import PrefixCaching
from .reservation import StepReservations
from .sharing import SharedCores
from .stages import PipelineStages

_NONE: tuple = ()    # a batch with no prompt whose KV streams layer by layer


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    policy: PolicyConfig = PolicyConfig()    # the scheduling policies' settings (as `serve` runs them)
    memory_utilization: float = 0.9
    profile: str | None = None               # profile CSV; the catalog's model where it has no rows
    perf_model: str = "auto"                 # where no profile row applies: auto, operators or roofline
    decode_lookup: str = "batch-size"        # how decode times are read (perf/decode_lookup.py)
    record_requests: bool = False            # keep every Request with its token times
    machine: Hosts | None = None             # what the machines are (sim/hosts.py): a measured machine
                                             # (twin.machine.MachineProfile); None: the catalog's
    trace: ChromeTrace | None = None         # every batch and transfer, for chrome://tracing
    goodput: GoodputSLO | None = None        # count the requests meeting it
    colocated: bool = False                  # prompt and token instances share nodes: KV over NVLink
    catalog: Catalog | None = None           # machine kinds and KV-transfer overheads (None: built-in)
    prefix_caching: bool = True              # model each machine's prefix cache (a workload with prompts)
    block_size: int = 16                     # KV block tokens of the prefix caches (sim/prefix.py)


class Simulation(PrefixCaching, StepReservations, KVHandoff, PipelineStages, SharedCores):
    def __init__(self, cluster: ClusterSpec, model: ModelSpec, workload: Iterable, cfg: SimConfig = SimConfig()):
        self.cluster, self.model, self.workload, self.cfg = cluster, model, workload, cfg
        self.batching = cfg.policy.batching
        self.form_batch = batch_former(self.batching)   # the machine scheduler's form_batch, looked up once
        self.metrics = Metrics()
        self.hosts: Hosts = cfg.machine if cfg.machine is not None else CatalogHosts.of(model, cfg)
        self.machines: list[Machine] = []
        self.steps: list[StepModel] = []         # each machine's step-time model (perf/step.py)
        self.power = []
        self.links_out: list[float] = []         # when each machine's outgoing link is free
        kinds: dict[str, StepModel] = {}
        self.hw: dict[str, object] = {}
        self.perf_sources: dict[str, str] = {}
        for inst, pool, count in cluster.groups:
            name = inst.name
            step = kinds.get(name)
            if step is None:
                self.hw[name], step = self.hosts.instance(inst, self.machines)
                kinds[name] = step
                self.perf_sources[name] = step.perf.source
            cap = step.kv_capacity
            for _ in range(count):
                m = Machine(id=len(self.machines), hardware=name, home=pool, kv_capacity=cap, stages=inst.pp)
                configure(m, self.batching, cfg.block_size)   # on demand: the engine's paged blocks
                self.machines.append(m)
                self.steps.append(step)
                self.power.append(step.power)
                self.links_out.append(0.0)
                self.metrics.machines.append(MachineStats(name, pool.name.lower(), kv_capacity=cap))
        self.links: dict[tuple[str, str], Link] = {}
        self._prefix_init(workload, cfg.prefix_caching, cfg.block_size)
        self.cls = make_cluster_scheduler(self.machines, cfg.policy.routing, cluster.design.split)
        self.predictor = arrival_predictor(cfg.policy)   # a request's predicted length (a scheduler that predicts), or None
        self.cls.bind_latency(PerfLatency([s.perf for s in self.steps]))  # a scheduler placing by batch latency
        self.ref = self.hosts.reference          # SLO slowdowns against the request alone on it
        self.trace, self.pull = cfg.trace, cfg.policy.routing.kv_pull
        if self.trace is not None:
            self.trace.name_machines(self.machines)
        self.path_s = self.hosts.request_overhead   # front end, to the client
        self.kv_bytes, self.layers = model.kv_bytes_per_token, model.layers
        self.batches: list[tuple | None] = [None] * len(self.machines)   # (batch, start, dur, end, layer-wise)
        # pipelined machines (pp > 1): batches in flight, oldest first, and when each stage is free
        self.flight: dict[int, deque] = {m.id: deque() for m in self.machines if m.stages > 1}
        self.stage_free: dict[int, list[float]] = {m.id: [0.0] * m.stages for m in self.machines if m.stages > 1}
        self.heap: list = []
        self.seq = 0    # events pushed: the heap's tie-break
        self._sharing_init()
        self.reserve_late, self.awaiting = getattr(self.hosts, "reserves_between_steps", False), {}
        self.kept: list[Request] = []

    def _push(self, t: float, kind: int, obj) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

    # ---- events ------------------------------------------------------------------------------
    def _arrive(self, spec, now: float) -> None:
        mt = self.metrics
        r = Request(mt.requests, spec.arrival, spec.prompt_tokens, spec.output_tokens)
        mt.requests += 1
        mt.first_arrival, mt.last_arrival = min(mt.first_arrival, now), now
        if self.cfg.record_requests:
            r.token_times = []
            self.kept.append(r)
        r.ref_tbt = self.ref.token_time(1, r.prompt_tokens + r.output_tokens // 2)
        r.log_ref = ref_bucket(r.ref_tbt)
        if self.conversations is not None:
            self._prefix_arrive(r, spec)
        try:
            queued = arrive(self.cls, r, self.predictor, self.pull)
        except DoesNotFit as e:
            raise UserError(f"{e} ({self.machines[r.token_machine].hardware}, {self.model.name}); use larger "
                            f"machines, a smaller model or shorter requests") from None
        if queued:  # else it waits in its token machine's admit queue, holding no memory
            self._queued(r, now)

    def _start(self, m: Machine, now: float) -> None:
        batch = self.form_batch(m, self.batching)
        if batch is None:
            m.busy = False
            return
        m.busy = True
        mid = m.id
        if self.prefix and batch.prompts:
            self._prefix_start(m, batch)
        step = self.steps[mid]
        piped = m.stages > 1
        if piped:
            dur, end = self._through_stages(mid, step, batch, now)
        else:
            dur = self._shared_start(m, batch, now) if self.sharing else step.batch_time(m, batch)
            end = now + dur
        if self.trace is not None:
            self.trace.batch(mid, now, end - now, batch.prompt_tokens, batch.decodes, step.context(batch),
                             len(batch.preempted))
        mt = self.metrics
        mt.preemptions += len(batch.preempted)
        # Splitwise hand-off: with a large batch, KV of prompts finishing now streams to their
        # token machines layer by layer while the batch runs (their KV there is reserved)
        layerwise: list[Request] | tuple = _NONE
        if batch.prompts:
            mode = choose_mode(batch.prompt_tokens, self.cfg.policy.layerwise_threshold)
            for r, n in zip(batch.prompts, batch.chunks):
                if r.prompt_started_at < 0:
                    r.prompt_started_at = now
                    mt.queue.add(now - r.arrival)
                elif r.generated:                 # a recompute after a preemption
                    mt.recomputed_tokens += n
                if (mode is TransferMode.LAYERWISE and r.token_machine != mid
                        and r.prefilled + n == r.prefill_len and r.kv_on_token_machine):
                    if not isinstance(layerwise, list):
                        layerwise = []
                    layerwise.append(r)
        if piped:
            self.flight[mid].append((batch, now, dur, end, layerwise))
        else:
            self.batches[mid] = (batch, now, dur, end, layerwise)
        w = self.power[mid].prompt_power_w(batch.prompt_tokens + batch.decodes) if batch.prompt_tokens else \
            self.power[mid].token_power_w(batch.decodes)
        st = mt.machines[mid]
        st.busy_s += dur / m.stages if piped else dur     # each stage is busy for its share
        st.energy_j += w * dur
        st.iterations += 1
        st.prompt_tokens += batch.prompt_tokens
        st.decode_tokens += batch.decodes
        if m.kv_used > st.peak_kv_used:
            st.peak_kv_used = m.kv_used
        if self.sharing:
            self._reshare(now)   # times this step and those it slows (sim/sharing.py)
        else:
            self._push(end, ITER_END, m)
        if batch.preempted and not m.recompute_here:  # back through the prompt pool (sim/handoff.py)
            self._readmit(m, batch.preempted, now)

    def _iter_end(self, m: Machine, now: float) -> None:
        if m.stages > 1:
            batch, start, dur, _, layerwise = self.flight[m.id].popleft()
        else:
            batch, start, dur, _, layerwise = self.batches[m.id]  # type: ignore[misc]  # set by _start
            self.batches[m.id] = None
        mt = self.metrics
        tbt, slow = mt.tbt, mt.slow_tbt
        ngap = mt.decode_gaps(batch.decoding, now)  # every decode of the batch produced a token now
        res = finish_iteration(m, batch)
        mt.tokens += ngap + len(res.first_tokens)
        freed = bool(res.finished)
        for r in res.first_tokens:
            if r.first_token_at < 0:
                r.first_token_at = now
                ttft = now - r.arrival + self.path_s
                mt.ttft.add(ttft)
                mt.slow_ttft.add(ttft / prompt_alone(self.ref, r.prompt_tokens))
            else:                                 # recomputed after a preemption
                g = now - r.last_token_at
                tbt.add(g)
                slow.add(g / r.ref_tbt)
            r.last_token_at = now
            if r.token_times is not None:
                r.token_times.append(now)
            if self.prefix:
                self._prefix_named(m, r)
            if r.phase is Phase.HANDOFF:
                self._handoff(m, r, start, now, r in layerwise)
        for r in res.finished:
            mt.complete(r, now, self.path_s, prompt_alone(self.ref, r.prompt_tokens), self.cfg.goodput)
            if self.conversations is not None:
                self._prefix_complete(r, now)
        self.cls.settle(m)
        if m.stages == 1:
            m.busy = False
        if freed:
            self._freed(m, now)
        elif not m.busy:
            self._start(m, now)
        if self.reserve_late:
            self._reserved(m, now)

    def _watch(self, now: float) -> None:
        """The cluster scheduler's watcher (policy/instance_flip.py), every `watch_interval` while other
        events are due (the run's end, `sim_end`, may fall up to one interval after its last other)."""
        for m in self.cls.watch(now):
            if not m.busy:
                self._start(m, now)
        if self.heap:
            self._push(now + self.cls.watch_interval, WATCH, None)

    # ---- driver ------------------------------------------------------------------------------
    def run(self, progress: Callable[[float, int], None] | None = None) -> SimResult:
        wall0 = time.perf_counter()
        arrivals = iter(self.workload)
        heap = self.heap
        pop = heapq.heappop
        first = next(arrivals, None)
        if first is not None:
            self._push(first.arrival, ARRIVAL, first)
            if self.cls.watch_interval:
                self._push(first.arrival, WATCH, None)
        events = 0
        now = 0.0
        while heap:
            now, _, kind, obj = pop(heap)
            events += 1
            if kind == ITER_END:
                self._iter_end(obj, now)
            elif kind == ARRIVAL:
                self._arrive(obj, now)
                nxt = next(arrivals, None)
                if nxt is not None:
                    self._push(nxt.arrival, ARRIVAL, nxt)
            elif kind == TURN:
                self._arrive(obj, now)
            elif kind == TRANSFER_END:
                self._transfer_end(obj, now)
            elif kind == STAGE_FREE:
                self._stage_free(obj, now)
            elif kind == SHARED_END:
                self._shared_end(obj, now)
            else:
                self._watch(now)
            if progress is not None and not events & 0xFFFF:
                progress(now, events)
        mt = self.metrics
        for m, st in zip(self.machines, mt.machines):
            idle = max(now - st.busy_s, 0.0)
            st.energy_j += idle * self.power[m.id].idle_power_w() * m.stages   # every stage idles
        stuck = [m.id for m in self.machines if m.has_work() or m.admit_queue]
        if stuck or mt.completed != mt.requests:
            raise RuntimeError(f"simulation ended with work left on machines {stuck} "
                               f"({mt.completed}/{mt.requests} completed)")
        return SimResult(metrics=mt, cluster=self.cluster, model=self.model.name, events=events,
                         wall_s=time.perf_counter() - wall0, sim_end=now,
                         borrowed=self.cls.borrowed, perf_sources=self.perf_sources,
                         requests=self.kept, hardware=self.hw, scaling=self.cls.activity(now))

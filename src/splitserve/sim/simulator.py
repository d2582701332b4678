"""The discrete-event simulation of one cluster.

A heap of (time, seq, kind, object) drives its events (sim/events.py): a request arrives, a
machine finishes an iteration (on a host's shared cores: sim/sharing.py), a KV transfer lands
(sim/handoff.py), a pipelined machine's first stage is free (sim/stages.py), the cluster
scheduler's watcher is due. Everything that decides *what* happens — routing, batching,
preemption, memory admission, the transfer mode — is the shared policy code in `policy/`; how long
a batch takes is the injected step-time model's (perf/step.py, one per machine, from the `Hosts`
it runs on: sim/hosts.py); this module only advances time and records what it sees. Arrivals are
pulled from the workload one at a time, so memory follows the requests in flight.

`Simulation` owns its parts, each a plain object with its own state and the `SimState` they share
(sim/state.py): `PrefixCaches` (sim/prefix.py), `KVHandoff`, `PipelineStages`, `SharedCores` and
`StepReservations`. The parts never start a machine: they say what changed, and the simulation
forms the next batch."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from typing import cast

from ..catalog import ModelSpec
from ..cluster.designs import ClusterSpec
from ..errors import UserError
from ..perf.mixed import prompt_alone
from ..perf.step import SharedStep
from ..policy.cluster import admit_freed, arrive, readmit
from ..policy.cluster_schedulers import make_cluster_scheduler
from ..policy.kv_allocation import DoesNotFit
from ..policy.latency import PerfLatency
from ..policy.machine import finish_iteration
from ..policy.predictor import arrival_predictor
from ..policy.preemption import sent_back
from ..policy.schedulers import batch_former
from ..policy.state import Machine, Phase, Request
from ..policy.transitions import kv_landed
from ..workload.conversations import Conversations
from .config import SimConfig
from .events import ARRIVAL, ITER_END, SHARED_END, STAGE_FREE, TRANSFER_END, TURN, WATCH, Arrival
from .handoff import KVHandoff
from .hosts import CatalogHosts, Hosts
from .machines import build_machines
from .metrics import Metrics, SimResult, ref_bucket
from .prefix import PrefixCaches
from .reservation import StepReservations
from .sharing import SharedCores
from .stages import PipelineStages
from .state import Layerwise, SimState

_NONE: tuple[Request, ...] = ()    # no prompt of the batch streams its KV layer by layer


class Simulation:
    """One run of `workload` on `cluster`: its machines (each with its step-time model and power),
    the cluster scheduler, and its parts (the module's docstring)."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, workload: Iterable[Arrival],
                 cfg: SimConfig = SimConfig()) -> None:
        self.cluster, self.model, self.workload, self.cfg = cluster, model, workload, cfg
        self.batching = cfg.policy.batching
        self.form_batch = batch_former(self.batching)   # the machine scheduler's form_batch, looked up once
        self.metrics = Metrics()
        self.hosts: Hosts = cfg.machine if cfg.machine is not None else CatalogHosts(
            model, cfg.profile, cfg.memory_utilization, cfg.colocated, cfg.catalog, cfg.perf_model, cfg.decode_lookup)
        built = build_machines(cluster, self.hosts, self.batching, cfg.block_size, self.metrics.machines)
        self.machines, self.steps, self.power = built.machines, built.steps, built.power
        self.hw, self.perf_sources = built.hw, built.perf_sources
        self.state = state = SimState(self.machines, self.metrics)
        self.path_s = self.hosts.request_overhead   # front end, to the client
        self.prefix = PrefixCaches(state, workload, cfg.prefix_caching, cfg.block_size, self.path_s) \
            if isinstance(workload, Conversations) else None
        self.cls = make_cluster_scheduler(self.machines, cfg.policy.routing, cluster.design.split)
        self.predictor = arrival_predictor(cfg.policy)   # a request's predicted length (a scheduler that predicts), or None
        self.cls.bind_latency(PerfLatency([s.perf for s in self.steps]))  # a scheduler placing by batch latency
        self.ref = self.hosts.reference          # SLO slowdowns against the request alone on it
        self.trace, self.pull = cfg.trace, cfg.policy.routing.kv_pull
        if self.trace is not None:
            self.trace.name_machines(self.machines)
        self.handoff = KVHandoff(state, self.hosts, self.trace, model, cfg.block_size,
                                 cfg.policy.layerwise_threshold)
        self.stages = PipelineStages(state)
        self.shared = SharedCores(state, cast(list[SharedStep], self.steps)) \
            if any(getattr(s, "shares_cores", False) for s in self.steps) else None   # a measured host's: all its steps
        self.reservations = StepReservations(state) \
            if getattr(self.hosts, "reserves_between_steps", False) else None
        self.kept: list[Request] = []

    def _arrive(self, spec: Arrival, now: float) -> None:
        mt = self.metrics
        r = Request(mt.requests, spec.arrival, spec.prompt_tokens, spec.output_tokens)
        mt.requests += 1
        mt.first_arrival, mt.last_arrival = min(mt.first_arrival, now), now
        if self.cfg.record_requests:
            r.token_times = []
            self.kept.append(r)
        r.ref_tbt = self.ref.token_time(1, r.prompt_tokens + r.output_tokens // 2)
        r.log_ref = ref_bucket(r.ref_tbt)
        if self.prefix is not None:
            self.prefix.arrive(r, spec)
        try:
            queued = arrive(self.cls, r, self.predictor, self.pull)
        except DoesNotFit as e:
            raise UserError(f"{e} ({self.machines[r.token_machine].hardware}, {self.model.name}); use larger "
                            f"machines, a smaller model or shorter requests") from None
        if queued:  # else it waits in its token machine's admit queue, holding no memory
            self._queued(r, now)

    def _queued(self, r: Request, now: float) -> None:
        """`r`'s prompt was queued on its prompt machine: an idle one starts, unless `r` waits for its
        token machine to reserve between steps (a measured machine's: sim/reservation.py)."""
        p = self.machines[r.prompt_machine]
        res = self.reservations
        if not (res is not None and res.holds(r, p)) and not p.busy:
            self._start(p, now)

    def _start(self, m: Machine, now: float) -> None:
        batch = self.form_batch(m, self.batching)
        if batch is None:
            m.busy = False
            return
        m.busy = True
        mid = m.id
        if self.prefix is not None and batch.prompts:
            self.prefix.start(m, batch)
        step = self.steps[mid]
        piped = m.stages > 1
        shared = self.shared
        if piped:
            dur, end = self.stages.through_stages(mid, step, batch, now)
        else:
            dur = shared.start(m, batch, now) if shared is not None else step.batch_time(m, batch)
            end = now + dur
        if self.trace is not None:
            self.trace.batch(mid, now, end - now, batch.prompt_tokens, batch.decodes, step.context(batch),
                             len(batch.preempted))
        layerwise: Layerwise = _NONE
        if batch.prompts:
            self.metrics.prompts_started(batch, now)
            layerwise = self.handoff.streamed(mid, batch)
        if piped:
            self.stages.flight[mid].append((batch, now, dur, end, layerwise))
        else:
            self.state.running[mid] = (batch, now, dur, end, layerwise)
        power = self.power[mid]
        w = power.prompt_power_w(batch.prompt_tokens + batch.decodes) if batch.prompt_tokens else \
            power.token_power_w(batch.decodes)
        self.metrics.preemptions += len(batch.preempted)
        self.metrics.machines[mid].ran(dur / m.stages if piped else dur, w * dur, batch, m.kv_used)
        if shared is not None:
            shared.reshare(now)   # times this step and those it slows (sim/sharing.py)
        else:
            self.state.push(end, ITER_END, m)
        if batch.preempted and not m.recompute_here:  # back through the prompt pool
            self._readmit(m, batch.preempted, now)

    def _iter_end(self, m: Machine, now: float) -> None:
        if m.stages > 1:
            batch, start, dur, _, layerwise = self.stages.flight[m.id].popleft()
        else:
            run = self.state.running[m.id]
            assert run is not None   # set by _start
            batch, start, dur, _, layerwise = run
            self.state.running[m.id] = None
        mt = self.metrics
        tbt, slow = mt.tbt, mt.slow_tbt
        ngap = mt.decode_gaps(batch.decoding, now)  # every decode of the batch produced a token now
        res = finish_iteration(m, batch)
        mt.tokens += ngap + len(res.first_tokens)
        freed = bool(res.finished)
        prefix = self.prefix
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
            if prefix is not None:
                prefix.named(m, r)
            if r.phase is Phase.HANDOFF:
                self.handoff.send(m, r, start, now, r in layerwise)
        for r in res.finished:
            mt.complete(r, now, self.path_s, prompt_alone(self.ref, r.prompt_tokens), self.cfg.goodput)
            if prefix is not None:
                prefix.complete(r, now)
        self.cls.settle(m)
        if m.stages == 1:
            m.busy = False
        if freed:
            self._freed(m, now)
        elif not m.busy:
            self._start(m, now)
        if self.reservations is not None:
            for _, p in self.reservations.answered(m) or ():
                if not p.busy:
                    self._start(p, now)

    def _transfer_end(self, r: Request, now: float) -> None:
        """`r`'s KV landed on its token machine: the prompt machine's copy is freed."""
        p = self.machines[r.prompt_machine]
        t = self.machines[r.token_machine]
        kv_landed(p, t, r)
        if self.prefix is not None:
            self.prefix.named(t, r)
        if not t.busy:
            self._start(t, now)
        self._freed(p, now)

    def _readmit(self, m: Machine, preempted: list[Request], now: float) -> None:
        """Decodes `m` preempted that recompute through the prompt pool (policy/preemption.py
        requeue): admitted again as at their arrival (policy/cluster.py readmit)."""
        for r in sent_back(m, preempted):
            if readmit(self.cls, r, self.pull):
                self._queued(r, now)

    def _freed(self, m: Machine, now: float) -> None:
        """KV memory was released on `m`: requests waiting for it may go, and `m` may resume."""
        if m.admit_queue:
            for r in admit_freed(self.cls, m):
                p = self.machines[r.prompt_machine]
                if r.phase is Phase.HANDOFF:  # pulled: its KV leaves its prompt machine now
                    self.handoff.send(p, r, now, now, False)
                elif not p.busy:
                    self._start(p, now)
        if not m.busy:
            self._start(m, now)

    def _watch(self, now: float) -> None:
        """The cluster scheduler's watcher (policy/instance_flip.py), every `watch_interval` while other
        events are due (the run's end, `sim_end`, may fall up to one interval after its last other)."""
        for m in self.cls.watch(now):
            if not m.busy:
                self._start(m, now)
        if self.state.heap:
            self.state.push(now + self.cls.watch_interval, WATCH, None)

    def run(self, progress: Callable[[float, int], None] | None = None) -> SimResult:
        wall0 = time.perf_counter()
        arrivals = iter(self.workload)
        state = self.state
        heap = state.heap
        pop = heapq.heappop
        first = next(arrivals, None)
        if first is not None:
            state.push(first.arrival, ARRIVAL, first)
            if self.cls.watch_interval:
                state.push(first.arrival, WATCH, None)
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
                    state.push(nxt.arrival, ARRIVAL, nxt)
            elif kind == TURN:
                self._arrive(obj, now)
            elif kind == TRANSFER_END:
                self._transfer_end(obj, now)
            elif kind == STAGE_FREE:
                if self.stages.first_free(obj, now):
                    self._start(obj, now)
            elif kind == SHARED_END:
                if self.shared is not None and self.shared.current(obj):
                    self._iter_end(obj[0], now)
                    self.shared.reshare(now)
            else:
                self._watch(now)
            if progress is not None and not events & 0xFFFF:
                progress(now, events)
        return self._result(now, events, time.perf_counter() - wall0)

    def _result(self, end: float, events: int, wall_s: float) -> SimResult:
        """The run's result, its machines' idle energy added; a run that left work undone fails."""
        mt = self.metrics
        for m, st in zip(self.machines, mt.machines):
            idle = max(end - st.busy_s, 0.0)
            st.energy_j += idle * self.power[m.id].idle_power_w() * m.stages   # every stage idles
        stuck = [m.id for m in self.machines if m.has_work() or m.admit_queue]
        if stuck or mt.completed != mt.requests:
            raise RuntimeError(f"simulation ended with work left on machines {stuck} "
                               f"({mt.completed}/{mt.requests} completed)")
        return SimResult(metrics=mt, cluster=self.cluster, model=self.model.name, events=events,
                         wall_s=wall_s, sim_end=end,
                         borrowed=self.cls.borrowed, perf_sources=self.perf_sources,
                         requests=self.kept, hardware=self.hw, scaling=self.cls.activity(end))

"""The discrete-event simulation of one cluster.

A heap of (time, seq, kind, object) drives three events: a request arrives, a machine finishes an
iteration, a KV transfer lands. Everything that decides *what* happens — routing, batching,
preemption, memory admission, the transfer mode — is the shared policy code in `policy/`; this
module only advances time with the performance model and records what it sees. Arrivals are
pulled from the workload one at a time, so memory follows the requests in flight.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..catalog import kv_capacity_tokens, load_hardware
from ..instance import instance_spec
from ..designs import ClusterSpec
from ..errors import UserError
from ..perf import make_perf_model
from ..policy.cluster import admit, admit_freed, make_cluster_scheduler, pull_kv
from ..policy.config import PolicyConfig
from ..policy.kv_transfer import TransferMode, choose_mode
from ..policy.machine import Batch, batch_former, finish_iteration
from ..policy.predictor import arrival_predictor, predict
from ..policy.state import Machine, Phase, Request
from ..policy.transitions import DoesNotFit, kv_landed
from .kv_transfer import Link, layerwise_done, link_between, serialized_done
from .metrics import MachineStats, Metrics

_ARRIVAL, _ITER_END, _TRANSFER_END, _STAGE_FREE, _WATCH = 0, 1, 2, 3, 4
_NONE: tuple = ()    # a batch with no prompt whose KV streams layer by layer
REFERENCE_HARDWARE = "dgx-a100"     # SLOs are slowdowns against an uncontended DGX-A100 (Table VI)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    policy: PolicyConfig = PolicyConfig()    # the scheduling policies' settings (as `serve` runs them)
    memory_utilization: float = 0.9
    profile: str | None = None               # profile CSV; roofline model where it has no rows
    record_requests: bool = False            # keep every Request with its token times
    machine: object = None                   # a measured machine (twin.machine.MachineProfile) in
                                             # place of the catalog's hardware, for every machine
    trace: object = None                     # a chrome_trace.ChromeTrace: every batch and transfer
    goodput: object = None                   # a report.goodput.GoodputSLO: count the requests meeting it
    colocated: bool = False                  # prompt and token instances share nodes: KV over NVLink
    catalog: object = None                   # a catalog.Catalog: the machine kinds and KV-transfer
                                             # overheads looked up (None: the built-in catalog)


@dataclass(slots=True)
class SimResult:
    metrics: Metrics
    cluster: ClusterSpec
    model: str
    events: int
    wall_s: float
    sim_end: float
    borrowed: int
    perf_sources: dict[str, str]
    requests: list[Request] = field(default_factory=list)
    hardware: dict = field(default_factory=dict)  # name -> spec with cost_per_hour and power_kw
    scaling: dict | None = None                   # a scaling scheduler's activity (policy/aladdin.py)


class Simulation:
    def __init__(self, cluster: ClusterSpec, model, workload: Iterable, cfg: SimConfig = SimConfig()):
        self.cluster = cluster
        self.model = model
        self.workload = workload
        self.cfg = cfg
        self.batching = cfg.policy.batching
        self.form_batch = batch_former(self.batching)   # policy/machine.py form_batch, looked up once
        self.metrics = Metrics()
        self.machines: list[Machine] = []
        self.perf = []
        self.power = []
        self.links_out: list[float] = []         # when each machine's outgoing link is free
        hw_cache: dict[str, tuple] = {}
        self.perf_sources: dict[str, str] = {}
        for inst, pool, count in cluster.groups:
            name = inst.name
            if name not in hw_cache and cfg.machine is not None:
                hw_cache[name] = (cfg.machine, cfg.machine.perf, cfg.machine.power, cfg.machine.kv_capacity)
                self.perf_sources[name] = cfg.machine.perf.source
            elif name not in hw_cache:
                spec = instance_spec(inst, cfg.catalog)
                perf, power = make_perf_model(model, spec.hw, inst.tp, cfg.profile, inst.pp, inst.ep)
                cap = kv_capacity_tokens(model, spec.hw, inst.tp, cfg.memory_utilization, inst.pp)
                hw_cache[name] = (spec, perf, power, cap)
                self.perf_sources[name] = perf.source
            hw, perf, power, cap = hw_cache[name]
            for _ in range(count):
                m = Machine(id=len(self.machines), hardware=name, home=pool, kv_capacity=cap, stages=inst.pp)
                self.machines.append(m)
                self.perf.append(perf)
                self.power.append(power)
                self.links_out.append(0.0)
                self.metrics.machines.append(MachineStats(name, pool.name.lower(), kv_capacity=cap))
        self.hw = {name: v[0] for name, v in hw_cache.items()}
        self.links: dict[tuple[str, str], Link] = {}
        self.cls = make_cluster_scheduler(self.machines, cfg.policy.routing, cluster.design.split)
        self.predictor = arrival_predictor(cfg.policy)   # a request's predicted length (ecoserve), or None
        bind = getattr(self.cls, "bind_latency", None)
        if bind is not None:  # it places by batch latency (policy/aladdin.py): the perf models that time the batches
            from ..policy.aladdin import PerfLatency
            bind(PerfLatency(self.perf))
        if cfg.machine is not None:  # SLO slowdowns against the same request alone on this machine
            self.ref = cfg.machine.perf
        else:
            self.ref, _ = make_perf_model(model, load_hardware(REFERENCE_HARDWARE), None, cfg.profile)
        self.host = cfg.machine
        self.trace = cfg.trace
        self.pull = cfg.policy.routing.kv_pull
        if self.trace is not None:
            self.trace.name_machines(self.machines)
        self.path_s = cfg.machine.request_overhead if cfg.machine is not None else 0.0  # front end, to the client
        self.kv_bytes = model.kv_bytes_per_token
        self.layers = model.layers
        self.batches: list[tuple | None] = [None] * len(self.machines)   # (batch, start, dur, end, layer-wise)
        # pipelined machines (pp > 1): batches in flight, oldest first, and when each stage is free
        self.flight: dict[int, deque] = {m.id: deque() for m in self.machines if m.stages > 1}
        self.stage_free: dict[int, list[float]] = {m.id: [0.0] * m.stages for m in self.machines if m.stages > 1}
        self.heap: list = []
        self.seq = 0
        self.kept: list[Request] = []

    # ---- links -------------------------------------------------------------------------------
    def _link(self, src: Machine, dst: Machine) -> Link:
        key = (src.hardware, dst.hardware)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = (self.cfg.machine.link if self.cfg.machine is not None
                                      else link_between(self.hw[src.hardware].hw, self.hw[dst.hardware].hw, self.cfg.colocated,
                                                     self.cfg.catalog))
        return link

    def _push(self, t: float, kind: int, obj) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

    # ---- events ------------------------------------------------------------------------------
    def _arrive(self, spec, now: float) -> None:
        mt = self.metrics
        r = Request(mt.requests, spec.arrival, spec.prompt_tokens, spec.output_tokens)
        if self.predictor is not None:
            predict(r, self.predictor)
        mt.requests += 1
        if now < mt.first_arrival:
            mt.first_arrival = now
        mt.last_arrival = now
        if self.cfg.record_requests:
            r.token_times = []
            self.kept.append(r)
        n = r.output_tokens
        ref = self.ref
        r.ref_tbt = ref.token_time(1, r.prompt_tokens + n // 2)
        try:
            queued = admit(self.cls, r, self.pull)
        except DoesNotFit as e:
            raise UserError(f"{e} ({self.machines[r.token_machine].hardware}, {self.model.name}); use larger "
                            f"machines, a smaller model or shorter requests") from None
        if queued:  # else it waits in its token machine's admit queue, holding no memory
            p = self.machines[r.prompt_machine]
            if not p.busy:
                self._start(p, now)

    def _start(self, m: Machine, now: float) -> None:
        batch = self.form_batch(m, self.batching)
        if batch is None:
            m.busy = False
            return
        m.busy = True
        mid = m.id
        perf = self.perf[mid]
        sq = 0
        if perf.attention:  # each prompt attends to its own tokens (perf/mixed.py)
            for n in batch.chunks:
                sq += n * n
        ctx = batch.context
        if self.host is not None and batch.decodes:  # the engine reads padded KV (twin/machine.py)
            ctx = self.host.decode_kv(max(r.prompt_tokens + r.generated for r in batch.decoding), batch.decodes)
        piped = m.stages > 1
        if piped:
            dur, end = self._through_stages(mid, perf, batch, ctx, sq, now)
        else:
            dur = perf.mixed_time(batch.prompt_tokens, batch.decodes, ctx, sq)
            if self.host is not None:  # workers of one measured host share it (twin/machine.py)
                dur = self.host.step_time(dur, batch.prompt_tokens > 0, sum(o.busy for o in self.machines) - 1,
                                          self._sent_s(mid, batch))
            end = now + dur
        if self.trace is not None:
            self.trace.batch(mid, now, end - now, batch.prompt_tokens, batch.decodes, ctx, len(batch.preempted))
        mt = self.metrics
        for v in batch.preempted:
            mt.preemptions += 1
        # Splitwise hand-off: with a large batch, KV of prompts finishing now streams to their
        # token machines layer by layer while the batch runs (their KV there is reserved)
        layerwise = _NONE
        if batch.prompts:
            mode = choose_mode(batch.prompt_tokens, self.cfg.policy.layerwise_threshold)
            for r, n in zip(batch.prompts, batch.chunks):
                if r.prompt_started_at < 0:
                    r.prompt_started_at = now
                    mt.queue.add(now - r.arrival)
                if (mode is TransferMode.LAYERWISE and r.token_machine != mid
                        and r.prefilled + n == r.prefill_len and r.kv_on_token_machine):
                    if layerwise is _NONE:
                        layerwise = []
                    layerwise.append(r)
        if piped:
            self.flight[mid].append((batch, now, dur, end, layerwise))
        else:
            self.batches[mid] = (batch, now, dur, end, layerwise)
        if batch.prompt_tokens:
            w = self.power[mid].prompt_power_w(batch.prompt_tokens + batch.decodes)
        else:
            w = self.power[mid].token_power_w(batch.decodes)
        st = mt.machines[mid]
        st.busy_s += dur / m.stages if piped else dur     # each stage is busy for its share
        st.energy_j += w * dur
        st.iterations += 1
        st.prompt_tokens += batch.prompt_tokens
        st.decode_tokens += batch.decodes
        if m.kv_used > st.peak_kv_used:
            st.peak_kv_used = m.kv_used
        self._push(end, _ITER_END, m)

    def _sent_s(self, mid: int, batch: Batch) -> float:
        """CPU seconds a measured host's worker `mid` spends in this step sending the KV of the
        prompts it ends and hands over now (a live worker sends inside its engine step)."""
        sent = 0.0
        for r, n in zip(batch.prompts, batch.chunks):
            if (r.token_machine != mid and r.kv_on_token_machine and r.prefilled + n == r.prefill_len
                    and r.generated + 1 < r.output_tokens):
                sent += self.host.send_s(r.prompt_tokens)
        return sent

    def _through_stages(self, mid: int, perf, batch: Batch, ctx: int, sq: int, now: float) -> tuple[float, float]:
        """A pipelined machine's batch goes through its stages: stage s starts when the batch is
        out of stage s - 1 (and has hopped to it) and stage s is free (perf/pipeline.py). Returns
        (the stages' compute, when the batch leaves the last stage); the machine may form its next
        batch when stage 0 is free."""
        stage = perf.stage_time(batch.prompt_tokens, batch.decodes, ctx, sq)
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
                t += perf.hop_time(s, tokens)
        self._push(free[0], _STAGE_FREE, self.machines[mid])
        return stage * (last + 1), t

    def _stage_free(self, m: Machine, now: float) -> None:
        """A pipelined machine's first stage is free: it may start another batch."""
        if m.busy and now >= self.stage_free[m.id][0]:
            m.busy = False
            self._start(m, now)

    def _iter_end(self, m: Machine, now: float) -> None:
        if m.stages > 1:
            batch, start, dur, _, layerwise = self.flight[m.id].popleft()
        else:
            batch, start, dur, _, layerwise = self.batches[m.id]
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
                mt.slow_ttft.add(ttft / self.ref.prompt_time(r.prompt_tokens))
            else:                                 # recomputed after a preemption
                g = now - r.last_token_at
                tbt.add(g)
                slow.add(g / r.ref_tbt)
            r.last_token_at = now
            if r.token_times is not None:
                r.token_times.append(now)
            if r.phase is Phase.HANDOFF:
                self._handoff(m, r, start, now, r in layerwise)
        for r in res.finished:
            self._complete(r, now)
        self.cls.settle(m)
        if m.stages == 1:
            m.busy = False
        if freed:
            self._freed(m, now)
        elif not m.busy:
            self._start(m, now)

    def _handoff(self, p: Machine, r: Request, start: float, end: float, layerwise: bool) -> None:
        """Prefill of `r` done on prompt machine `p`: send its KV to its token machine (with pull,
        once that one has memory for it: policy/cluster.py pull_kv; else _freed sends it later)."""
        t = self.machines[r.token_machine]
        if not r.kv_on_token_machine and not pull_kv(t, r):
            return
        link = self._link(p, t)
        nbytes = r.prompt_tokens * self.kv_bytes
        mt = self.metrics
        if layerwise:
            ready = start
            done = layerwise_done(link, nbytes, self.layers, start, end)
            mt.transfer_layerwise += 1
        else:
            ready = max(end, self.links_out[p.id])
            done = serialized_done(link, nbytes, ready)
            self.links_out[p.id] = done
        if self.trace is not None:
            self.trace.transfer(p.id, t.id, r.id, ready, done, nbytes, layerwise)
        mt.transfers += 1
        mt.transfer_bytes += nbytes
        mt.transfer_visible.add(done - end)
        self._push(done, _TRANSFER_END, r)

    def _transfer_end(self, r: Request, now: float) -> None:
        p = self.machines[r.prompt_machine]
        t = self.machines[r.token_machine]
        kv_landed(p, t, r)
        if not t.busy:
            self._start(t, now)
        self._freed(p, now)

    def _freed(self, m: Machine, now: float) -> None:
        """KV memory was released on `m`: requests waiting for it may go, and `m` may resume."""
        if m.admit_queue:
            for r in admit_freed(self.cls, m):
                p = self.machines[r.prompt_machine]
                if r.phase is Phase.HANDOFF:  # pulled: its KV leaves its prompt machine now
                    self._handoff(p, r, now, now, False)
                elif not p.busy:
                    self._start(p, now)
        if not m.busy:
            self._start(m, now)

    def _complete(self, r: Request, now: float) -> None:
        mt = self.metrics
        mt.completed += 1
        e2e = now - r.arrival + self.path_s
        mt.e2e.add(e2e)
        ref = self.ref.prompt_time(r.prompt_tokens) + (r.output_tokens - 1) * r.ref_tbt
        mt.slow_e2e.add(e2e / ref)
        slo = self.cfg.goodput
        if slo is not None and slo.meets(r.first_token_at - r.arrival + self.path_s, r.first_token_at, now,
                                         r.output_tokens):
            mt.attained += 1
        if now > mt.last_completion:
            mt.last_completion = now

    def _watch(self, now: float) -> None:
        """The cluster scheduler's periodic watcher (TetriInfer's instance flip,
        policy/instance_flip.py): every `watch_interval` of simulated time while other events are
        due (so the run's end, `sim_end`, may fall up to one interval after its last other event)."""
        for m in self.cls.watch(now):
            if not m.busy:
                self._start(m, now)
        if self.heap:
            self._push(now + self.cls.watch_interval, _WATCH, None)

    # ---- driver ------------------------------------------------------------------------------
    def run(self, progress: Callable[[float, int], None] | None = None) -> SimResult:
        wall0 = time.perf_counter()
        arrivals = iter(self.workload)
        heap = self.heap
        pop = heapq.heappop
        first = next(arrivals, None)
        if first is not None:
            self._push(first.arrival, _ARRIVAL, first)
            if getattr(self.cls, "watch_interval", 0):
                self._push(first.arrival, _WATCH, None)
        events = 0
        now = 0.0
        while heap:
            now, _, kind, obj = pop(heap)
            events += 1
            if kind == _ITER_END:
                self._iter_end(obj, now)
            elif kind == _ARRIVAL:
                self._arrive(obj, now)
                nxt = next(arrivals, None)
                if nxt is not None:
                    self._push(nxt.arrival, _ARRIVAL, nxt)
            elif kind == _TRANSFER_END:
                self._transfer_end(obj, now)
            elif kind == _STAGE_FREE:
                self._stage_free(obj, now)
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
                         requests=self.kept, hardware=self.hw,
                         scaling=self.cls.activity(now) if hasattr(self.cls, "activity") else None)

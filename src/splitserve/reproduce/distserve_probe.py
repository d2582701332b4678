"""One simulation of a DistServe counterfactual (`Probe`) and the goodput search over it: the
same clusters as provision/placement/'s jobs (an unsplit vLLM instance, or prompt and token
instances of one DGX-A100 kind with no mixed pool, KV over NVLink), with the settings a `Job`
cannot carry: a per-step time added to every batch (a serving system's overhead outside the
GPU), the preemption limit, the KV pull, fixed request sizes (DistServe's Figure 1: 512 in,
64 out); and the KV allocation (on demand, as the jobs allocate it, or the reserve rule of the
counterfactuals). Without those, a probe simulates exactly what its `Job` does (the tests check
that the vLLM goodput equals the main run's)."""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from ..catalog import load_model
from ..cluster.designs import Parallelism, make_cluster
from ..policy.config import PolicyConfig
from ..provision.search import RateLattice, max_rate
from ..report.goodput import GoodputSLO
from ..sim.hosts import CatalogHosts
from ..sim.config import SimConfig
from ..sim.simulator import Simulation
from ..workload import RequestSpec, make_workload

TARGET = 0.9            # DistServe's attainment target (§6.1)
MIN_DURATION = 20.0     # as provision/placement's Scenario: duration = max(20 s, requests / rate)


@dataclass(frozen=True)
class Probe:
    model: str
    workload: str                          # a synthetic workload, or "fixed:PROMPT:OUTPUT"
    prompt: tuple[int, int] | None = None  # split: (instances, tp) of the prompt pool; None: unsplit
    token: tuple[int, int] | None = None   # split: (instances, tp) of the token pool
    tp: int = 1                            # unsplit: the instance's tensor degree
    pp: int = 1                            # pipeline stages of every instance
    scheduler: str | None = "vllm"         # machine scheduler (None: the default batching)
    preemption_limit: int = 3
    kv_allocation: str = "on-demand"       # as vLLM and DistServe allocate (policy/kv_allocation.py)
    overhead_s: float = 0.0                # seconds added to every batch
    kv_pull: bool = False
    perf_model: str = "auto"
    requests: int = 400
    seed: int = 0
    max_context: int = 2048                # OPT's context (prompt + output clipped to it)
    gpus: int = 1                          # GPUs a per-GPU rate divides by


class _Slower:
    """A step model whose every batch takes `extra` seconds more."""

    __slots__ = ("inner", "perf", "power", "kv_capacity", "extra")

    def __init__(self, inner, extra: float) -> None:
        self.inner, self.extra = inner, extra
        self.perf, self.power, self.kv_capacity = inner.perf, inner.power, inner.kv_capacity

    def batch_time(self, m, batch) -> float:
        return self.inner.batch_time(m, batch) + self.extra

    def stage_time(self, batch) -> float:
        return self.inner.stage_time(batch) + self.extra

    def context(self, batch) -> int:
        return self.inner.context(batch)


class _OverheadHosts(CatalogHosts):
    def __init__(self, *args, extra: float = 0.0, **kw) -> None:
        super().__init__(*args, **kw)
        self.extra = extra

    def instance(self, inst, machines):
        spec, step = super().instance(inst, machines)
        return spec, (_Slower(step, self.extra) if self.extra else step)


def _fixed(prompt: int, output: int, rate: float, duration: float, seed: int):
    rng = np.random.default_rng(seed)
    t = 0.0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t >= duration:
            return
        yield RequestSpec(t, prompt, output)


def _policy(p: Probe) -> PolicyConfig:
    pol = PolicyConfig()
    b = replace(pol.batching, preemption_limit=p.preemption_limit, kv_allocation=p.kv_allocation)
    if p.scheduler is not None:
        b = replace(b, scheduler=p.scheduler)
    r = pol.routing if p.prompt is None else replace(pol.routing, mixed_pool=False, kv_pull=p.kv_pull)
    return replace(pol, batching=b, routing=r)


def run_probe(p: Probe, rate: float, slo: tuple[float, float]) -> dict:
    """One run of `p` at `rate` req/s (the whole cluster's): attainment of `slo` (TTFT, TPOT; inf
    for none) and the P90 TTFT and TPOT of its completed requests."""
    duration = max(MIN_DURATION, p.requests / rate)
    if p.workload.startswith("fixed:"):
        _, a, b = p.workload.split(":")
        wl = _fixed(int(a), int(b), rate, duration, p.seed)
    else:
        wl = make_workload(p.workload, rps=rate, duration=duration, seed=p.seed, max_context=p.max_context)
    if p.prompt is None:
        cluster = make_cluster("baseline-a100", machines=1, parallel=Parallelism(tp=p.tp, pp=p.pp))
    else:
        if p.token is None:
            raise ValueError("a split probe names its token pool (instances, tp)")
        cluster = make_cluster("splitwise-aa", prompt_machines=p.prompt[0], token_machines=p.token[0],
                               parallel=Parallelism(prompt_tp=p.prompt[1], prompt_pp=p.pp,
                                                    token_tp=p.token[1], token_pp=p.pp))
    model = load_model(p.model)
    colocated = p.prompt is not None
    hosts = _OverheadHosts(model, None, 0.9, colocated, None, p.perf_model, extra=p.overhead_s)
    cfg = SimConfig(policy=_policy(p), perf_model=p.perf_model, goodput=GoodputSLO(*slo), colocated=colocated,
                    machine=hosts, record_requests=True)
    res = Simulation(cluster, model, wl, cfg).run()
    mt = res.metrics
    done = [r for r in res.requests if r.first_token_at >= 0]
    ttft = [r.first_token_at - r.arrival for r in done]
    tpot = [(r.last_token_at - r.first_token_at) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {"rate": rate, "attainment": mt.attained / mt.requests if mt.requests else 1.0,
            "p90_ttft": float(np.percentile(ttft, 90)) if ttft else math.inf,
            "p90_tpot": float(np.percentile(tpot, 90)) if tpot else math.inf}


def _one(args):
    return run_probe(*args)


class Runner:
    """Probes in a process pool of `workers` (1: in this process)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or 1)
        self._pool: ProcessPoolExecutor | None = None
        self.runs = 0

    def __call__(self, tasks: list[tuple[Probe, float, tuple[float, float]]]) -> list[dict]:
        self.runs += len(tasks)
        if self.workers == 1 or len(tasks) == 1:
            return [run_probe(*t) for t in tasks]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers)
        return list(self._pool.map(_one, tasks))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def goodput(self, p: Probe, slo: tuple[float, float], lattice: RateLattice, lo: float = 0.02,
                hi: float = 256.0) -> float:
        """The highest lattice rate (the cluster's, req/s) at which `p` meets `slo` for >= 90% of
        requests, divided by `p.gpus`; 0.0 when not even `lo` does (as placement's `goodput`)."""
        def test(rates: list[float]) -> list[bool]:
            return [o["attainment"] >= TARGET for o in self([(p, r, slo) for r in rates])]

        r = max_rate(test, lattice, lo, hi, width=self.workers)
        return (r or 0.0) / p.gpus

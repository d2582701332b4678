"""Aladdin's experiments: the systems of Figures 11 and 12, the scales, the
SLOs by the paper's rules on our perf model, one simulation of a system with a number of workers
at a rate, and the fewest workers meeting the target (aladdin.py says how each follows the paper
and what is ASSUMED)."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..catalog import load_hardware, load_model
from ..cluster.designs import Parallelism, make_cluster
from ..perf import make_perf_model
from ..perf.mixed import prompt_alone
from ..policy.latency import ATGT_FACTOR, TTFT_CONTEXT
from ..policy.cluster import RoutingConfig
from ..policy.config import PolicyConfig
from ..policy.machine import BatchingConfig
from ..report.goodput import GoodputSLO
from ..sim.config import SimConfig
from ..sim.simulator import Simulation
from ..workload import request_workload

MODEL = "llama2-13b"
HARDWARE = "dgx-a100"
WORKLOAD = "sharegpt"
TARGET = 0.99                 # ASSUMED in place of P100 (see above)
FIG11 = ("vllm", "jsq", "aladdin", "aladdin-0.7")
FIG12 = ("split-jsq", "split-p2", "split-aladdin")
ALLOCATION = "on-demand"      # every worker allocates KV as vLLM does, Aladdin's (policy/systems.py) too
NAMES = {"vllm": "vLLM (4 GPUs/worker, JSQ)", "jsq": "JSQ (1 GPU/worker)", "aladdin": "Aladdin, theta 0.9",
         "aladdin-0.7": "Aladdin, theta 0.7",
         "split-jsq": "JSQ", "split-p2": "Power of two", "split-aladdin": "Aladdin"}
GPUS = {"vllm": 4}            # GPUs per worker (1 otherwise)
THETAS = {"aladdin": 0.9, "aladdin-0.7": 0.7}   # --aladdin-theta (see the module's docstring)


def paper() -> dict:
    return tomllib.loads(resources.files("splitserve.reproduce").joinpath("aladdin_paper.toml").read_text())


@dataclass(frozen=True)
class Scale:
    name: str
    rates: tuple[float, ...]       # req/s
    duration: float                # seconds of arrivals per simulation
    max_workers: int               # search bound
    window: float                  # --scale-window of the scaled run
    perf_model: str = "auto"       # the step-time model (simulate --perf-model)


TINY = Scale("tiny", (2.0, 6.0), 20.0, 24, 10.0)
QUICK = Scale("quick", (2.0, 6.0, 12.0, 18.0, 24.0), 60.0, 64, 20.0)
FULL = Scale("full", (2.0, 4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 28.0), 300.0, 96, 30.0)
SCALES = {s.name: s for s in (TINY, QUICK, FULL)}


def slos(perf_model: str = "auto") -> tuple[float, float]:
    """(TTFT, ATGT) SLOs, seconds: the paper's rules (§6.1) on one A100 of our perf model."""
    perf, _ = make_perf_model(load_model(MODEL), load_hardware(HARDWARE), 1, kind=perf_model)
    return prompt_alone(perf, TTFT_CONTEXT), ATGT_FACTOR * perf.token_time(1, TTFT_CONTEXT)


def prompt_workers(rate: float) -> int:
    return 1 + math.ceil(rate / 8)


class _Missed(Exception):
    """A run stopped: too many requests have missed the SLOs for it to meet its target."""


def _stopper(box: list, n: int, target: float):
    """A check that stops the run in `box` (_Missed) once more of its `n` requests have completed
    missing the SLOs than `target` allows (its attainment can then no longer reach `target`)."""
    def check(*_) -> None:
        mt = box[0].metrics
        if (n - (mt.completed - mt.attained)) / n < target:
            raise _Missed
    return check


def _watched(specs: list, check):
    """`specs`, `check`ed before each is handed to the simulation (at each arrival)."""
    for spec in specs:
        check()
        yield spec


def simulate(kind: str, workers: int, rate: float, scale: Scale, seed: int, window: float = 0.0,
             slo: tuple[float, float] | None = None, hosts=None, stop_below: float | None = None) -> dict:
    """One run of `kind` with `workers` workers (token workers for the split kinds) at `rate`;
    `slo` (TTFT, ATGT) in place of slos()'s, `hosts` (sim/hosts.py) in place of the catalog's
    (aladdin_counterfactuals.py). With `stop_below`, the run stops as soon as its attainment can no
    longer reach it (checked at each arrival and every 65,536 events: the same verdict, sooner); such
    a run's "attainment" is the most it could have reached, and "stopped" is True."""
    ttft, atgt = slo or slos(scale.perf_model)
    aladdin: dict[str, Any] = dict(cluster_scheduler="aladdin", predictor="tetriinfer-100", aladdin_ttft_slo=ttft,
                   aladdin_atgt_slo=atgt, scale_window=window, aladdin_theta=THETAS.get(kind, 0.9))
    if kind in FIG11:
        routing = RoutingConfig(**aladdin) if kind in THETAS else RoutingConfig(cluster_scheduler="jsq")
        cluster = make_cluster("baseline-a100", machines=workers, parallel=Parallelism(tp=GPUS.get(kind, 1)))
        batching = BatchingConfig(scheduler="vllm", kv_allocation=ALLOCATION)
    else:
        routing = {"split-jsq": RoutingConfig(mixed_pool=False),
                   "split-p2": RoutingConfig(mixed_pool=False, decode_dispatch="tetriinfer", predictor="tetriinfer-100"),
                   "split-aladdin": RoutingConfig(mixed_pool=False, **aladdin)}[kind]
        cluster = make_cluster("splitwise-aa", prompt_machines=prompt_workers(rate), token_machines=workers,
                               parallel=Parallelism(tp=1))
        batching = BatchingConfig(kv_allocation=ALLOCATION)
    cfg = SimConfig(policy=PolicyConfig(batching=batching, routing=routing), goodput=GoodputSLO(ttft, atgt),
                    perf_model=scale.perf_model, machine=hosts)
    wl = list(request_workload(WORKLOAD, rps=rate, duration=scale.duration, seed=seed))
    box: list = []
    check = None if stop_below is None or not wl else _stopper(box, len(wl), stop_below)
    sim = Simulation(cluster, load_model(MODEL), wl if check is None else _watched(wl, check), cfg)
    box.append(sim)
    try:
        res = sim.run(progress=check)        # and every 65,536 events after the last arrival
    except _Missed:
        mt = sim.metrics
        return {"workers": workers, "attainment": (len(wl) - (mt.completed - mt.attained)) / len(wl),
                "requests": len(wl), "stopped": True}
    mt = res.metrics
    out: dict[str, Any] = {"workers": workers, "attainment": mt.attained / mt.requests if mt.requests else 1.0,
           "requests": mt.requests}
    if res.scaling is not None and window > 0:
        span = res.sim_end - mt.first_arrival
        machine_seconds = res.scaling["machine_seconds"]
        assert isinstance(machine_seconds, dict), "policy/aladdin.py activity: seconds by machine"
        out["mean_active"] = sum(machine_seconds.values()) / span if span > 0 else 0.0
        out["scale_downs"] = res.scaling["scale_downs"]
    return out


def needed(kind: str, rate: float, scale: Scale, seed: int, runs: dict, target: float = TARGET, **sim) -> int | None:
    """The fewest workers of `kind` meeting `target` at `rate` (doubling, then bisection; attainment
    taken as monotone in workers), None past `scale.max_workers`. Every run lands in `runs` (one
    there already is not run again), each stopped once it cannot meet `target`; `sim`: simulate()'s
    slo and hosts."""
    def ok(n: int) -> bool:
        if n not in runs:
            runs[n] = simulate(kind, n, rate, scale, seed, stop_below=target, **sim)
        return runs[n]["attainment"] >= target

    hi = 1
    while not ok(hi):
        if hi >= scale.max_workers:
            return None
        hi = min(2 * hi, scale.max_workers)
    lo = hi // 2                     # fails (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi

"""The Splitwise paper's evaluation, run on splitserve's simulator: each function returns plain
data (lists and dicts) that `report.py` turns into tables and plots.

Every simulation is one `run_simulation` call with a fixed seed; `Runner.map` spreads them over a
process pool. `Scale` sets how much is simulated: `QUICK` (minutes on 2 cores) or `FULL`.
"""

from __future__ import annotations

import os
import tomllib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..catalog import load_hardware, load_model
from ..cluster.designs import make_cluster
from ..perf import make_perf_model
from ..provision import plan
from ..provision.evaluate import Cache, Evaluator, LocalBackend
from ..sim.config import SimConfig
from ..sim.simulator import Simulation
from ..sim.run import run_simulation
from ..workload import RequestSpec

MODEL = "llama2-70b"
POWER_BUDGET_MACHINES = 40            # iso-power budget: the power of 40 DGX-H100 (paper §VI-B)


def paper() -> dict:
    return tomllib.loads(resources.files("splitserve.reproduce").joinpath("paper.toml").read_text())


@dataclass(frozen=True)
class Scale:
    name: str
    duration: float                                  # seconds of arrivals per simulation
    heat_prompt: tuple[int, ...]
    heat_token: tuple[int, ...]
    loads: tuple[float, ...]                         # req/s for latency against load
    stress_rps: float = 400.0                        # batch job: offered far beyond capacity
    stress_duration: float = 60.0
    search_duration: float = 60.0                    # seconds of arrivals per provisioning sim
    rate_tolerance: float = 0.05                     # relative step of throughput-at-SLO searches
    stride: int = 1                                  # >1: every stride-th split of a budget (coarse)
    budget_machines: int = POWER_BUDGET_MACHINES     # iso-power/cost budget in DGX-H100s
    max_pool: int = 70                               # iso-throughput searches: up to N x N splits


QUICK = Scale("quick", 60.0, heat_prompt=(8, 12, 16, 20, 27, 35), heat_token=(1, 2, 3, 4, 5, 6),
              loads=(40, 70, 100, 130), stress_duration=30.0, search_duration=30.0,
              rate_tolerance=0.10, budget_machines=10, max_pool=24)
FULL = Scale("full", 120.0, heat_prompt=tuple(range(6, 46, 3)), heat_token=tuple(range(1, 11)),
             loads=(30, 50, 70, 90, 110, 130, 150), search_duration=30.0)


def _sim(kw: dict) -> dict:
    return run_simulation(**kw)


@dataclass
class Runner:
    """Runs simulations in parallel; `profile` (a CSV path or None) and `seed` apply to all."""
    profile: str | None = None
    seed: int = 0
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    cache_dir: str | None = None                      # provisioning searches' cache (None: off)
    simulations: int = 0
    _ev: Evaluator | None = None

    def evaluator(self) -> Evaluator:
        """The provisioner's evaluator (process pool, cache), shared by every search."""
        if self._ev is None:
            self._ev = Evaluator(LocalBackend(self.workers),
                                 Cache(Path(self.cache_dir)) if self.cache_dir else None)
        return self._ev

    def close(self) -> None:
        if self._ev is not None:
            self._ev.close()

    def map(self, jobs: list[dict]) -> list[dict]:
        jobs = [{"model": MODEL, "seed": self.seed, "profile": self.profile, **j} for j in jobs]
        self.simulations += len(jobs)
        if self.workers <= 1 or len(jobs) == 1:
            return [_sim(j) for j in jobs]
        with ProcessPoolExecutor(self.workers) as pool:
            return list(pool.map(_sim, jobs, chunksize=1))


def counts(design: str, split: list[int] | tuple[int, ...]) -> dict:
    if design.startswith("splitwise"):
        return {"design": design, "prompt_machines": split[0], "token_machines": split[1]}
    return {"design": design, "machines": split[0]}


# ---- Table IV: a P50 request alone on one machine --------------------------------------------
TABLE4_REQUESTS = {"coding": (1500, 13), "conversation": (1020, 129)}


def isolated(runner: Runner) -> dict:
    """TTFT, TBT, E2E, cost and energy of the paper's P50 requests, alone on an A100 / H100."""
    model = load_model(MODEL)
    out: dict = {}
    for kind, (prompt, output) in TABLE4_REQUESTS.items():
        for hw_name, design in (("a100", "baseline-a100"), ("h100", "baseline-h100")):
            sim = Simulation(make_cluster(design, machines=1), model,
                             [RequestSpec(0.0, prompt, output)],
                             SimConfig(record_requests=True, profile=runner.profile))
            res = sim.run()
            (r,) = res.requests
            assert r.token_times is not None, "recorded with record_requests"
            hw = load_hardware(f"dgx-{hw_name}")
            _, power = make_perf_model(model, hw, None, runner.profile)
            e2e = r.token_times[-1]
            ttft = r.token_times[0]
            energy_j = res.metrics.machines[0].energy_j
            out.setdefault(kind, {})[hw_name] = {
                "ttft_ms": ttft * 1e3, "tbt_ms": (e2e - ttft) / (output - 1) * 1e3, "e2e_ms": e2e * 1e3,
                "cost_per_100": e2e * hw.cost_per_hour / 3600 * 100, "energy_wh": energy_j / 3600}
    return out


# ---- Fig. 12: latency over (prompt, token) machines, Splitwise-HH, 70 req/s coding -------------
def heatmap(runner: Runner, scale: Scale, rps: float = 70.0) -> dict:
    grid = [(p, t) for p in scale.heat_prompt for t in scale.heat_token]
    jobs = [dict(design="splitwise-hh", prompt_machines=p, token_machines=t, workload="coding",
                 rps=rps, duration=scale.duration) for p, t in grid]
    cells = {}
    for (p, t), s in zip(grid, runner.map(jobs)):
        cells[(p, t)] = {"slo_met": s["slo"]["met"], "cost": s["cluster"]["cost_per_hour"],
                         **{f"{m}_{q}": s[f"{m}_s"][q] for m in ("ttft", "tbt", "e2e") for q in ("p50", "p99")}}
    feasible = [k for k, c in cells.items() if c["slo_met"]]
    best = min(feasible, key=lambda k: (cells[k]["cost"], k)) if feasible else None
    return {"prompt": list(scale.heat_prompt), "token": list(scale.heat_token), "cells": cells,
            "best": best, "rps": rps}


# ---- Fig. 16: latency against load for iso-power clusters ------------------------------------
def load_sweep(runner: Runner, scale: Scale, clusters: dict[str, list[int]], workload: str) -> dict:
    keys = [(d, rps) for d in clusters for rps in scale.loads]
    jobs = [dict(**counts(d, clusters[d]), workload=workload, rps=rps, duration=scale.duration)
            for d, rps in keys]
    out: dict = {d: [] for d in clusters}
    for (d, rps), s in zip(keys, runner.map(jobs)):
        checks = s["slo"]["checks"]
        out[d].append({"rps": rps, "slo_met": s["slo"]["met"],
                       **{k: v["slowdown"] for k, v in checks.items()},
                       "cost": s["cluster"]["cost_per_hour"], "power_kw": s["cluster"]["power_kw"]})
    return out


# ---- §VI-E: batch jobs, clusters stressed far beyond their SLO capacity ----------------------
def batch_job(runner: Runner, scale: Scale, clusters: dict[str, list[int]], workload: str = "coding") -> dict:
    """Throughput per cost when the cluster is offered far more than it can serve: throughput =
    requests offered in the window / time until the last is done. The paper's "RPS/$" only fits
    its numbers with cost counted in DGX-A100 machine-hours (Table V normalises cost to DGX-A100),
    so that is the unit here too: req/s per (cluster $/h / DGX-A100 $/h)."""
    a100 = load_hardware("dgx-a100").cost_per_hour
    designs = list(clusters)
    jobs = [dict(**counts(d, clusters[d]), workload=workload, rps=scale.stress_rps,
                 duration=scale.stress_duration) for d in designs]
    out = {}
    for d, s in zip(designs, runner.map(jobs)):
        served = s["completed"] / s["sim"]["simulated_s"]
        cost = s["cluster"]["cost_per_hour"]
        out[d] = {"throughput_rps": served, "cost": cost, "rps_per_a100_hour": served / (cost / a100)}
    return out


# ---- provisioning searches: Fig. 12's optimum, Figs. 18-19 ------------------------------------
DESIGNS = ("splitwise-aa", "splitwise-hh", "splitwise-ha", "splitwise-hhcap", "baseline-a100",
           "baseline-h100")


def _scenario(runner: Runner, scale: Scale, workload: str) -> plan.Scenario:
    return plan.Scenario(workload, scale.search_duration, runner.seed, MODEL, runner.profile)


def fig12_search(runner: Runner, scale: Scale, rps: float = 70.0) -> dict:
    """The exact cost-optimal Splitwise-HH split over 70 x 70 (the paper's 69 x 69 sweep)."""
    ev = runner.evaluator()
    sc = plan.Scenario("coding", scale.duration, runner.seed, MODEL, runner.profile)
    return plan.cheapest(ev, plan.design("splitwise-hh"), rps, "cost", sc, plan.Limits(70, 70))


def throughput_optimised(runner: Runner, scale: Scale, workload: str, constraint: str) -> dict:
    """Each design's split with the most throughput at SLO within 40 DGX-H100's power or cost."""
    ev = runner.evaluator()
    sc = _scenario(runner, scale, workload)
    budget = plan.budget_value(f"{scale.budget_machines}*dgx-h100", constraint)
    rates = plan.RateRange(1.0, 1000.0, plan.RateLattice(scale.rate_tolerance))
    return {d: plan.best_within_budget(ev, plan.design(d), constraint, budget, sc, plan.Limits(),
                                       rates, stride=scale.stride) for d in DESIGNS}


def iso_throughput(runner: Runner, scale: Scale, workload: str, rps: float, objective: str) -> dict:
    """Each design's least-power or least-cost cluster that meets the SLOs at `rps`."""
    ev = runner.evaluator()
    sc = _scenario(runner, scale, workload)
    lim = plan.Limits(scale.max_pool, scale.max_pool, 2 * scale.max_pool)
    return {d: plan.cheapest(ev, plan.design(d), rps, objective, sc, lim) for d in DESIGNS}

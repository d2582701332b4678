"""EcoServe's experiments: the scales and rate grids, the KV cap as a memory share, one
simulation of a system on a dataset at a rate, the measures of a run (normalized latency, SLO
satisfaction against the basis vLLM sets) and the rate each system sustains (ecoserve.py says how
each follows the paper and what is ASSUMED)."""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..catalog import kv_capacity_tokens, load_hardware, load_model
from ..cluster.designs import Parallelism, make_cluster
from ..policy.config import make_policy
from ..sim.config import SimConfig
from ..sim.simulator import Simulation
from ..workload import make_workload

MODEL = "opt-13b"
CONTEXT = 2048
KV_BYTES = 12e9                  # §2.1 "The memory for KVC is 12GB"
DATASETS = ("alpaca", "sharegpt", "bookcorpus")
NAMES = {"alpaca": "Alpaca", "sharegpt": "ShareGPT", "bookcorpus": "BookCorpus"}
SYSTEMS = ("ecoserve", "oracle", "vllm", "vllm-np", "fastgen", "orca")
# counterfactual systems (ecoserve_claims.py): vLLM not knowing output lengths, and the A100's whole KV
COUNTERFACTUAL = ("vllm-max", "ecoserve-kv", "vllm-kv")
LABELS = {"ecoserve": "EcoServe", "oracle": "Oracle", "vllm": "vLLM", "vllm-np": "vLLM (no preemption)",
          "fastgen": "FastGen (sarathi)", "orca": "ORCA (batch 8)", "vllm-max": "vLLM reserving the context",
          "ecoserve-kv": "EcoServe, 0.9 of HBM for KV", "vllm-kv": "vLLM, 0.9 of HBM for KV"}
ORCA_BATCH = 8                  # §2.1 "The batch size of ORCA and FastServe was set to 8"
ORCA_SYSTEMS = ("orca", "vllm-max")  # run by Orca's scheduler, whose admission scan grows with the queue:
ORCA_MAX_REQUESTS = 2000             # at most this many requests a point (1,000 took 0.9 s, 4,000 11 s)
SLO_SCALE = 2.0
LATENCY_FACTOR = 2.0            # sustained: normalized latency within this factor of vLLM's lowest-rate one
LIMIT_FACTORS = (1.5, 3.0, 5.0)  # the counterfactual readings of 'sustained' (the same runs)


def paper() -> dict:
    return tomllib.loads(resources.files("splitserve.reproduce").joinpath("ecoserve_paper.toml").read_text())


@dataclass(frozen=True)
class Scale:
    name: str
    datasets: tuple[str, ...]
    systems: tuple[str, ...]
    duration: dict[str, float]            # seconds of arrivals per dataset (so overload shows in latency)
    max_requests: int                     # at most this many requests per point
    rates: dict[str, tuple[float, ...]]   # req/s per dataset
    perf_model: str = "auto"              # the step-time model (simulate --perf-model)
    cut: bool = False                     # stop a system's sweep once overloaded (`sweep`)

    def requests(self, dataset: str, rps: float) -> int:
        return max(50, min(self.max_requests, round(rps * self.duration[dataset])))


RATES = {"alpaca": (5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 120.0),
         "sharegpt": (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
         "bookcorpus": (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4)}
TINY = Scale("tiny", ("alpaca",), ("ecoserve", "vllm", "vllm-max"), {"alpaca": 10.0}, 400, {"alpaca": (5.0, 20.0, 40.0)})
QUICK = Scale("quick", DATASETS, SYSTEMS + COUNTERFACTUAL, {"alpaca": 60.0, "sharegpt": 400.0, "bookcorpus": 2400.0},
              4000, RATES)
FULL = Scale("full", DATASETS, SYSTEMS + COUNTERFACTUAL, {"alpaca": 300.0, "sharegpt": 2000.0, "bookcorpus": 12000.0},
             20000, RATES, cut=True)
SCALES = {s.name: s for s in (TINY, QUICK, FULL)}


@functools.lru_cache(maxsize=1)
def memory_utilization() -> float:
    """The share of the A100's memory that leaves 12 GB of OPT-13B KV, as the simulator sizes it."""
    model, hw = load_model(MODEL), load_hardware("dgx-a100")
    want = int(KV_BYTES // model.kv_bytes_per_token)
    lo, hi = 0.4, 1.0          # below 0.4, OPT-13B's weights do not fit the A100
    for _ in range(50):
        mid = (lo + hi) / 2
        if kv_capacity_tokens(model, hw, 1, mid) < want:
            lo = mid
        else:
            hi = mid
    return hi


def policy(system: str, dataset: str):
    """The policy of the compared `system` on `dataset` (FastGen: sarathi's; ORCA: Orca's scheduler
    with the paper's batch of 8, reserving the whole context; `-kv`: the same policy as without).
    vllm and sarathi allocate KV on demand (their systems' rule, policy/systems.py); vllm-np,
    ORCA and vllm-max reserve, named here so that the counterfactuals keep their meaning."""
    system = system.removesuffix("-kv")
    if system == "oracle":   # the system's predictor replaced by the truth (an option at its default
        return make_policy({"batching.scheduler": "ecoserve", "routing.cluster_scheduler": "jsq"})  # loses)
    table: dict[str, dict[str, Any]] = {"ecoserve": {"routing.predictor": f"ecoserve-{dataset}"},
               "vllm-np": {"batching.preemption_limit": 0, "batching.kv_allocation": "reserve"},  # a whole
                                                       # reservation never grows: nobody is preempted
               "orca": {"batching.scheduler": "orca", "batching.max_len": CONTEXT, "batching.max_seqs": ORCA_BATCH,
                        "batching.preemption_limit": 0, "batching.kv_allocation": "reserve"},
               "vllm-max": {"batching.scheduler": "orca", "batching.max_len": CONTEXT,
                            "batching.preemption_limit": 0, "batching.kv_allocation": "reserve"}}
    options = table.get(system, {})
    base = {"fastgen": "sarathi", "ecoserve": "ecoserve"}.get(system, "vllm")
    return make_policy(options, base)


def specs(dataset: str, rps: float, n: int, seed: int) -> list:
    wl = make_workload(dataset, rps=rps, duration=4 * n / rps + 60, seed=seed, max_requests=n, max_context=CONTEXT)
    return list(wl)[:n]


def simulate(system: str, dataset: str, rps: float, n: int, seed: int = 0, perf_model: str = "auto") -> dict:
    """One run: per-request latencies and what the scheduler did."""
    sim = Simulation(make_cluster("baseline-a100", machines=1, parallel=Parallelism(tp=1)), load_model(MODEL),
                     specs(dataset, rps, n, seed),
                     SimConfig(policy=policy(system, dataset), record_requests=True,
                               memory_utilization=0.9 if system.endswith("-kv") else memory_utilization(),
                               perf_model=perf_model))
    res = sim.run()
    rs = sorted(res.requests, key=lambda r: r.id)
    counts = dict(sim.machines[0].counts or {})
    return {"e2e": [r.last_token_at - r.arrival for r in rs], "ttft": [r.first_token_at - r.arrival for r in rs],
            "out": [r.output_tokens for r in rs],
            "span": max(r.last_token_at for r in rs) - min(r.arrival for r in rs),
            "preemptions": res.metrics.preemptions, "counts": counts, "kv_tokens": sim.machines[0].kv_capacity}


def norm_latency(run: dict) -> float:
    return sum(e / o for e, o in zip(run["e2e"], run["out"])) / len(run["e2e"])


def measure(run: dict, slo: tuple[float, float]) -> dict:
    n = len(run["e2e"])
    t_p, t_g = slo
    met = sum(e <= SLO_SCALE * (t_p + t_g * o) for e, o in zip(run["e2e"], run["out"]))
    return {"norm_latency": norm_latency(run),
            "jct": sum(run["e2e"]) / n, "throughput": n / run["span"], "ssr": met / n,
            "preemptions": run["preemptions"], "counts": run["counts"]}


def slo_basis(run: dict) -> tuple[float, float]:
    """(t_p, t_g): mean TTFT and mean time per token after the first, of a run."""
    n = len(run["e2e"])
    t_p = sum(run["ttft"]) / n
    later = [(e - f) / (o - 1) for e, f, o in zip(run["e2e"], run["ttft"], run["out"]) if o > 1]
    return t_p, sum(later) / max(len(later), 1)


def sustained(rates: tuple[float, ...], norms: list[float], limit: float) -> tuple[float, bool]:
    """The highest rate whose normalized latency is within `limit` (linear between grid points),
    and whether it is censored (never passed on the grid). `norms` may stop short of `rates` (a cut
    sweep: the rates after it not run)."""
    if norms[0] > limit:
        return rates[0] * limit / norms[0], False
    for i in range(1, len(norms)):
        if norms[i] > limit:
            a, b = norms[i - 1], norms[i]
            return rates[i - 1] + (rates[i] - rates[i - 1]) * (limit - a) / (b - a), False
    return rates[len(norms) - 1], True


def requests(sc: Scale, system: str, dataset: str, rps: float) -> int:
    """Requests of a point: the scale's, at most ORCA_MAX_REQUESTS for the Orca-scheduled systems."""
    n = sc.requests(dataset, rps)
    return min(n, ORCA_MAX_REQUESTS) if system in ORCA_SYSTEMS else n


def cut_limit(base: float) -> float:
    """The largest latency limit any reading of 'sustained' uses, `base` vLLM's lowest-rate normalized latency."""
    return max(LATENCY_FACTOR, *LIMIT_FACTORS) * base


def sweep(system: str, dataset: str, sc: Scale, seed: int, top: float, first: dict | None = None) -> list[dict]:
    """`system`'s runs on `dataset` up the rate grid (`first`: its lowest-rate run, already made).
    With `sc.cut`, it stops after two successive rates past `top` (cut_limit): every limit of
    'sustained' is passed by then, so sustained() reads the same rate off the runs made as off the
    whole grid; the rates after are not run (absent from the results: overloaded, not run)."""
    runs, over = [], 0
    for i, r in enumerate(sc.rates[dataset]):
        run = first if i == 0 and first is not None else simulate(system, dataset, r, requests(sc, system, dataset, r),
                                                                  seed, sc.perf_model)
        runs.append(run)
        over = over + 1 if norm_latency(run) > top else 0
        if sc.cut and over >= 2:
            break
    return runs


def dataset_results(dataset: str, sc: Scale, seed: int, log) -> dict:
    rates = sc.rates[dataset]
    first = simulate("vllm", dataset, rates[0], requests(sc, "vllm", dataset, rates[0]), seed, sc.perf_model)
    top = cut_limit(norm_latency(first))     # vLLM's lowest rate sets every limit: run before any cut
    runs = {s: sweep(s, dataset, sc, seed, top, first if s == "vllm" else None) for s in sc.systems}
    basis = slo_basis(runs["vllm"][0])
    points = {s: [measure(run, basis) for run in rs] for s, rs in runs.items()}
    limit = LATENCY_FACTOR * points["vllm"][0]["norm_latency"]
    sus = {s: sustained(rates, [p["norm_latency"] for p in ps], limit) for s, ps in points.items()}
    gains = {s: sus["ecoserve"][0] / sus[s][0] for s in sc.systems if s not in ("ecoserve", "ecoserve-kv", "vllm-kv")}
    if "ecoserve-kv" in sus and "vllm-kv" in sus:
        gains["vllm-kv"] = sus["ecoserve-kv"][0] / sus["vllm-kv"][0]
    base = points["vllm"][0]["norm_latency"]
    factors = {f"{f:g}": {s: sustained(rates, [p["norm_latency"] for p in points[s]], f * base)[0] for s in sc.systems}
               for f in LIMIT_FACTORS}
    return {"dataset": dataset, "rates": list(rates), "slo_basis": {"t_p": basis[0], "t_g": basis[1]},
            "latency_limit": limit, "kv_tokens": runs["vllm"][0]["kv_tokens"], "points": points,
            "cut_limit": top, "not_run": {s: list(rates[len(ps):]) for s, ps in points.items() if len(ps) < len(rates)},
            "sustained": {s: {"rate": v[0], "censored": v[1]} for s, v in sus.items()}, "ecoserve_gain": gains,
            "sustained_by_limit": factors}

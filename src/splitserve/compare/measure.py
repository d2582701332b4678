"""What a system's cluster does at a rate, in full: one simulation's latencies, tokens, cost and
SLO checks, how busy each pool's machines were and the most KV any one held (the searches keep
only pass/fail and slowdowns). Used at each system's goodput for the table and the claims'
paragraphs, and over a common grid of rates for the latency-vs-rate curves.

Cost per million output tokens is the cluster's $/h over the output tokens it generated per hour
of the simulated span (arrivals to the last completion), at the goodput rate.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..cluster.designs import load_designs
from ..policy.config import make_policy
from ..provision.plan import Scenario
from ..report.goodput import GoodputSLO
from ..sim.run import run_simulation


@dataclass(frozen=True, slots=True)
class Point:
    system: str
    design: str
    cluster: tuple[int, ...]
    rps: float
    scenario: Scenario


def measure(pt: Point) -> dict:
    """One simulation of `pt`, reduced to the figures the report shows."""
    sc = pt.scenario
    counts: dict[str, Any] = ({"prompt_machines": pt.cluster[0], "token_machines": pt.cluster[1]}
              if load_designs(sc.catalog)[pt.design].split else {"machines": pt.cluster[0]})
    s = run_simulation(design=pt.design, **counts, model=sc.model, workload=sc.workload, rps=pt.rps,
                       duration=sc.duration, seed=sc.seed, profile=sc.profile,
                       goodput=GoodputSLO(*sc.goodput) if sc.goodput else None,
                       policy=make_policy({}, pt.system), catalog=sc.catalog)
    checks = s["slo"]["checks"]
    ratio = {k: (c["slowdown"] if c["slowdown"] is not None else float("inf")) / c["limit"]
             for k, c in checks.items()}
    worst = max(ratio, key=ratio.__getitem__)
    span, tokens, cost = s["sim"]["simulated_s"], s["tokens_generated"], s["cluster"]["cost_per_hour"]
    per_m = cost / (tokens / span * 3600) * 1e6 if tokens and span > 0 else None
    g = s.get("goodput")
    pools = s["cluster"]["machines"]
    return {
        "rps": pt.rps, "requests": s["requests"], "completed": s["completed"],
        "throughput_rps": s["throughput_rps"], "output_tokens": tokens, "simulated_s": span,
        "cost_per_hour": cost, "power_kw": s["cluster"]["power_kw"], "cost_per_m_output_tokens": per_m,
        **{f"{m}_{q}_s": s[f"{m}_s"][q] for m in ("ttft", "tbt", "e2e") for q in ("p50", "p99")},
        "slo_met": bool(s["slo"]["met"]), "checks_met": sum(c["met"] for c in checks.values()),
        "checks": len(checks), "worst_check": worst, "worst_ratio": ratio[worst],
        "worst_limit": checks[worst]["limit"],
        "utilization": {p["pool"]: p["utilization"] for p in pools},      # busy share, per pool's machine
        "peak_kv_fraction": max(p["peak_kv_fraction"] for p in pools),  # of any one machine's KV capacity
        "borrowed": s["cluster"]["borrowed_into_mixed_pool"], "preemptions": s["cluster"]["preemptions"],
        "events": s["sim"]["events"],
        "prefix_hit_rate": s.get("prefix_cache", {}).get("hit_rate"),   # a workload sharing prefixes
        "attainment": g["attainment"] if g else None, "attainment_target": g["target"] if g else None,
        "meets": bool(g["meets_target"]) if g else bool(s["slo"]["met"]),   # the SLO the search used
    }


def measure_all(points: list[Point], workers: int | None = None) -> list[dict]:
    """`measure` of every point, over a process pool of `workers` (1: in this process)."""
    n = max(1, workers or os.cpu_count() or 1)
    if n == 1 or len(points) <= 1:
        return [measure(p) for p in points]
    with ProcessPoolExecutor(min(n, len(points))) as pool:
        return list(pool.map(measure, points))

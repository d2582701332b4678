"""`splitserve provision` as a function: run one search per design of a ProvisionRequest (checked
when it was made: provision/request.py), pick the best design, and say what the search cost."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..sim import compiled
from . import plan
from .evaluate import Cache, Evaluator, LocalBackend, default_cache_dir
from .ray_backend import RayBackend
from .report import config_label
from .request import ProvisionRequest
from .search import first_true

# Seconds of simulator time per simulated request, for the estimate printed before a search.
# Measured with `splitserve simulate --json` (sim.wall_s / requests) on this project's 2-core dev
# VM: 67-117 us for coding at 5-80 req/s on 3P+3T to 30P+30T DGX-H100, 256 us for conversation at
# 40 req/s on 20P+20T; docs/provision.md's 70 x 70 cost search (23 simulations of 8,400 requests in
# 21.6 s on 2 workers) comes to about 220 us. ASSUMED: 200 us, whatever the cluster and machine.
# The compiled hot path (setup.py): the 70 req/s cost search took 0.40 s a simulation of ~8,400
# requests on one core (48 us; benchmarks/README.md, "Provisioning search"). ASSUMED: 60 us when compiled.
SECONDS_PER_REQUEST = 60e-6 if compiled() else 200e-6


@lru_cache(maxsize=256)
def worst_probes(n: int, width: int) -> int:
    """The most points `first_true` over n integers, `width` per round, ever tests: the maximum
    over every place the predicate can turn true (exact, by running it on each)."""
    worst = 0
    for x in range(1, n + 2):
        probes = [0]

        def test(pts: list[int], x: int = x, probes: list[int] = probes) -> list[bool]:
            probes[0] += len(pts)
            return [p >= x for p in pts]

        first_true(1, n, test, width)
        worst = max(worst, probes[0])
    return worst


def simulation_bound(objective: str, d, lim: plan.Limits, rates: plan.RateRange, width: int,
                     constraint: str | None = None, budget: float | None = None, catalog=None) -> int:
    """At most how many simulations the search of one design asks for (cached ones included).

    - cost/power/machines, split: the prompt column at --max-token and the token row at
      --max-prompt, then each of the --max-prompt columns searched once (search.min_split), and
      the answer's own simulation: W(P) + W(T) + P * W(T) + 1, W(n) = worst_probes(n, width).
    - the same, unsplit: W(--max-machines) + 1.
    - throughput: each of the C largest splits within the budget takes one probe and, when it
      passes, a whole rate search (W over the lattice's rates), then the answer: C * (1 + W) + 1.
    - batch: one simulation per candidate, C.
    A bound, not a forecast: the staircase search usually stops far below it (docs/provision.md)."""
    if objective in plan.OBJECTIVES:
        if d.split:
            wt = worst_probes(lim.max_token, width)
            return worst_probes(lim.max_prompt, width) + wt + lim.max_prompt * wt + 1
        return worst_probes(lim.max_machines, width) + 1
    if constraint is None or budget is None:
        raise ValueError(f"--objective {objective} searches within a budget: give its constraint and budget")
    cands = len(plan.boundary(d, constraint, budget, lim, catalog))
    if objective == "batch":
        return cands
    return cands * (1 + worst_probes(rates.size(), width)) + 1 if cands else 0


def estimate(objective: str, designs: list, sc: plan.Scenario, lim: plan.Limits, rates: plan.RateRange,
             width: int, rps: float | None, constraint: str | None, budget: float | None) -> dict:
    """The bound on simulations, and the time that many would take (an estimate, not a bound: a
    simulation's time grows with its rate and the machine): requests per simulation (rate x duration;
    ASSUMED for the throughput search: the geometric mean of --min-rps and --max-rps, where its
    bisection spends its probes on no particular side) at SECONDS_PER_REQUEST, over `width`
    workers."""
    sims = sum(simulation_bound(objective, d, lim, rates, width, constraint, budget, sc.catalog) for d in designs)
    rate = rps if rps is not None else math.sqrt(rates.lo * rates.hi)
    per_sim = rate * sc.duration * SECONDS_PER_REQUEST
    return {"simulations_at_most": sims, "rate": rate, "seconds_per_simulation": per_sim,
            "seconds_for_all": sims * per_sim / max(1, width), "seconds_per_request": SECONDS_PER_REQUEST,
            "workers": width}


def _duration(s: float) -> str:
    if s < 1:
        return "under 1 s"
    return "about " + (f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h")


def boundary_warnings(res: dict, budget_per_unit=None) -> list[str]:
    """Where a design's answer touches a limit of the search, so that a wider search might do
    better: a pool at --max-prompt / --max-token, a baseline at --max-machines, a throughput at
    the top of the rate range. Within a budget, a pool at its limit counts only where the budget
    had room for one more of its machines (otherwise the budget, not the limit, decided)."""
    lim, obj = res["limits"], res["objective"]
    out = []
    for r in res["designs"]:
        if not r.get("feasible"):
            continue
        hit = []
        room = budget_per_unit(r) if budget_per_unit else None
        if "prompt_machines" in r:
            if r["prompt_machines"] >= lim["max_prompt"] and (room is None or room[0]):
                hit.append(f"{r['prompt_machines']} prompt machines = --max-prompt")
            if r["token_machines"] >= lim["max_token"] and (room is None or room[1]):
                hit.append(f"{r['token_machines']} token machines = --max-token")
        elif "machines" in r and r["machines"] >= lim["max_machines"] and (room is None or room[0]):
            hit.append(f"{r['machines']} machines = --max-machines")
        top = res.get("rate_top")
        if obj == "throughput" and top is not None and r.get("throughput_at_slo") is not None \
                and r["throughput_at_slo"] >= top:
            hit.append(f"{r['throughput_at_slo']:g} req/s = the top of the rate range (--max-rps)")
        if hit:
            r["on_boundary"] = hit
            out.append(f"{config_label(r)}: {'; '.join(hit)}: the optimum sits on the search boundary, a "
                       f"wider search may find a better one")
    return out


def progress_display(enabled: bool):
    """A rich progress bar over the designs (what is being searched, simulations, cache hits,
    elapsed, ETA from the designs done so far) on a terminal; nothing otherwise."""
    if not (enabled and sys.stderr.isatty()):
        return None
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    return Progress(SpinnerColumn(), BarColumn(bar_width=20), MofNCompleteColumn(),
                    TextColumn("{task.description}"),
                    TextColumn("[dim]{task.fields[sims]} simulated, {task.fields[hits]} cached[/]"),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True)


def run_provision(req: ProvisionRequest, log=None) -> dict:
    """The searches `req` asks for and their answer, a plain dict for JSON. `log(line)`, when
    given, gets the estimate before the searches start."""
    known = plan.load_designs(req.catalog)
    be = RayBackend(req.address) if req.backend == "ray" else LocalBackend(req.workers)
    cache = Cache(Path(req.cache_dir) if req.cache_dir else default_cache_dir()) if req.use_cache else None
    bar = progress_display(req.progress)
    task = None

    def on_done(job, out, hit):
        if bar is not None:
            bar.update(task, sims=ev.simulated, hits=ev.cached)

    ev = Evaluator(be, cache, on_done, perf_model=req.perf_model)
    assert req.objective is not None, "ProvisionRequest settles the objective"
    est = estimate(req.objective, [known[n] for n in req.names], req.scenario(), req.limits(), req.rates(),
                   ev.width, req.rps or (req.stress_rps if req.objective == "batch" else None), req.constraint,
                   req.budget_x)
    if log is not None:
        log(_estimate_line(req, est, ev.width))
    t0 = time.perf_counter()
    try:
        if bar is not None:
            bar.start()
            task = bar.add_task("provisioning", total=len(req.names), sims=0, hits=0)
        rows = _search(req, known, ev, bar, task)
    finally:
        if bar is not None:
            bar.stop()
        ev.close()
    search = {"simulated": ev.simulated, "cached": ev.cached,
              "brute_force": sum(r.get("brute_force", 0) for r in rows),
              "wall_s": time.perf_counter() - t0, "workers": ev.width, "backend": req.backend,
              **({"nodes": dict(be.nodes)} if isinstance(be, RayBackend) else {})}   # simulations per Ray node
    return _answer(req, known, rows, search, est)


def _estimate_line(req: ProvisionRequest, est: dict, width: int) -> str:
    n = len(req.names)
    return (f"provisioning {n} design{'s' if n != 1 else ''}: at most "
            f"{est['simulations_at_most']:,} simulations (an upper bound; the searches usually need far "
            f"fewer, and the cache answers repeats); at about {est['seconds_per_simulation']:.2g} s each "
            f"({est['seconds_per_request'] * 1e6:.0f} us per request at {est['rate']:.3g} req/s for "
            f"{req.scenario().duration:g} s; more at higher rates or on a slower machine), that many would take "
            f"{_duration(est['seconds_for_all'])} on {width} {req.backend} worker{'s' if width != 1 else ''}")


def _search(req: ProvisionRequest, known: dict, ev: Evaluator, bar, task) -> list[dict]:
    """One search per design, in order: its row of the answer."""
    sc, lim, rates = req.scenario(), req.limits(), req.rates()

    def on_progress(msg: str):
        if bar is not None:
            bar.update(task, description=msg)

    rows = []
    for n in req.names:
        d = known[n]
        on_progress(f"{n}")
        if req.objective in plan.OBJECTIVES:
            assert req.rps is not None, "ProvisionRequest: --objective cost|power|machines needs --rps"
            rows.append(plan.cheapest(ev, d, req.rps, req.objective, sc, lim, on_progress))
        elif req.objective == "throughput":
            rows.append(plan.best_within_budget(ev, d, *_within(req), sc, lim, rates, on_progress))
        else:
            rows.append(plan.batch_within_budget(ev, d, *_within(req), sc, lim, req.rps or req.stress_rps))
        if bar is not None:
            bar.advance(task)
    return rows


def _within(req: ProvisionRequest) -> tuple[str, float]:
    """(constraint, budget) of a search within a budget (ProvisionRequest requires both)."""
    if req.constraint is None or req.budget_x is None:
        raise ValueError(f"--objective {req.objective} searches within a budget: give --constraint and --budget")
    return req.constraint, req.budget_x


def _answer(req: ProvisionRequest, known: dict, rows: list[dict], search: dict, est: dict) -> dict:
    """The best design (by the objective), the question, the searches' rows and costs, the warnings
    where an optimum sits on the search boundary, and the closest miss when none is feasible."""
    objective, constraint, budget_x = req.objective, req.constraint, req.budget_x
    feasible = [r for r in rows if r.get("feasible")]
    score: Callable[[dict], tuple]
    if objective in plan.OBJECTIVES:
        score = lambda r: (r["objective_value"], r["machine_count"])
    elif objective == "throughput":
        score = lambda r: (-r["throughput_at_slo"], r["cost_per_hour"])
    else:
        score = lambda r: (-r["rps_per_dollar_hour"],)
    best = min(feasible, key=score) if feasible else None
    rates = req.rates()
    result: dict[str, Any] = {
        "objective": objective, "rps": req.rps, "constraint": constraint, "budget": req.budget,
        "budget_value": budget_x,
        "budget_unit": None if constraint is None else ("kW" if constraint == "iso-power" else "$/h"),
        "scenario": plan.scenario_dict(req.scenario()),
        "limits": {"max_prompt": req.max_prompt, "max_token": req.max_token, "max_machines": req.max_machines},
        "rate_tolerance": req.tolerance if objective == "throughput" else None,
        "assumption": plan.ASSUMPTION,
        "designs": rows,
        "best": best,
        "search": search,
        "estimate": est,
        "rate_top": rates.lattice.rate(rates.lattice.index(req.max_rps)) if objective == "throughput" else None,
    }

    def room(r: dict) -> tuple[bool, ...]:      # within a budget: could one more machine fit?
        constraint, budget_x = _within(req)
        per = plan.unit_values(known[r["design"]], lambda hw: getattr(hw, plan.CONSTRAINTS[constraint]), req.catalog)
        counts = (r["prompt_machines"], r["token_machines"]) if "prompt_machines" in r else (r["machines"],)
        used = sum(c * u for c, u in zip(counts, per))
        return tuple(used + u <= budget_x * (1 + 1e-9) for u in per)

    result["warnings"] = boundary_warnings(result, room if constraint is not None else None)
    if best is None:
        near = [r for r in rows if r.get("worst_ratio") is not None]
        result["closest"] = min(near, key=lambda r: r["worst_ratio"]) if near else None
    return result

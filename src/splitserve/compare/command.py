"""`splitserve compare` as a function: for a CompareRequest (compare/request.py, checked when made),
find every system's goodput on the same workload, model, machines and budget (and the reference's:
the unsplit machines under the default policy, Splitwise's mixed-batching baseline), measure each
at its goodput, fill each claim's paragraph from those figures, write report.md, results.json and
the plots."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..catalog import load_model
from ..policy.systems import SYSTEMS, System
from ..provision.evaluate import Cache, Evaluator, LocalBackend, default_cache_dir
from ..provision.plan import ASSUMPTION, RateRange, Scenario, scenario_dict
from ..provision.search import RateLattice
from ..report.goodput import from_options
from ..workload import RequestSpec, make_workload
from ..workload.conversations import Turn
from . import plots
from .budget import Budget
from .claims import Claim, explain_all, finding, load_claims
from .goodput import REFERENCE, system_goodput
from .measure import Point, measure_all
from .report import write_report
from .request import CompareRequest


def curve_rates(top: float, points: int) -> list[float]:
    """`points` rates from a quarter to 1.5 times `top` (the best goodput), evenly spaced."""
    if points < 1 or not top:
        return []
    if points == 1:
        return [float(f"{top:.4g}")]
    return [float(f"{top * (0.25 + 1.25 * i / (points - 1)):.4g}") for i in range(points)]


def run_compare(req: CompareRequest, log: Callable[[str], None] = lambda m: None) -> dict:
    """Each system's goodput on the budget, each measured there and on the common curve rates;
    results.json, report.md and the plots written into `req.out`."""
    names, catalog = req.names, req.catalog
    req.out.mkdir(parents=True, exist_ok=True)   # an unwritable --out fails now, not after the simulations
    budget = Budget(req.hardware, req.machines, catalog)
    designs = {s: budget.design(s) for s in {SYSTEMS[n].split for n in names}}
    load_model(req.model, catalog)
    make_workload(req.workload, rps=1.0, duration=req.duration, seed=req.seed)
    slo = from_options(req.goodput_ttft, req.goodput_tpot)
    sc = Scenario(req.workload, req.duration, req.seed, req.model, None,
                  (slo.ttft_s, slo.tpot_s) if slo else None, catalog=catalog)
    lattice = RateLattice(req.tolerance)      # provision's: 1.0 x (1 + tolerance)^k
    assert req.max_rps is not None, "CompareRequest sets its default"
    rates = RateRange(req.min_rps, req.max_rps, lattice)
    claims = load_claims()

    # ---- each system's goodput ----
    ev = Evaluator(LocalBackend(req.workers), Cache(Path(req.cache_dir) if req.cache_dir else default_cache_dir())
                   if req.use_cache else None)
    t0 = time.perf_counter()
    try:
        rows = [_goodput(ev, SYSTEMS[n], budget, sc, rates, log) for n in names]
        ref = _goodput(ev, REFERENCE, budget, sc, rates, log)
    finally:
        ev.close()

    # ---- each at its goodput, and the latency curves ----
    grid = curve_rates(max((r["goodput_rps"] or 0.0 for r in rows), default=0.0), req.curve_points)
    curves, measured = _measure(rows, ref, sc, grid, claims, req.workers, log)
    wall = time.perf_counter() - t0
    if grid:
        log(f"measured every system at its goodput and at {len(grid)} common rates")

    res = {
        "command": req.command,
        "scenario": {**scenario_dict(sc), "tolerance": req.tolerance, "min_rps": req.min_rps, "max_rps": req.max_rps},
        "budget": {"hardware": req.hardware, "machines": req.machines, "cost_per_hour": budget.cost_per_hour,
                   "split_design": designs.get(True, budget.design(True)).name,
                   "unsplit_design": designs.get(False, budget.design(False)).name},
        "assumption": ASSUMPTION,
        "systems": rows,
        "reference": ref,
        "workload_stats": workload_stats(sc, max((r["goodput_rps"] or 0.0 for r in rows), default=0.0)),
        "curve_rates": grid,
        "curves": curves,
        "search": {"simulated": ev.simulated, "cached": ev.cached, "measured": measured,
                   "wall_s": wall, "workers": ev.width},
    }
    if req.config is not None:   # the command's options (cli/config_file.py effective_config): compare --config results.json
        res["config"] = req.config
    if catalog is not None:
        res["catalog"] = catalog.note()
    explain_all(res, claims)
    write_outputs(res, req.out)
    return res


def workload_stats(sc: Scenario, rps: float) -> dict | None:
    """The sizes of the requests simulated at `rps` (the best goodput: the most requests of the
    run's simulations), for the claims' paragraphs; None when no system has a goodput."""
    if not rps:
        return None
    reqs: list[RequestSpec | Turn] = list(make_workload(sc.workload, rps=rps, duration=sc.duration, seed=sc.seed))
    if not reqs:
        return None
    p, o = [r.prompt_tokens for r in reqs], [r.output_tokens for r in reqs]
    return {"rps": rps, "requests": len(reqs), "prompt_tokens_p50": statistics.median(p),
            "prompt_tokens_mean": statistics.fmean(p), "output_tokens_p50": statistics.median(o),
            "output_tokens_mean": statistics.fmean(o)}


def _goodput(ev: Evaluator, system: System, budget: Budget, sc: Scenario, rates: RateRange,
             log: Callable[[str], None]) -> dict:
    """One system's goodput on the budget, and what the next lattice rate misses."""
    lattice, max_rps = rates.lattice, rates.hi
    t1, sims = time.perf_counter(), ev.simulated + ev.cached
    r = system_goodput(ev, system, budget, sc, rates)
    label = system.name or "reference (default policy)"
    r["next_rps"] = r["next_slo_met"] = r["next_worst"] = r["next_ratio"] = None
    r["at_ceiling"] = False
    if r["goodput_rps"] is not None:
        nxt = lattice.rate(lattice.index(r["goodput_rps"]) + 1)
        if nxt <= max_rps:                 # simulated by the search; asked again: a cache hit
            (o,) = ev([replace(sc, system=system.name).job(r["design"], tuple(r["cluster"]), nxt)])
            r.update(next_rps=nxt, next_slo_met=o.slo_met, next_worst=o.worst, next_ratio=o.violation)
        else:
            r["at_ceiling"] = True
            log(f"warning: {label} meets its SLOs at the search's ceiling {max_rps:g} req/s; raise --max-rps")
    log(f"{label}: goodput {format(r['goodput_rps'], '.4g') if r['goodput_rps'] is not None else 'none'} req/s"
        f" at {r['split']} ({ev.simulated + ev.cached - sims} simulations, "
        f"{time.perf_counter() - t1:.1f} s)")
    return r


def _measure(rows: list[dict], ref: dict, sc: Scenario, grid: list[float], claims: dict[str, Claim],
             workers: int | None, log: Callable[[str], None]) -> tuple[dict[str, list[dict]], int]:
    """Each system and the reference simulated again at its goodput (into its row, with its claim
    and what this run finds of it) and at the common rates of the curves; the curves and the
    simulations run."""
    at = [Point(r["system"], r["design"], tuple(r["cluster"]), r["goodput_rps"], sc)
          for r in rows + [ref] if r["goodput_rps"] is not None]
    curve_pts = [Point(r["system"], r["design"], tuple(r["cluster"]), x, sc) for r in rows for x in grid]
    measured = measure_all(at + curve_pts, workers)
    by_system = {p.system: m for p, m in zip(at, measured[:len(at)])}
    curves: dict[str, list[dict]] = {}
    for p, m in zip(curve_pts, measured[len(at):]):
        curves.setdefault(p.system, []).append(m)
    goodputs = {r["system"]: r["goodput_rps"] for r in rows}
    for r in rows + [ref]:
        r["at_goodput"] = by_system.get(r["system"])
        if r["at_goodput"] is not None and not r["at_goodput"]["meets"]:
            # the same simulation as the search's at this rate: a different answer means the
            # code under the package changed during the run
            log(f"warning: {r['system'] or 'the reference'} misses its SLOs when simulated again at its goodput "
                f"{r['goodput_rps']:.4g} req/s: did the code change during the run?")
        if r is ref:
            continue
        c = claims.get(r["system"])
        r["claim"] = c.paper_side() if c else None
        r["finding"] = finding(c, goodputs)
    return curves, len(measured)


def write_outputs(res: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    sc, b = res["scenario"], res["budget"]
    title = f"{sc['workload']}, {sc['model']}, {b['machines']} x {b['hardware']}"
    plots.goodput_bars(res["systems"], f"goodput: {title}", out / "goodput.png")
    if res["curves"]:
        plots.latency_curves(res["curves"], f"P99 latencies against the rate: {title}", out / "latency.png")
    return write_report(res, out)

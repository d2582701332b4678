"""`splitserve compare` as a function: check the question, find every system's goodput on the
same workload, model, machines and budget, measure each at its goodput, write report.md,
results.json and the plots."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from ..catalog import Catalog, load_model
from ..errors import UserError
from ..policy.systems import SYSTEMS
from ..provision.evaluate import Cache, Evaluator, LocalBackend, default_cache_dir
from ..provision.plan import ASSUMPTION, RateRange, Scenario, scenario_dict
from ..provision.search import RateLattice
from ..report.goodput import from_options
from ..workload import make_workload
from . import plots
from .budget import DEFAULT_MACHINES, Budget
from .claims import Claim, finding, load_claims
from .goodput import system_goodput
from .measure import Point, measure_all
from .report import write_report

MAX_RPS_PER_MACHINE = 20.0    # the default ceiling of the rate search: 4x the most any system carried
                              # per DGX-H100 here (4.8 req/s on coding); it keeps the search from
                              # simulating clusters hundreds of times overloaded, the slowest runs


def curve_rates(top: float, points: int) -> list[float]:
    """`points` rates from a quarter to 1.5 times `top` (the best goodput), evenly spaced."""
    if points < 1 or not top:
        return []
    if points == 1:
        return [float(f"{top:.4g}")]
    return [float(f"{top * (0.25 + 1.25 * i / (points - 1)):.4g}") for i in range(points)]


def run_compare(*, out: Path, command: str, workload: str = "coding", model: str = "llama2-70b",
                hardware: str = "dgx-h100", machines: int = DEFAULT_MACHINES, duration: float = 120.0,
                seed: int = 0, goodput_ttft: float | None = None, goodput_tpot: float | None = None,
                tolerance: float = 0.02, min_rps: float = 0.5, max_rps: float | None = None,
                curve_points: int = 6, systems: list[str] | None = None, workers: int | None = None,
                cache_dir: str | None = None, use_cache: bool = True,
                log: Callable[[str], None] = lambda m: None, config: dict | None = None,
                catalog: Catalog | None = None) -> dict:
    """`catalog` (catalog.Catalog, --catalog): the machines, designs and models of the budget and of
    every simulation (None: the built-in one)."""
    # ---- the question, checked before any simulation ----
    names = list(systems) if systems else list(SYSTEMS)
    max_rps = _check(names, duration, tolerance, min_rps, max_rps, machines, workers, curve_points)
    out.mkdir(parents=True, exist_ok=True)   # an unwritable --out fails now, not after the simulations
    budget = Budget(hardware, machines, catalog)
    designs = {s: budget.design(s) for s in {SYSTEMS[n].split for n in names}}
    load_model(model, catalog)
    make_workload(workload, rps=1.0, duration=duration, seed=seed)
    slo = from_options(goodput_ttft, goodput_tpot)
    sc = Scenario(workload, duration, seed, model, None, (slo.ttft_s, slo.tpot_s) if slo else None,
                  catalog=catalog)
    lattice = RateLattice(tolerance)          # provision's: 1.0 x (1 + tolerance)^k
    rates = RateRange(min_rps, max_rps, lattice)
    claims = load_claims()

    # ---- each system's goodput ----
    ev = Evaluator(LocalBackend(workers), Cache(Path(cache_dir) if cache_dir else default_cache_dir())
                   if use_cache else None)
    t0 = time.perf_counter()
    try:
        rows = [_goodput(ev, n, budget, sc, rates, log) for n in names]
    finally:
        ev.close()

    # ---- each at its goodput, and the latency curves ----
    grid = curve_rates(max((r["goodput_rps"] or 0.0 for r in rows), default=0.0), curve_points)
    curves, measured = _measure(rows, sc, grid, claims, workers, log)
    wall = time.perf_counter() - t0
    if grid:
        log(f"measured every system at its goodput and at {len(grid)} common rates")

    res = {
        "command": command,
        "scenario": {**scenario_dict(sc), "tolerance": tolerance, "min_rps": min_rps, "max_rps": max_rps},
        "budget": {"hardware": hardware, "machines": machines, "cost_per_hour": budget.cost_per_hour,
                   "split_design": designs.get(True, budget.design(True)).name,
                   "unsplit_design": designs.get(False, budget.design(False)).name},
        "assumption": ASSUMPTION,
        "systems": rows,
        "curve_rates": grid,
        "curves": curves,
        "search": {"simulated": ev.simulated, "cached": ev.cached, "measured": measured,
                   "wall_s": wall, "workers": ev.width},
    }
    if config is not None:   # the command's options (config_file.effective_config): compare --config results.json
        res["config"] = config
    if catalog is not None:
        res["catalog"] = catalog.note()
    write_outputs(res, out)
    return res


def _check(names: list[str], duration: float, tolerance: float, min_rps: float, max_rps: float | None,
           machines: int, workers: int | None, curve_points: int) -> float:
    """The options checked (UserError names the first wrong one); the rate search's ceiling."""
    for n in names:
        if n not in SYSTEMS:
            raise UserError(f"unknown --system {n!r}; choose from: {', '.join(SYSTEMS)}")
    if not (math.isfinite(duration) and duration > 0):
        raise UserError(f"--duration must be positive seconds, got {duration}")
    if not (0 < tolerance < 1):
        raise UserError(f"--tolerance must be in (0, 1), got {tolerance}")
    if max_rps is None:
        max_rps = MAX_RPS_PER_MACHINE * max(machines, 1)
    if not (0 < min_rps < max_rps and math.isfinite(max_rps)):
        raise UserError(f"need 0 < --min-rps < --max-rps, got {min_rps} and {max_rps}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if curve_points < 0:
        raise UserError(f"--curve-points must be >= 0, got {curve_points}")
    return max_rps


def _goodput(ev: Evaluator, name: str, budget: Budget, sc: Scenario, rates: RateRange,
             log: Callable[[str], None]) -> dict:
    """One system's goodput on the budget, and what the next lattice rate misses."""
    lattice, max_rps = rates.lattice, rates.hi
    t1, sims = time.perf_counter(), ev.simulated + ev.cached
    r = system_goodput(ev, SYSTEMS[name], budget, sc, rates)
    r["next_rps"] = r["next_slo_met"] = r["next_worst"] = r["next_ratio"] = None
    r["at_ceiling"] = False
    if r["goodput_rps"] is not None:
        nxt = lattice.rate(lattice.index(r["goodput_rps"]) + 1)
        if nxt <= max_rps:                 # simulated by the search; asked again: a cache hit
            (o,) = ev([replace(sc, system=name).job(r["design"], tuple(r["cluster"]), nxt)])
            r.update(next_rps=nxt, next_slo_met=o.slo_met, next_worst=o.worst, next_ratio=o.violation)
        else:
            r["at_ceiling"] = True
            log(f"warning: {name} meets its SLOs at the search's ceiling {max_rps:g} req/s; raise --max-rps")
    log(f"{name}: goodput {format(r['goodput_rps'], '.4g') if r['goodput_rps'] is not None else 'none'} req/s"
        f" at {r['split']} ({ev.simulated + ev.cached - sims} simulations, "
        f"{time.perf_counter() - t1:.1f} s)")
    return r


def _measure(rows: list[dict], sc: Scenario, grid: list[float], claims: dict[str, Claim],
             workers: int | None, log: Callable[[str], None]) -> tuple[dict[str, list[dict]], int]:
    """Each system simulated again at its goodput (into its row, with its claim and what this run
    finds of it) and at the common rates of the curves; the curves and the simulations run."""
    at = [Point(r["system"], r["design"], tuple(r["cluster"]), r["goodput_rps"], sc)
          for r in rows if r["goodput_rps"] is not None]
    curve_pts = [Point(r["system"], r["design"], tuple(r["cluster"]), x, sc) for r in rows for x in grid]
    measured = measure_all(at + curve_pts, workers)
    by_system = {p.system: m for p, m in zip(at, measured[:len(at)])}
    curves: dict[str, list[dict]] = {}
    for p, m in zip(curve_pts, measured[len(at):]):
        curves.setdefault(p.system, []).append(m)
    goodputs = {r["system"]: r["goodput_rps"] for r in rows}
    for r in rows:
        r["at_goodput"] = by_system.get(r["system"])
        if r["at_goodput"] is not None and not r["at_goodput"]["meets"]:
            # the same simulation as the search's at this rate: a different answer means the
            # code under the package changed during the run
            log(f"warning: {r['system']} misses its SLOs when simulated again at its goodput "
                f"{r['goodput_rps']:.4g} req/s: did the code change during the run?")
        c = claims.get(r["system"])
        r["claim"] = asdict(c) if c else None
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

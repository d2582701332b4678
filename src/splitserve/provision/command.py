"""`splitserve provision` as a function: check the question, run one search per design, pick the
best design, and print a table (or JSON)."""

from __future__ import annotations

import json
import math
import sys
import time
from functools import lru_cache
from pathlib import Path

from ..designs import load_designs
from ..errors import UserError
from . import plan
from .evaluate import Cache, Evaluator, LocalBackend, RayBackend, default_cache_dir
from .search import RateLattice, first_true

DEFAULT_DESIGNS = ("splitwise-aa", "splitwise-hh", "splitwise-ha", "splitwise-hhcap",
                   "baseline-a100", "baseline-h100")
# Seconds of simulator time per simulated request, for the estimate printed before a search.
# Measured with `splitserve simulate --json` (sim.wall_s / requests) on this project's 2-core dev
# VM: 67-117 us for coding at 5-80 req/s on 3P+3T to 30P+30T DGX-H100, 256 us for conversation at
# 40 req/s on 20P+20T; the README's 70 x 70 cost search (23 simulations of 8,400 requests in
# 21.6 s on 2 workers) comes to about 220 us. ASSUMED: 200 us, whatever the cluster and machine.
SECONDS_PER_REQUEST = 200e-6


@lru_cache(maxsize=256)
def worst_probes(n: int, width: int) -> int:
    """The most points `first_true` over n integers, `width` per round, ever tests: the maximum
    over every place the predicate can turn true (exact, by running it on each)."""
    worst = 0
    for x in range(1, n + 2):
        probes = [0]

        def test(pts: list[int], x: int = x) -> list[bool]:
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
    A bound, not a forecast: the staircase search usually stops far below it (the README's 70 x 70
    cost search took 23 of at most 577 with 2 workers)."""
    if objective in plan.OBJECTIVES:
        if d.split:
            wt = worst_probes(lim.max_token, width)
            return worst_probes(lim.max_prompt, width) + wt + lim.max_prompt * wt + 1
        return worst_probes(lim.max_machines, width) + 1
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
            out.append(f"{_config(r)}: {'; '.join(hit)}: the optimum sits on the search boundary, a "
                       f"wider search may find a better one")
    return out


def _progress(enabled: bool):
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


def run_provision(*, objective: str | None, rps: float | None, constraint: str | None,
                  budget: str | None, designs: list[str] | None = None, workload: str = "coding",
                  duration: float = 120.0, seed: int = 0, model: str = "llama2-70b",
                  profile: str | None = None, max_prompt: int = 70, max_token: int = 70,
                  max_machines: int = 140, tolerance: float = 0.02, min_rps: float = 0.5,
                  max_rps: float = 2000.0, stress_rps: float = 400.0, workers: int | None = None,
                  backend: str = "local", address: str | None = None,
                  cache_dir: str | None = None, use_cache: bool = True, progress: bool = True,
                  goodput_ttft: float | None = None, goodput_tpot: float | None = None,
                  system: str = "", catalog=None, log=None) -> dict:
    """`log(line)`, when given, gets the estimate before the searches start; `catalog`
    (catalog.Catalog, --catalog) names the designs, machines and models (None: the built-in one)."""
    # ---- the question ----
    if constraint is not None and constraint not in plan.CONSTRAINTS:
        raise UserError(f"--constraint must be iso-power or iso-cost, got {constraint!r}")
    if objective is None:
        objective = "throughput" if constraint else None
    if objective is None:
        raise UserError("say what to optimise: --objective cost|power|machines --rps R, or "
                        "--constraint iso-power|iso-cost --budget X [--objective throughput|batch]")
    if objective in plan.OBJECTIVES:
        if rps is None:
            raise UserError(f"--objective {objective} needs --rps: the load the cluster must carry")
        if not (math.isfinite(rps) and rps > 0):
            raise UserError(f"--rps must be a positive number, got {rps}")
        if constraint is not None:
            raise UserError(f"--objective {objective} minimises {objective} at --rps; "
                            "--constraint goes with --objective throughput or batch")
    elif objective in ("throughput", "batch"):
        if constraint is None or budget is None:
            raise UserError(f"--objective {objective} needs --constraint iso-power|iso-cost and --budget X "
                            "(kW, $/h, or N*HARDWARE such as 40*dgx-h100)")
        if objective == "throughput" and rps is not None:
            raise UserError("--objective throughput searches the rate itself; leave out --rps")
    else:
        raise UserError(f"--objective must be cost, power, machines, throughput or batch, got {objective!r}")
    for flag, v in (("--max-prompt", max_prompt), ("--max-token", max_token), ("--max-machines", max_machines)):
        if v < 1:
            raise UserError(f"{flag} must be at least 1, got {v}")
    if not (math.isfinite(duration) and duration > 0):
        raise UserError(f"--duration must be positive seconds, got {duration}")
    if not (0 < tolerance < 1):
        raise UserError(f"--tolerance must be in (0, 1), got {tolerance}")
    if not (0 < min_rps < max_rps):
        raise UserError(f"need 0 < --min-rps < --max-rps, got {min_rps} and {max_rps}")
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if backend not in ("local", "ray"):
        raise UserError(f"--backend must be local or ray, got {backend!r}")
    if profile is not None and not Path(profile).is_file():
        raise UserError(f"profile {profile} not found")
    known = load_designs(catalog)
    names = list(designs) if designs else list(DEFAULT_DESIGNS)
    for n in names:
        plan.design(n, catalog)              # unknown names fail before any simulation
    if system:                               # --policy: the designs of its kind (split or not)
        from ..policy.systems import system as named
        split = named(system).split
        wrong = [n for n in names if known[n].split != split]
        if designs and wrong:
            raise UserError(f"--policy {system} {'splits' if split else 'does not split'} the phases: "
                            f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} "
                            f"{'unsplit' if split else 'Splitwise'} design{'s' if len(wrong) > 1 else ''}")
        names = [n for n in names if n not in wrong]
    from ..catalog import load_model
    load_model(model, catalog)
    from ..workload import make_workload
    make_workload(workload, rps=rps or 1.0, duration=duration, seed=seed)
    budget_x = plan.budget_value(budget, constraint, catalog) if constraint else None

    from ..report.goodput import from_options
    slo = from_options(goodput_ttft, goodput_tpot)
    sc = plan.Scenario(workload, duration, seed, model, profile, (slo.ttft_s, slo.tpot_s) if slo else None,
                       system, catalog)
    lim = plan.Limits(max_prompt, max_token, max_machines)
    rates = plan.RateRange(min_rps, max_rps, RateLattice(tolerance))

    # ---- the searches ----
    be = RayBackend(address) if backend == "ray" else LocalBackend(workers)
    cache = Cache(Path(cache_dir) if cache_dir else default_cache_dir()) if use_cache else None
    bar = _progress(progress)
    task = None

    def on_done(job, out, hit):
        if bar is not None:
            bar.update(task, sims=ev.simulated, hits=ev.cached)

    def on_progress(msg: str):
        if bar is not None:
            bar.update(task, description=msg)

    ev = Evaluator(be, cache, on_done)
    est = estimate(objective, [known[n] for n in names], sc, lim, rates, ev.width, rps or
                   (stress_rps if objective == "batch" else None), constraint, budget_x)
    if log is not None:
        log(f"provisioning {len(names)} design{'s' if len(names) != 1 else ''}: at most "
            f"{est['simulations_at_most']:,} simulations (an upper bound; the searches usually need far "
            f"fewer, and the cache answers repeats); at about {est['seconds_per_simulation']:.2g} s each "
            f"({est['seconds_per_request'] * 1e6:.0f} us per request at {est['rate']:.3g} req/s for "
            f"{sc.duration:g} s; more at higher rates or on a slower machine), that many would take "
            f"{_duration(est['seconds_for_all'])} on {ev.width} {backend} worker{'s' if ev.width != 1 else ''}")
    t0 = time.perf_counter()
    rows = []
    try:
        if bar is not None:
            bar.start()
            task = bar.add_task("provisioning", total=len(names), sims=0, hits=0)
        for n in names:
            d = known[n]
            on_progress(f"{n}")
            if objective in plan.OBJECTIVES:
                rows.append(plan.cheapest(ev, d, rps, objective, sc, lim, on_progress))
            elif objective == "throughput":
                rows.append(plan.best_within_budget(ev, d, constraint, budget_x, sc, lim, rates, on_progress))
            else:
                rows.append(plan.batch_within_budget(ev, d, constraint, budget_x, sc, lim,
                                                     rps or stress_rps))
            if bar is not None:
                bar.advance(task)
    finally:
        if bar is not None:
            bar.stop()
        ev.close()
    wall = time.perf_counter() - t0

    # ---- the answer ----
    feasible = [r for r in rows if r.get("feasible")]
    if objective in plan.OBJECTIVES:
        score = lambda r: (r["objective_value"], r["machine_count"])
    elif objective == "throughput":
        score = lambda r: (-r["throughput_at_slo"], r["cost_per_hour"])
    else:
        score = lambda r: (-r["rps_per_dollar_hour"],)
    best = min(feasible, key=score) if feasible else None
    result = {
        "objective": objective, "rps": rps, "constraint": constraint, "budget": budget,
        "budget_value": budget_x,
        "budget_unit": None if constraint is None else ("kW" if constraint == "iso-power" else "$/h"),
        "scenario": plan.scenario_dict(sc),
        "limits": {"max_prompt": max_prompt, "max_token": max_token, "max_machines": max_machines},
        "rate_tolerance": tolerance if objective == "throughput" else None,
        "assumption": plan.ASSUMPTION,
        "designs": rows,
        "best": best,
        "search": {"simulated": ev.simulated, "cached": ev.cached,
                   "brute_force": sum(r.get("brute_force", 0) for r in rows),
                   "wall_s": wall, "workers": ev.width, "backend": backend,
                   **({"nodes": dict(be.nodes)} if backend == "ray" else {})},   # simulations per Ray node
        "estimate": est,
        "rate_top": rates.lattice.rate(rates.lattice.index(max_rps)) if objective == "throughput" else None,
    }
    def room(r: dict) -> tuple[bool, ...]:      # within a budget: could one more machine fit?
        per = plan.unit_values(known[r["design"]], lambda hw: getattr(hw, plan.CONSTRAINTS[constraint]), catalog)
        counts = (r["prompt_machines"], r["token_machines"]) if "prompt_machines" in r else (r["machines"],)
        used = sum(c * u for c, u in zip(counts, per))
        return tuple(used + u <= budget_x * (1 + 1e-9) for u in per)

    result["warnings"] = boundary_warnings(result, room if constraint is not None else None)
    if best is None:
        near = [r for r in rows if r.get("worst_ratio") is not None]
        result["closest"] = min(near, key=lambda r: r["worst_ratio"]) if near else None
    return result


def _slos(sc: dict) -> str:
    """What the SLO is: the nine slowdowns, or DistServe's attainment of the goodput SLOs."""
    g = sc.get("goodput")
    return f"the goodput SLOs (90% within TTFT {g[0]:g} s, TPOT {g[1]:g} s)" if g else "all nine SLOs"


def infeasible_message(res: dict) -> str:
    lim = res["limits"]
    what = (f"at {res['rps']:g} req/s" if res["rps"] and res["objective"] != "batch"
            else f"within the budget {res['budget']}")
    msg = (f"no design meets {_slos(res['scenario'])} {what} with up to {lim['max_prompt']} prompt x "
           f"{lim['max_token']} token machines ({lim['max_machines']} for baselines)")
    c = res.get("closest")
    if c:
        if c["worst_check"] == "goodput_attainment":  # worst_ratio = target / attainment
            attained = 0.9 / c["worst_ratio"] if c["worst_ratio"] else 1.0
            msg += f"; closest: {_config(c)}, {attained:.0%} of whose requests attain both (target 90%)."
        else:
            check = c["worst_check"].replace("_", " ").upper()
            msg += f"; closest: {_config(c)}, whose {check} slowdown is {c['worst_ratio']:.2f}x its limit."
        msg += " Raise --max-prompt/--max-token/--max-machines or lower --rps."
    return msg


def _config(r: dict) -> str:
    if "machines" in r:
        return f"{r['design']} with {r['machines']} machines"
    return f"{r['design']} with {r['prompt_machines']}P + {r['token_machines']}T"


def print_result(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 140)
    obj = res["objective"]
    head = (f"least {obj} meeting {_slos(res['scenario'])} at {res['rps']:g} req/s" if obj in plan.OBJECTIVES
            else f"highest throughput at SLO within {res['budget']} ({res['constraint']})" if obj == "throughput"
            else f"most requests per dollar under stress within {res['budget']} ({res['constraint']})")
    sc = res["scenario"]
    tab = Table(title=f"{head} | {sc['model']} | {sc['workload']} ({sc['duration']:g} s, seed {sc['seed']})"
                      + (f" | policy {sc['system']}" if sc.get("system") else ""),
                title_justify="left")
    for col in ("design", "prompt", "token", "machines", "$/h", "kW"):
        tab.add_column(col, justify="left" if col == "design" else "right")
    if obj == "throughput":
        tab.add_column("req/s at SLO", justify="right")
    if obj == "batch":
        tab.add_column("req/s", justify="right")
        tab.add_column("req per $", justify="right")
    tab.add_column("worst check", justify="right")
    tab.add_column("sims", justify="right")
    for r in res["designs"]:
        ok = r.get("feasible")
        split = "prompt_machines" in r
        cells = [("* " if r is res["best"] else "  ") + r["design"],
                 str(r.get("prompt_machines", "-")) if split else "-",
                 str(r.get("token_machines", "-")) if split else "-",
                 str(r.get("machine_count", r.get("machines", "-")))]
        if "cost_per_hour" in r:
            cells += [f"{r['cost_per_hour']:,.0f}", f"{r['power_kw']:,.1f}"]
        else:
            cells += ["-", "-"]
        if obj == "throughput":
            cells.append(f"{r['throughput_at_slo']:g}" if r.get("throughput_at_slo") else "-")
        if obj == "batch":
            cells += [f"{r['throughput_rps']:.1f}" if ok else "-",
                      f"{r['requests_per_dollar']:.1f}" if ok else "-"]
        if obj == "batch":
            cells.append("no SLO" if ok else r.get("reason", "-"))
        elif r.get("worst_check"):
            mark = "" if r.get("slo_met") else " [red]MISS[/]"
            cells.append(f"{r['worst_check']} {r['worst_ratio']:.2f}x{mark}")
        else:
            cells.append(r.get("reason", "-"))
        cells.append(str(r.get("simulations", 0)))
        if not ok:
            cells[0] = f"[dim]{cells[0]} (infeasible)[/]"
        tab.add_row(*cells)
    con.print(tab)
    s = res["search"]
    how = ("every largest split within the budget simulated" if obj == "batch" else
           f"exact under the assumption that {res['assumption'].split(';')[0]}")
    con.print(f"[dim]{s['simulated']} simulations ({s['cached']} answered from the cache) against "
              f"{s['brute_force']:,} for brute force; {s['wall_s']:.1f} s on {s['workers']} "
              f"{s['backend']} workers; {how}.[/]")
    if res["best"] is None:
        con.print(f"[red]{infeasible_message(res)}[/]")
    else:
        b = res["best"]
        con.print(f"best: [bold]{_config(b)}[/], ${b['cost_per_hour']:,.0f}/h, {b['power_kw']:,.1f} kW")


def write_result(res: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "provision.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    return path

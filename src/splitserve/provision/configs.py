"""Vidur-style deployment search: the capacity of every configuration of one replica, per dollar.

A configuration is what Vidur's search varies for one replica (Agrawal et al., MLSys 2024, §5):
tensor and pipeline degree, the machine-level scheduler (policy/schedulers), the batch cap
(requests holding KV at once, `max_seqs`; 0: as many as memory holds) and, for chunking
schedulers, the chunk size. Its **capacity** is the highest request rate at which a unit cluster
of such replicas (one instance of an unsplit design; one prompt and one token instance of a
Splitwise design, by default) meets the SLO: DistServe's goodput SLO when one is given (90% of
requests within TTFT and TPOT), else splitserve's nine slowdowns. Capacity per dollar is the
capacity over the unit's $/h; the Pareto front is the configurations that no other beats on both
cost and capacity. A fleet replicates the unit (Vidur's assumption: capacity scales with replicas).

Each capacity is `search.max_rate` over the rate lattice (exact on the lattice under the
assumption that a lower rate never misses the SLO), run as parallel, cached simulations through the
Evaluator. `brute_force_capacity` scans every lattice rate instead: the tests hold the two equal.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..catalog import Catalog, kv_capacity_tokens, load_hardware, load_model
from ..cluster.designs import Design
from ..errors import UserError
from ..policy.schedulers import SCHEDULERS, vllm_allocation
from .command import progress_display
from .evaluate import Cache, Evaluator, Job, LocalBackend, default_cache_dir
from .plan import RateRange, Scenario, scenario_dict
from .plan import design as find_design
from .ray_backend import RayBackend
from .search import max_rate


@dataclass(frozen=True, order=True)
class Config:
    tp: int
    pp: int
    scheduler: str
    batch_cap: int          # requests holding KV at once (0: as many as memory holds)
    chunk: int = 0          # chunk size of a chunking scheduler (0: whole prompts)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def label(self) -> str:
        cap = f"cap {self.batch_cap}" if self.batch_cap else "cap mem"
        return f"tp{self.tp} pp{self.pp} {self.scheduler} {cap}" + (f" chunk {self.chunk}" if self.chunk else "")


def grid(model: str, hardware: Sequence[str], tps: Sequence[int], pps: Sequence[int], schedulers: Sequence[str],
         caps: Sequence[int], chunks: Sequence[int], memory_utilization: float = 0.9,
         catalog: Catalog | None = None) -> tuple[list[Config], list[dict]]:
    """Every configuration to search, and those left out with the reason (the weights do not fit
    every hardware kind of the design; a tp larger than a machine). Chunk sizes apply to chunking
    schedulers only (MachineScheduler.chunked); the others run whole prompts."""
    for s in schedulers:
        if s not in SCHEDULERS:
            raise UserError(f"unknown machine scheduler {s!r}; choose from {', '.join(SCHEDULERS)}")
    spec = load_model(model, catalog)
    hws = [load_hardware(h, catalog) for h in dict.fromkeys(hardware)]
    keep, skipped = [], []
    for tp, pp in itertools.product(sorted(set(tps)), sorted(set(pps))):
        why = None
        for hw in hws:
            try:
                kv_capacity_tokens(spec, hw, tp, memory_utilization, pp)
            except UserError as e:
                why = str(e)
                break
        if why:
            skipped.append({"tp": tp, "pp": pp, "reason": why})
            continue
        for s, cap in itertools.product(schedulers, sorted(set(caps))):
            for chunk in _chunk_sizes(s, chunks):
                keep.append(Config(tp, pp, s, cap, chunk))
    return keep, skipped


def _chunk_sizes(scheduler: str, chunks: Sequence[int]) -> list[int]:
    """The chunk sizes to try under `scheduler`: none (0) for one that runs whole prompts; for a
    chunking one, whole prompts too where 0 means that (splitwise), each size given, and no size
    twice (sarathi's and tetriinfer's 0 is their default budget)."""
    s = SCHEDULERS[scheduler]
    if not s.chunked:
        return [0]
    if s.default_chunk:
        d = s.default_chunk
        return sorted({c or d for c in chunks} or {d})
    return sorted({0, *chunks})


def _job(sc: Scenario, d: Design, counts: tuple[int, ...], c: Config, rps: float) -> Job:
    """A configuration's simulation; its KV allocated on demand, as Vidur's schedulers allocate it
    (paged attention), unless its scheduler reserves by its own rule (orca)."""
    return replace(sc.job(d.name, counts, rps), parallel=(c.tp, c.pp, None, None, None, None),
                   scheduler=c.scheduler, batch_cap=c.batch_cap, chunk_size=c.chunk,
                   kv_allocation=vllm_allocation(c.scheduler))


def capacity(ev: Evaluator, d: Design, counts: tuple[int, ...], sc: Scenario, c: Config,
             rates: RateRange) -> float | None:
    """The highest lattice rate at which the unit cluster of configuration `c` meets the SLO."""
    test = lambda rs: [o.slo_met for o in ev([_job(sc, d, counts, c, r) for r in rs])]
    return max_rate(test, rates.lattice, rates.lo, rates.hi, ev.width)


def brute_force_capacity(ev: Evaluator, d: Design, counts: tuple[int, ...], sc: Scenario, c: Config,
                         rates: RateRange) -> float | None:
    """The same, from every lattice rate of the range simulated."""
    lat = rates.lattice
    ks = list(range(lat.index(rates.lo), lat.index(rates.hi) + 1))
    outs = ev([_job(sc, d, counts, c, lat.rate(k)) for k in ks])
    ok = [lat.rate(k) for k, o in zip(ks, outs) if o.slo_met]
    return max(ok) if ok else None


def pareto(rows: list[dict]) -> list[dict]:
    """The rows no other row beats on both cost (lower) and capacity (higher), cheapest first."""
    live = sorted((r for r in rows if r["capacity_rps"]), key=lambda r: (r["cost_per_hour"], -r["capacity_rps"]))
    front, best = [], 0.0
    for r in live:
        if r["capacity_rps"] > best:
            front.append(r)
            best = r["capacity_rps"]
    return front


def search(ev: Evaluator, d: Design, counts: tuple[int, ...], sc: Scenario, configs: list[Config],
           rates: RateRange, on_progress: Callable[[str], None] | None = None) -> dict:
    """Every configuration's capacity, capacity per dollar, and the Pareto front."""
    rows = []
    for i, c in enumerate(configs):
        cap = capacity(ev, d, counts, sc, c, rates)
        (out,) = ev([_job(sc, d, counts, c, cap if cap else rates.lo)])
        rows.append({**asdict(c), "label": c.label(), "gpus": out.gpus, "cost_per_hour": out.cost_per_hour,
                     "power_kw": out.power_kw, "capacity_rps": cap,
                     "capacity_per_dollar": cap / out.cost_per_hour if cap else None,
                     "worst_check": out.worst, "worst_ratio": out.violation})
        if on_progress:
            best = max((r["capacity_per_dollar"] or 0 for r in rows), default=0)
            on_progress(f"{d.name}: {i + 1}/{len(configs)} configurations, best {best * 3600:.0f} requests per $")
    front = pareto(rows)
    ranked = [r for r in rows if r["capacity_per_dollar"]]
    best = max(ranked, key=lambda r: (r["capacity_per_dollar"], -r["cost_per_hour"])) if ranked else None
    for r in rows:
        r["pareto"] = any(r is f for f in front)
    return {"design": d.name, "unit": counts, "configs": rows, "pareto": [r["label"] for r in front],
            "best": best}


def plot_pareto(result: dict, path) -> None:
    """Cost of the unit against its capacity, every configuration, the front joined."""
    import matplotlib   # here, not at the top: only --plot needs it, and it is slow to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["configs"] if r["capacity_rps"]]
    front = [r for r in rows if r["pareto"]]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for s in sorted({r["scheduler"] for r in rows}):
        pts = [r for r in rows if r["scheduler"] == s]
        ax.scatter([r["cost_per_hour"] for r in pts], [r["capacity_rps"] for r in pts], label=s, alpha=0.7)
    ax.plot([r["cost_per_hour"] for r in front], [r["capacity_rps"] for r in front], "k--", lw=1, label="Pareto front")
    for r in front:
        ax.annotate(r["label"], (r["cost_per_hour"], r["capacity_rps"]), fontsize=7, xytext=(4, 2),
                    textcoords="offset points")
    ax.set_xlabel("cost of the unit ($/h)")
    ax.set_ylabel("capacity at SLO (req/s)")
    ax.set_title(f"{result['design']}: capacity against cost, {len(rows)} configurations meeting the SLO")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- `splitserve provision --objective capacity-per-dollar` -----------------------------------
def _ints(flag: str, text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, e.g. 1,2,4,8; got {text!r}") from None
    if not vals or min(vals) < 0:
        raise UserError(f"{flag} needs at least one value, none negative; got {text!r}")
    return vals


def _describe(bar, task) -> Callable[[str], None]:
    """Progress lines onto line `task` of the progress bar (nothing without a bar)."""
    def describe(msg: str) -> None:
        if bar:
            bar.update(task, description=msg)
    return describe


def run_config_search(*, designs: list[str], model: str, workload: str, duration: float, seed: int,
                      profile: str | None, goodput: tuple[float, float] | None, tps: str, pps: str,
                      schedulers: str, batch_caps: str, chunks: str, rates: RateRange, workers: int | None,
                      backend: str, address: str | None, cache_dir: str | None, use_cache: bool,
                      progress: bool, catalog: Catalog | None = None, perf_model: str = "auto") -> dict:
    """The search for each design, over the grid the options give; a plain dict for JSON.
    `catalog`: --catalog (None: the built-in one); `perf_model`: --perf-model."""
    tp_l, pp_l, cap_l, chunk_l = (_ints("--tps", tps), _ints("--pps", pps), _ints("--batch-caps", batch_caps),
                                  _ints("--chunks", chunks) if chunks else [])
    if min(tp_l) < 1 or min(pp_l) < 1:
        raise UserError("--tps and --pps values must be at least 1")
    sched_l = [s.strip() for s in schedulers.split(",") if s.strip()]
    ds = [find_design(n, catalog) for n in designs]
    sc = Scenario(workload, duration, seed, model, profile, goodput, catalog=catalog)
    be = RayBackend(address) if backend == "ray" else LocalBackend(workers)
    cache = Cache(Path(cache_dir) if cache_dir else default_cache_dir()) if use_cache else None
    bar = progress_display(progress)
    task = None                                   # the design being searched: its line on the bar
    ev = Evaluator(be, cache, lambda job, out, hit: bar and bar.update(task, sims=ev.simulated, hits=ev.cached),
                   perf_model=perf_model)
    t0 = time.perf_counter()
    results, skipped_all = [], {}
    try:
        if bar is not None:
            bar.start()
        for d in ds:
            hws = d.kinds()
            cands, skipped = grid(model, hws, tp_l, pp_l, sched_l, cap_l, chunk_l, catalog=catalog)
            skipped_all[d.name] = skipped
            if bar is not None:
                task = bar.add_task(d.name, total=None, sims=ev.simulated, hits=ev.cached)
            counts = (1, 1) if d.split else (1,)
            results.append(search(ev, d, counts, sc, cands, rates,
                                  on_progress=_describe(bar, task)))
    finally:
        if bar is not None:
            bar.stop()
        ev.close()
    ranked = [r["best"] for r in results if r["best"]]
    best = max(ranked, key=lambda r: r["capacity_per_dollar"]) if ranked else None
    return {"objective": "capacity-per-dollar", "scenario": scenario_dict(sc), "designs": results,
            "skipped": skipped_all, "best": best,
            "best_design": next((r["design"] for r in results if r["best"] is best), None) if best else None,
            "rates": {"lo": rates.lo, "hi": rates.hi, "tolerance": rates.lattice.tol},
            "search": {"configurations": sum(len(r["configs"]) for r in results), "simulated": ev.simulated,
                       "cached": ev.cached, "wall_s": time.perf_counter() - t0, "workers": ev.width,
                       "backend": backend}}


def print_config_search(res: dict) -> None:
    con = Console(width=None if sys.stdout.isatty() else 140)
    sc = res["scenario"]
    slo = (f"90% within TTFT {sc['goodput'][0]:g} s and TPOT {sc['goodput'][1]:g} s" if sc["goodput"]
           else "all nine SLOs")
    for r in res["designs"]:
        tab = Table(title=f"capacity per dollar, {r['design']} (unit {r['unit']}) | {sc['model']} | {sc['workload']} | "
                          f"SLO: {slo}", title_justify="left")
        for col in ("configuration", "GPUs", "$/h", "capacity req/s", "req per $", "Pareto"):
            tab.add_column(col, justify="left" if col == "configuration" else "right")
        for c in sorted(r["configs"], key=lambda c: -(c["capacity_per_dollar"] or 0)):
            mark = "* " if c is r["best"] else "  "
            cap = f"{c['capacity_rps']:g}" if c["capacity_rps"] else f"< {res['rates']['lo']:g}"
            per = f"{c['capacity_per_dollar'] * 3600:,.0f}" if c["capacity_per_dollar"] else "-"
            tab.add_row(mark + c["label"], str(c["gpus"]), f"{c['cost_per_hour']:,.2f}", cap, per,
                        "yes" if c["pareto"] else "")
        con.print(tab)
        for s in res["skipped"].get(r["design"], []):
            con.print(f"[dim]left out tp{s['tp']} pp{s['pp']}: {s['reason']}[/]")
    s = res["search"]
    con.print(f"[dim]{s['configurations']} configurations, {s['simulated']} simulations ({s['cached']} from the "
              f"cache), {s['wall_s']:.1f} s on {s['workers']} {s['backend']} workers; each capacity exact on the "
              f"rate lattice (step {res['rates']['tolerance']:.0%}) if a lower rate never misses the SLO.[/]")
    b = res["best"]
    if b:
        con.print(f"best: [bold]{res['best_design']} {b['label']}[/], {b['capacity_rps']:g} req/s for "
                  f"${b['cost_per_hour']:,.2f}/h = {b['capacity_per_dollar'] * 3600:,.0f} requests per $")
    else:
        con.print("[red]no configuration meets the SLO even at the lowest rate searched (--min-rps)[/]")

"""`splitserve provision --objective goodput-per-gpu`: check the question, run Alg. 1 or Alg. 2
(algorithms.py) on a local process pool with the provisioner's cache, and print the result."""

from __future__ import annotations

import math
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ...catalog import Catalog
from ...errors import UserError
from ...report.goodput import from_options
from ...workload import make_workload
from ..evaluate import Cache, Evaluator, LocalBackend, default_cache_dir
from ..search import RateLattice
from .algorithms import high_affinity, low_affinity
from .scenario import Scenario, full_node

PLACEMENTS = ("high-affinity", "low-affinity")


def run_placement(*, placement: str, rps: float | None, model: str, workload: str,
                  goodput_ttft: float | None, goodput_tpot: float | None, hardware: str = "dgx-a100",
                  nodes: int = 4, max_pp: int | None = None, requests: int = 400, seed: int = 0,
                  profile: str | None = None, tolerance: float = 0.05, min_rps: float = 0.05,
                  max_rps: float = 256.0, workers: int | None = None, cache_dir: str | None = None,
                  use_cache: bool = True, catalog: Catalog | None = None, perf_model: str = "auto") -> dict:
    """Check the question, run Alg. 1 or Alg. 2 on a local process pool (cached), return the
    result with the search's cost. `catalog`: --catalog (None: the built-in one)."""
    if placement not in PLACEMENTS:
        raise UserError(f"--placement must be high-affinity or low-affinity, got {placement!r}")
    if rps is None or not (math.isfinite(rps) and rps > 0):
        raise UserError("--objective goodput-per-gpu needs --rps R > 0: the rate to replicate to")
    slo = from_options(goodput_ttft, goodput_tpot)
    if slo is None:
        raise UserError("--objective goodput-per-gpu needs --goodput-ttft and --goodput-tpot (s)")
    for flag, v in (("--nodes", nodes), ("--probe-requests", requests)):
        if v < 1:
            raise UserError(f"{flag} must be at least 1, got {v}")
    if max_pp is not None and max_pp < 1:
        raise UserError(f"--max-pp must be at least 1, got {max_pp}")
    if not (0 < tolerance < 1) or not (0 < min_rps < max_rps):
        raise UserError("need 0 < --tolerance < 1 and 0 < --min-rps < --max-rps")
    make_workload(workload, rps=1.0, duration=1.0)          # unknown workloads fail here
    sc = Scenario(model, workload, slo.ttft_s, slo.tpot_s, hardware=hardware, requests=requests, seed=seed,
                  profile=profile, nodes=nodes, max_pp=max_pp, lattice=RateLattice(tolerance),
                  lo_rps=min_rps, hi_rps=max_rps, catalog=catalog)
    full_node(sc)                                          # the model fits at all
    cache = Cache(Path(cache_dir) if cache_dir else default_cache_dir()) if use_cache else None
    ev = Evaluator(LocalBackend(workers), cache, perf_model=perf_model)
    t0 = time.perf_counter()
    try:
        res = (high_affinity if placement == "high-affinity" else low_affinity)(ev, sc, rps)
    finally:
        ev.close()
    res.update(objective="goodput-per-gpu", hardware=hardware, nodes=nodes,
               search={"simulated": ev.simulated, "cached": ev.cached, "wall_s": time.perf_counter() - t0,
                       "workers": ev.width, "probe_requests": requests, "rate_tolerance": tolerance})
    return res


def _par(c: dict | None, tp: str = "tp") -> str:
    return "-" if c is None else f"tp{c[tp]} pp{c['pp']}"


def print_placement(res: dict) -> None:
    con = Console()
    slo = res["slo"]
    head = (f"DistServe {res['algorithm']} placement | {res['model']} | {res['workload']} | "
            f"90% within TTFT {slo['ttft_s']:g} s, TPOT {slo['tpot_s']:g} s | {res['rps']:g} req/s")
    tab = Table(title=head, title_justify="left")
    if res["algorithm"] == "high-affinity":
        for col in ("phase", "tp", "pp", "GPUs", "goodput req/s", "per GPU"):
            tab.add_column(col, justify="right")
        for phase in ("prefill", "decode"):
            best = res[phase]
            for c in res[f"{phase}_candidates"]:
                mark = "* " if c is best else "  "
                tab.add_row(mark + phase, str(c["tp"]), str(c["pp"]), str(c["gpus"]),
                            f"{c['goodput']:.3g}", f"{c['per_gpu']:.3g}")
    else:
        for col in ("pp", "prefill tp", "decode tp", "GPUs", "goodput req/s", "per GPU"):
            tab.add_column(col, justify="right")
        for c in res["candidates"]:
            mark = "* " if c is res["pair"] else "  "
            tab.add_row(mark + str(c["pp"]), str(c["tp_p"]), str(c["tp_d"]), str(c["gpus"]),
                        f"{c['goodput']:.3g}", f"{c['per_gpu']:.3g}")
    con.print(tab)
    s = res["search"]
    con.print(f"[dim]{s['simulated']} simulations ({s['cached']} from the cache), {s['wall_s']:.1f} s on "
              f"{s['workers']} workers; rate lattice step {s['rate_tolerance']:g}, {s['probe_requests']} "
              f"requests per probe.[/]")
    if not res["feasible"]:
        con.print("[red]no candidate meets the SLOs even at the lowest rate[/]")
        return
    con.print(f"placement: {res['prefill_instances']} x prefill {_par(res['prefill'])} + "
              f"{res['decode_instances']} x decode {_par(res['decode'])} = {res['gpus']} GPUs; "
              f"goodput {res['goodput_per_gpu']:.3g} req/s per GPU")

"""`splitserve compare`: every serving system on one workload, model and budget; the options become one
CompareRequest (compare/request.py) for compare/command.py's `run_compare`."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..compare.budget import DEFAULT_MACHINES
from ..compare.request import CompareRequest
from .catalog import catalog_option, user_catalog
from .config_file import config_option, effective_config
from .lists import ListedHelp

app = typer.Typer()

QUICK = {"machines": 4, "duration": 30.0, "tolerance": 0.1, "curve_points": 3}


@app.command(cls=ListedHelp)
def compare(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Directory for report.md, results.json and the PNG plots.")] = Path("compare"),
    workload: Annotated[str, typer.Option(help="{workloads}, or an Azure LLM trace CSV: any workload simulate takes.")] = "coding",
    model: Annotated[str, typer.Option(help="Model: {models} (catalog/models.toml).")] = "llama2-70b",
    hardware: Annotated[str, typer.Option(help="Kind of every machine: one with a split and an unsplit design in catalog/designs.toml ({split_and_unsplit_hardware}).")] = "dgx-h100",
    machines: Annotated[Optional[int], typer.Option("--machines", "-n", help=f"The budget: N machines for every system (default {DEFAULT_MACHINES}; --quick: {QUICK['machines']}). A split system searches every prompt/token split of them.")] = None,
    duration: Annotated[Optional[float], typer.Option(help="Seconds of arrivals per simulation (default 120; --quick: 30).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload (the same for every system).")] = 0,
    goodput_ttft: Annotated[Optional[float], typer.Option(help="With --goodput-tpot: DistServe's SLOs instead of Splitwise's nine slowdowns: at least 90% of requests with TTFT <= this (s) and TPOT <= --goodput-tpot (s).")] = None,
    goodput_tpot: Annotated[Optional[float], typer.Option(help="Time per output token SLO (s) for --goodput-ttft.")] = None,
    tolerance: Annotated[Optional[float], typer.Option(help="Relative step of the rate lattice (default 0.02; --quick: 0.1).")] = None,
    min_rps: Annotated[float, typer.Option(help="Lowest rate searched.")] = 0.5,
    max_rps: Annotated[Optional[float], typer.Option(help="Highest rate searched (default: 20 req/s per machine of the budget; a goodput at it is flagged).")] = None,
    curve_points: Annotated[Optional[int], typer.Option(help="Rates of the latency-vs-rate curves, common to all systems (0: no curves; default 6; --quick: 3).")] = None,
    system: Annotated[Optional[list[str]], typer.Option("--system", "-s", help="Compare only these systems (repeat; default: every system of policy/systems.py: {systems}).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A CI-sized check: 4 machines, 30 s runs, a 10% rate lattice, 3 curve points (options given win).")] = False,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes (default: all cores).")] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Cache of the simulations (default ~/.cache/splitserve/provision).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate everything again.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
    catalog: Annotated[Optional[Path], catalog_option(" --hardware needs a split and an unsplit design of it.")] = None,
    config: Annotated[Optional[Path], config_option()] = None,
) -> None:
    """Run every serving system (policy/systems.py) on the same workload, model, machines and
    budget; find each one's goodput (the highest rate meeting the SLOs, at its best prompt/token
    split for a split system); write a report with latencies and cost at goodput, plots, and each
    system's paper claim beside what the simulation finds."""
    from ..compare.command import run_compare     # matplotlib: loaded when the command runs

    d: dict[str, Any] = {"machines": DEFAULT_MACHINES, "duration": 120.0, "tolerance": 0.02, "curve_points": 6}
    if quick:
        d = dict(QUICK)
    given = {"machines": machines, "duration": duration, "tolerance": tolerance, "curve_points": curve_points}
    d.update({k: v for k, v in given.items() if v is not None})
    command = "splitserve " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    log = (lambda m: None) if quiet else (lambda m: typer.echo(f"compare: {m}", err=True))
    req = CompareRequest(out=out, command=command, workload=workload, model=model, hardware=hardware, seed=seed,
                         goodput_ttft=goodput_ttft, goodput_tpot=goodput_tpot, min_rps=min_rps, max_rps=max_rps,
                         systems=tuple(system or ()), workers=workers,
                         cache_dir=str(cache_dir) if cache_dir else None, use_cache=not no_cache,
                         config=effective_config(ctx), catalog=user_catalog(catalog), **d)
    run_compare(req, log=log)
    typer.echo(f"wrote {out / 'report.md'}")

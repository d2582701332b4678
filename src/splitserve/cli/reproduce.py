"""`splitserve reproduce NAME`: a paper's evaluation run on the simulator and written beside its
numbers (reproduce/). Each command hands its options to reproduce/NAME.py's `reproduce_NAME`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UserError
from ..provision.evaluate import default_cache_dir

app = typer.Typer(name="reproduce", help="Reproduce published evaluations on the simulator.", no_args_is_help=True)

OUT_HELP = "Directory for report.md, its PNG plots and results.json."
Workers = Annotated[Optional[int], typer.Option(help="Worker processes (default: all cores).")]
Seed = Annotated[int, typer.Option(help="Seed of every workload.")]
PerfModel = Annotated[str, typer.Option(help="Step-time model: auto (the operator model fitted on measured A100/H100 "
                                             "profiles where no profile applies), operators or roofline "
                                             "(docs/perf-model.md).")]
VersusRoofline = Annotated[bool, typer.Option("--versus-roofline", help="Run under the roofline first, into "
                                              "OUT/roofline/, and set its claims beside this run's.")]


def _log(msg: str) -> None:
    typer.echo(msg, err=True)


def _cache(workers: int | None, cache_dir: Path | None, no_cache: bool) -> str | None:
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    return None if no_cache else str(cache_dir or default_cache_dir())


def _scale(quick: str) -> typer.models.OptionInfo:
    return typer.Option(help=f"tiny (a CI check), quick ({quick} on 2 cores) or full.")


@app.command("splitwise")
def splitwise(
    out: Annotated[Path, typer.Option(help=OUT_HELP)] = Path("reproduction"),
    quick: Annotated[bool, typer.Option("--quick", help="Smaller grids and shorter traces (minutes on 2 cores).")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="Profile CSV (Splitwise format); the catalog's perf model otherwise (docs/perf-model.md).")] = None,
    workers: Workers = None,
    seed: Seed = 0,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Cache of the provisioning searches (default ~/.cache/splitserve/provision).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate every provisioning search again.")] = False,
) -> None:
    """Run the Splitwise paper's evaluation (ISCA 2024) and write a report beside its numbers."""
    from ..reproduce.report import reproduce_splitwise

    cache = _cache(workers, cache_dir, no_cache)
    if profile is not None and not profile.is_file():
        raise UserError(f"profile {profile} not found")
    path = reproduce_splitwise(out, quick=quick, profile=str(profile) if profile else None, workers=workers,
                               seed=seed, log=_log, cache_dir=cache)
    typer.echo(f"wrote {path}")


@app.command("distserve")
def distserve(
    out: Annotated[Path, typer.Option(help=OUT_HELP)] = Path("reproduction/distserve"),
    scale: Annotated[str, _scale("minutes")] = "quick",
    workers: Workers = None,
    seed: Seed = 0,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Cache of the simulations (default ~/.cache/splitserve/provision).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate everything again.")] = False,
    perf_model: PerfModel = "auto",
    versus_roofline: VersusRoofline = False,
) -> None:
    """Run DistServe's evaluation (OSDI 2024: Figures 1, 8, 9, 11) on the simulator and write a report
    beside its numbers: its claims, ours, and the counterfactual runs behind each difference."""
    from ..reproduce.distserve import reproduce_distserve

    cache = _cache(workers, cache_dir, no_cache)
    path = reproduce_distserve(out, scale=scale, workers=workers, seed=seed, cache_dir=cache, log=_log,
                               perf_model=perf_model, versus_roofline=versus_roofline)
    typer.echo(f"wrote {path}")


@app.command("tetriinfer")
def tetriinfer(
    out: Annotated[Path, typer.Option(help=OUT_HELP)] = Path("reproduction/tetriinfer"),
    scale: Annotated[str, _scale("seconds")] = "quick",
    seed: Annotated[int, typer.Option(help="Added to every workload seed.")] = 0,
    perf_model: PerfModel = "auto",
    versus_roofline: Annotated[bool, typer.Option("--versus-roofline", help="Run under the roofline first, into OUT/roofline/, for the claims table's roofline column.")] = False,
) -> None:
    """Run TetriInfer's evaluation (2024: Figures 11-15, TTFT, JCT, resource use and perf/$ against vLLM on its five workloads; its instance flip under a load shift) on the simulator and write a report beside its numbers."""
    from ..reproduce.tetriinfer import run_tetriinfer

    typer.echo(f"wrote {run_tetriinfer(out, scale=scale, seed=seed, log=_log, perf_model=perf_model, versus_roofline=versus_roofline)}")


@app.command("ecoserve")
def ecoserve(
    out: Annotated[Path, typer.Option(help=OUT_HELP)] = Path("reproduction/ecoserve"),
    scale: Annotated[str, _scale("about 2 minutes")] = "quick",
    seed: Seed = 0,
    perf_model: PerfModel = "auto",
    versus_roofline: Annotated[bool, typer.Option("--versus-roofline", help="Run under the roofline first, into OUT/roofline/, for the claims table's roofline column.")] = False,
) -> None:
    """Run EcoServe's key comparison (Figure 10: normalized latency, SLO satisfaction and the rate sustained at the same latency against vLLM and FastGen on Alpaca, ShareGPT and BookCorpus) on the simulator and write a report beside its numbers."""
    from ..reproduce.ecoserve import run_ecoserve

    typer.echo(f"wrote {run_ecoserve(out, scale=scale, seed=seed, log=_log, perf_model=perf_model, versus_roofline=versus_roofline)}")


@app.command("aladdin")
def aladdin(
    out: Annotated[Path, typer.Option(help=OUT_HELP)] = Path("reproduction/aladdin"),
    scale: Annotated[str, _scale("minutes")] = "quick",
    seed: Seed = 0,
    perf_model: PerfModel = "auto",
    versus_roofline: VersusRoofline = False,
) -> None:
    """Run Aladdin's key result (2024: Figures 11 and 12, GPUs needed to meet the SLOs against the arrival rate, beside vLLM, JSQ and power of two) on the simulator and write a report beside its numbers: its claims, ours, and the counterfactual runs behind each difference."""
    from ..reproduce.aladdin import reproduce_aladdin

    typer.echo(f"wrote {reproduce_aladdin(out, scale=scale, seed=seed, log=_log, perf_model=perf_model, versus_roofline=versus_roofline)}")

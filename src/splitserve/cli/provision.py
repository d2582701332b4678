"""`splitserve provision`: the cluster to buy. The cost, power, machines, throughput and batch
objectives are one ProvisionRequest (provision/request.py) for `run_provision`; capacity-per-dollar
is provision/configs.py's search, goodput-per-gpu provision/placement/'s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UserError
from ..provision.command import run_provision
from ..provision.configs import plot_pareto, print_config_search, run_config_search
from ..provision.placement import print_placement, run_placement
from ..provision.plan import RateLattice, RateRange
from ..provision.report import infeasible_message, print_result, write_result
from ..provision.request import ProvisionRequest
from ..report.goodput import from_options
from .catalog import catalog_option, user_catalog
from .config_file import config_option, record_run
from .lists import ListedHelp

app = typer.Typer()
PLACEMENT = "DistServe placement"
CONFIGS = "Configuration search"


@app.command(cls=ListedHelp)
def provision(
    ctx: typer.Context,
    objective: Annotated[Optional[str], typer.Option(help="cost|power|machines (least at --rps, all SLOs met), throughput (most req/s at SLO within a budget), batch (most requests per $ under stress within a budget) or capacity-per-dollar (Vidur-style search over --tps/--pps/--schedulers/--batch-caps/--chunks).")] = None,
    rps: Annotated[Optional[float], typer.Option(help="Load the cluster must carry (cost/power/machines); offered stress load for batch (default 400).")] = None,
    constraint: Annotated[Optional[str], typer.Option(help="iso-power or iso-cost: the budget's kind (throughput and batch objectives).")] = None,
    budget: Annotated[Optional[str], typer.Option(help="kW (iso-power) or $/h (iso-cost), or N*HARDWARE, e.g. 40*dgx-h100 (HARDWARE: {hardware}).")] = None,
    design: Annotated[Optional[list[str]], typer.Option("--design", "-d", help="Design to consider (repeat; one of {designs}; default: {default_designs}).")] = None,
    model: Annotated[str, typer.Option(help="Model: {models} (catalog/models.toml).")] = "llama2-70b",
    workload: Annotated[str, typer.Option(help="{workloads}, or an Azure LLM trace CSV.")] = "coding",
    duration: Annotated[float, typer.Option(help="Seconds of arrivals per simulation (paper: 120; with --day, the hour or the day instead).")] = 120.0,
    day: Annotated[Optional[str], typer.Option(help="Simulate a day of traffic shaped as --rate-profile, its mean the rate each simulation is at (--rps, the rate searched, the stress load): peak-hour (its busiest hour, 3600 s) or whole (86400 s). Default: --duration at a constant rate.")] = None,
    rate_profile: Annotated[Optional[str], typer.Option(help="The rate shape of --day: azure-code or azure-conv (the Azure 2023 traces' hour, per minute, repeated: they hold no 24-hour day) or a shape file NAME.json (scripts/rate_shape.py); default with --day: azure-code for coding, azure-conv for conversation. Without --day, the shape from its start for --duration.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload (the same for every configuration).")] = 0,
    profile: Annotated[Optional[Path], typer.Option(help="Profile CSV (Splitwise format), where it has rows for the model, GPU and tp; --perf-model otherwise.")] = None,
    perf_model: Annotated[str, typer.Option(help="Model of step times where no profile applies: auto (the operator model fitted on measured A100/H100 profiles off the Splitwise grid, the roofline on it and elsewhere), operators or roofline (docs/perf-model.md).")] = "auto",
    max_prompt: Annotated[int, typer.Option(help="Most prompt machines to consider.")] = 70,
    max_token: Annotated[int, typer.Option(help="Most token machines to consider.")] = 70,
    max_machines: Annotated[int, typer.Option(help="Most machines of an unsplit baseline.")] = 140,
    tolerance: Annotated[float, typer.Option(help="Relative step of the rate search (throughput objective).")] = 0.02,
    min_rps: Annotated[float, typer.Option(help="Lowest rate the throughput search considers.")] = 0.5,
    max_rps: Annotated[float, typer.Option(help="Highest rate the throughput search considers.")] = 2000.0,
    workers: Annotated[Optional[int], typer.Option(help="Local worker processes (default: all cores).")] = None,
    backend: Annotated[str, typer.Option(help="local (a process pool) or ray.")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address, HOST:PORT of its head (default: start a local instance). Every node must run this splitserve (checked first); --profile and a trace --workload are shipped to the nodes.")] = None,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Where simulated configurations are cached (default ~/.cache/splitserve/provision).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate everything again.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Directory for provision.json.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print provision.json to stdout instead of a table.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
    placement: Annotated[Optional[str], typer.Option(help="--objective goodput-per-gpu: DistServe's placement search, high-affinity (Alg. 1: phases apart, KV over the network) or low-affinity (Alg. 2: prefill and decode segments of a stage share a node, KV over NVLink).", rich_help_panel=PLACEMENT)] = None,
    nodes: Annotated[int, typer.Option(help="--placement: node limit per instance (Alg. 1) / pipeline stages (Alg. 2).", rich_help_panel=PLACEMENT)] = 4,
    max_pp: Annotated[Optional[int], typer.Option(help="--placement: most pipeline stages to consider (default: as many as --nodes allows).", rich_help_panel=PLACEMENT)] = None,
    probe_requests: Annotated[int, typer.Option(help="--placement: requests per simulated rate.", rich_help_panel=PLACEMENT)] = 400,
    goodput_ttft: Annotated[Optional[float], typer.Option(help="With --goodput-tpot: the SLO is DistServe's instead of "
                                                               "the nine slowdowns: at least 90% of requests with TTFT "
                                                               "<= this (s) and TPOT <= --goodput-tpot (s) (default: the nine slowdowns).")] = None,
    goodput_tpot: Annotated[Optional[float], typer.Option(help="Time per output token SLO (s) for --goodput-ttft (default: the nine slowdowns).")] = None,
    tps: Annotated[str, typer.Option(help="capacity-per-dollar: tensor-parallel degrees to search.", rich_help_panel=CONFIGS)] = "1,2,4,8",
    pps: Annotated[str, typer.Option(help="capacity-per-dollar: pipeline degrees to search.", rich_help_panel=CONFIGS)] = "1",
    schedulers: Annotated[str, typer.Option(help="capacity-per-dollar: machine schedulers to search ({machine_schedulers}).", rich_help_panel=CONFIGS)] = "splitwise,vllm,orca,sarathi",
    batch_caps: Annotated[str, typer.Option(help="capacity-per-dollar: batch caps (requests holding KV at once; 0: memory decides).", rich_help_panel=CONFIGS)] = "0,64,256",
    chunks: Annotated[str, typer.Option(help="capacity-per-dollar: chunk sizes for the chunking schedulers (empty: their default).", rich_help_panel=CONFIGS)] = "512",
    policy_system: Annotated[str, typer.Option("--policy", help="Serving system whose policy every simulation runs ({systems}: policy/systems.py; cost, power, machines, throughput and batch objectives): its kind of designs only.", show_default=False)] = "",
    catalog: Annotated[Optional[Path], catalog_option()] = None,
    config: Annotated[Optional[Path], config_option()] = None,
) -> None:
    """Find the cluster to buy: the cheapest / lowest-power / fewest machines meeting the SLOs at a
    load, or the most throughput within a power or cost budget, for each design; or, with
    --objective capacity-per-dollar, the replica configuration (tp, pp, machine scheduler, batch
    cap, chunk size) with the most capacity per dollar, and the Pareto front of cost and capacity."""
    if policy_system and objective in ("capacity-per-dollar", "goodput-per-gpu"):
        raise UserError(f"--policy goes with the cost, power, machines, throughput and batch objectives; "
                        f"--objective {objective} searches its own schedulers")
    if (day or rate_profile) and objective in ("capacity-per-dollar", "goodput-per-gpu"):
        raise UserError(f"--day and --rate-profile go with the cost, power, machines, throughput and batch "
                        f"objectives, not --objective {objective}")
    cat = user_catalog(catalog)
    show = not (quiet or json_out)
    if objective == "capacity-per-dollar":
        slo = from_options(goodput_ttft, goodput_tpot)
        res = run_config_search(
            designs=design or ["baseline-a100"], model=model, workload=workload, duration=duration, seed=seed,
            profile=str(profile) if profile else None, goodput=(slo.ttft_s, slo.tpot_s) if slo else None,
            tps=tps, pps=pps, schedulers=schedulers, batch_caps=batch_caps, chunks=chunks,
            rates=RateRange(min_rps, max_rps, RateLattice(tolerance)), workers=workers, backend=backend,
            address=address, cache_dir=str(cache_dir) if cache_dir else None, use_cache=not no_cache,
            progress=show, catalog=cat, perf_model=perf_model)
        record_run(res, ctx, cat)
        if out is not None:
            write_result(res, out)
            for r in res["designs"]:
                plot_pareto(r, out / f"pareto_{r['design']}.png")
            if not json_out:
                typer.echo(f"wrote {out / 'provision.json'} and the Pareto plots")
        _show(res, json_out, print_config_search, res["best"] is not None)
        return
    if objective == "goodput-per-gpu":  # DistServe's placement (provision/placement/)
        res = run_placement(placement=placement or "low-affinity", rps=rps, model=model, workload=workload,
                            goodput_ttft=goodput_ttft, goodput_tpot=goodput_tpot, nodes=nodes, max_pp=max_pp,
                            requests=probe_requests, seed=seed, profile=str(profile) if profile else None,
                            workers=workers, cache_dir=str(cache_dir) if cache_dir else None,
                            use_cache=not no_cache, catalog=cat, perf_model=perf_model)
        record_run(res, ctx, cat)
        if out is not None:
            write_result(res, out)
        _show(res, json_out, print_placement, res["feasible"])
        return
    if placement is not None:
        raise UserError("--placement goes with --objective goodput-per-gpu")
    _provision(ctx, cat, out, json_out, quiet, ProvisionRequest(
        objective=objective, rps=rps, constraint=constraint, budget=budget, designs=tuple(design or ()),
        workload=workload, duration=duration, seed=seed, model=model, profile=str(profile) if profile else None,
        max_prompt=max_prompt, max_token=max_token, max_machines=max_machines, tolerance=tolerance,
        min_rps=min_rps, max_rps=max_rps, workers=workers, backend=backend, address=address,
        cache_dir=str(cache_dir) if cache_dir else None, use_cache=not no_cache, progress=show,
        goodput_ttft=goodput_ttft, goodput_tpot=goodput_tpot, system=policy_system, catalog=cat,
        perf_model=perf_model, rate_profile=rate_profile, day=day))


def _provision(ctx: typer.Context, cat, out: Path | None, json_out: bool, quiet: bool, req: ProvisionRequest) -> None:
    """The cost, power, machines, throughput and batch objectives: run_provision, its warnings,
    provision.json, the table or JSON; exit 1 when no design is feasible."""
    res = run_provision(req, log=None if quiet else (lambda line: typer.echo(line, err=True)))
    for w in res["warnings"]:
        typer.echo(f"warning: {w}", err=True)
    record_run(res, ctx, cat)   # the run again: provision --config provision.json
    if out is not None:
        path = write_result(res, out)
        if not json_out:
            typer.echo(f"wrote {path}")
    if json_out and res["best"] is None:
        _show(res, json_out, print_result, True)
        typer.echo(f"error: {infeasible_message(res)}", err=True)
        raise typer.Exit(1)
    _show(res, json_out, print_result, res["best"] is not None)


def _show(res: dict, json_out: bool, print_table, ok: bool) -> None:
    """The result as JSON on stdout, or its table; exit 1 when not `ok` (nothing feasible)."""
    if json_out:
        typer.echo(json.dumps(res, indent=2))
    else:
        print_table(res)
    if not ok:
        raise typer.Exit(1)

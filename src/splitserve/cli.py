"""The `splitserve` command: simulate (and, as they land, provision, serve, bench, generate)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli_catalog import CATALOG_HELP, user_catalog
from .config_file import CONFIG_HELP, apply_config, effective_config
from .errors import UserError
from .policy.config import PolicyConfig, policy_options

from .simulate import DEFAULT_DURATION, DEFAULT_MACHINES, DEFAULT_RPS, DEFAULT_SPLIT

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Phase-split (Splitwise) LLM serving: simulate, provision and serve clusters.")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"splitserve {version('splitserve')}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the package version and exit.")] = False,
) -> None:
    """Phase-split (Splitwise) LLM serving: simulate, provision and serve clusters."""


def record_run(result: dict, ctx: typer.Context, cat) -> None:
    """What an output records of its run: the command's options by long name (`config`, what
    --config reads back) and the user catalog used, if any (`catalog`)."""
    result["config"] = effective_config(ctx)
    if cat is not None:
        result["catalog"] = cat.note()


@app.command()
@policy_options
def simulate(
    ctx: typer.Context,
    design: Annotated[str, typer.Option(help="Cluster design: splitwise-aa|hh|ha|hhcap, baseline-a100|h100|h200.")] = "splitwise-hh",
    prompt_machines: Annotated[Optional[str], typer.Option("--prompt-machines", "-p", help=f"Prompt-pool machines (Splitwise designs): N, or a mix of kinds such as 2*dgx-h100+1*dgx-a100 (default {DEFAULT_SPLIT[0]} when none of -p/-t/-m is given).")] = None,
    token_machines: Annotated[Optional[str], typer.Option("--token-machines", "-t", help=f"Token-pool machines (Splitwise designs): N, or N*KIND+M*KIND (default {DEFAULT_SPLIT[1]} when none of -p/-t/-m is given).")] = None,
    machines: Annotated[Optional[str], typer.Option("--machines", "-m", help=f"Machines of an unsplit baseline: N, or N*KIND+M*KIND (default {DEFAULT_MACHINES} when none of -p/-t/-m is given).")] = None,
    model: Annotated[str, typer.Option(help="Model: llama2-70b, bloom-176b, llama3-8b, llama3-70b, llama2-7b, llama2-13b, codellama-34b, opt-13b, opt-66b, opt-175b (catalog/models.toml).")] = "llama2-70b",
    workload: Annotated[str, typer.Option(help="coding, conversation, or an Azure LLM trace CSV.")] = "coding",
    rps: Annotated[Optional[float], typer.Option(help=f"Mean arrival rate, requests/s (default {DEFAULT_RPS:g} for a synthetic workload; a trace CSV is time-scaled to it, and without it replays at its own timestamps and rate).")] = None,
    duration: Annotated[Optional[float], typer.Option(help=f"Seconds of arrivals to simulate (default {DEFAULT_DURATION:g}; a trace CSV without --rps: its own span, which this clips, or repeats back to back when longer).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic workload.")] = 0,
    arrivals: Annotated[str, typer.Option(help="poisson, trace (a CSV's own timestamps) or auto.")] = "auto",
    rate_profile: Annotated[Optional[str], typer.Option(help="Time-varying Poisson rate instead of --rps: "
                                                            "START_S:RATE,... (e.g. 0:5,60:20,120:5) or "
                                                            "sin:MEAN:AMPLITUDE:PERIOD_S.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Directory for summary.json.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json to stdout instead of tables.")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="Profile CSV (Splitwise format); roofline model otherwise.")] = None,
    machine_profile: Annotated[Optional[Path], typer.Option(help="A `splitserve profile` directory: simulate "
                                                                 "that machine running its model (--design "
                                                                 "splitwise* with -p/-t, else the unsplit baseline "
                                                                 "with -m; --model is ignored).")] = None,
    tp: Annotated[Optional[int], typer.Option(help="Tensor-parallel GPUs of each model instance, within one machine "
                                                   "(default: all its GPUs). -p/-t/-m then count instances.", rich_help_panel="Parallelism")] = None,
    pp: Annotated[Optional[int], typer.Option(help="Pipeline stages of each instance (default 1); an instance has "
                                                   "tp x pp GPUs and pays for them.", rich_help_panel="Parallelism")] = None,
    ep: Annotated[Optional[int], typer.Option(help="Expert parallel degree of a mixture-of-experts model "
                                                   "(equal to --tp: experts spread over the tensor-parallel GPUs, "
                                                   "all-to-alls in place of the MLP all-reduce; default 1: none).", rich_help_panel="Parallelism")] = None,
    prompt_tp: Annotated[Optional[int], typer.Option(help="--tp of the prompt pool's instances (default --tp).", rich_help_panel="Parallelism")] = None,
    prompt_pp: Annotated[Optional[int], typer.Option(help="--pp of the prompt pool's instances (default --pp).", rich_help_panel="Parallelism")] = None,
    token_tp: Annotated[Optional[int], typer.Option(help="--tp of the token pool's instances (default --tp).", rich_help_panel="Parallelism")] = None,
    token_pp: Annotated[Optional[int], typer.Option(help="--pp of the token pool's instances (default --pp).", rich_help_panel="Parallelism")] = None,
    max_context: Annotated[Optional[int], typer.Option(help="Clip prompt+output to this many tokens (default: no clipping).")] = None,
    memory_utilization: Annotated[float, typer.Option(help="Fraction of HBM usable for weights and KV.")] = 0.9,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
    trace_out: Annotated[Optional[Path], typer.Option(help="Write a Chrome trace of every machine's batches and every "
                                                          "KV transfer here (open in ui.perfetto.dev).")] = None,
    trace_max_events: Annotated[int, typer.Option(help="Events the trace keeps at most (the first ones; the rest are "
                                                       "counted).")] = 500_000,
    goodput_ttft: Annotated[Optional[float], typer.Option(help="With --goodput-tpot: DistServe's SLO attainment, the "
                                                               "share of requests with TTFT <= this (s) and TPOT <= "
                                                               "--goodput-tpot (s) (default: not measured).")] = None,
    goodput_tpot: Annotated[Optional[float], typer.Option(help="Time per output token SLO (s) for --goodput-ttft (default: not measured).")] = None,
    catalog: Annotated[Optional[Path], typer.Option(envvar="SPLITSERVE_CATALOG", help=CATALOG_HELP)] = None,
    config: Annotated[Optional[Path], typer.Option(is_eager=True, callback=apply_config, help=CONFIG_HELP)] = None,
    policy: PolicyConfig = PolicyConfig(),
) -> None:
    """Simulate a cluster serving a workload; print latency, SLO and cost, write summary.json."""
    from .designs import Parallelism
    from .report.goodput import from_options
    from .simulate import run_simulation

    goodput = from_options(goodput_ttft, goodput_tpot)
    cat = user_catalog(catalog)
    trace = None
    if trace_out is not None:
        from .sim.chrome_trace import ChromeTrace
        if trace_max_events < 1:
            raise UserError("--trace-max-events must be at least 1")
        trace = ChromeTrace(trace_max_events)

    summary = run_simulation(
        design=design, prompt_machines=prompt_machines, token_machines=token_machines,
        machines=machines, model=model, workload=workload, rps=rps, duration=duration, seed=seed,
        arrivals=arrivals, profile=str(profile) if profile else None, policy=policy, rate_profile=rate_profile,
        parallel=Parallelism(tp, pp, prompt_tp, prompt_pp, token_tp, token_pp, ep),
        max_context=max_context, machine_profile=str(machine_profile) if machine_profile else None,
        memory_utilization=memory_utilization, progress=not (quiet or json_out), trace=trace, goodput=goodput,
        catalog=cat)
    record_run(summary, ctx, cat)   # the run again: simulate --config summary.json
    if trace is not None:
        trace.write(trace_out)
        if not json_out:
            typer.echo(f"wrote {trace_out} ({len(trace.events):,} events"
                       + (f"; {trace.dropped:,} more not kept, past --trace-max-events)" if trace.dropped else ")"))
    if out is not None:
        from .report.summary import write_summary
        path = write_summary(summary, out)
        if not json_out:
            typer.echo(f"wrote {path}")
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        from .report.table import print_summary
        print_summary(summary)


@app.command()
def provision(
    ctx: typer.Context,
    objective: Annotated[Optional[str], typer.Option(help="cost|power|machines (least at --rps, all SLOs met), throughput (most req/s at SLO within a budget), batch (most requests per $ under stress within a budget) or capacity-per-dollar (Vidur-style search over --tps/--pps/--schedulers/--batch-caps/--chunks).")] = None,
    rps: Annotated[Optional[float], typer.Option(help="Load the cluster must carry (cost/power/machines); offered stress load for batch (default 400).")] = None,
    constraint: Annotated[Optional[str], typer.Option(help="iso-power or iso-cost: the budget's kind (throughput and batch objectives).")] = None,
    budget: Annotated[Optional[str], typer.Option(help="kW (iso-power) or $/h (iso-cost), or N*HARDWARE, e.g. 40*dgx-h100.")] = None,
    design: Annotated[Optional[list[str]], typer.Option("--design", "-d", help="Design to consider (repeat; default: Splitwise AA/HH/HA/HHcap and baselines A100/H100).")] = None,
    model: Annotated[str, typer.Option(help="Model: llama2-70b, bloom-176b, llama3-8b, llama3-70b, llama2-7b, llama2-13b, codellama-34b, opt-13b, opt-66b, opt-175b (catalog/models.toml).")] = "llama2-70b",
    workload: Annotated[str, typer.Option(help="coding, conversation, or an Azure LLM trace CSV.")] = "coding",
    duration: Annotated[float, typer.Option(help="Seconds of arrivals per simulation (paper: 120).")] = 120.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload (the same for every configuration).")] = 0,
    profile: Annotated[Optional[Path], typer.Option(help="Profile CSV (Splitwise format); calibrated roofline otherwise.")] = None,
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
    placement: Annotated[Optional[str], typer.Option(help="--objective goodput-per-gpu: DistServe's placement search, high-affinity (Alg. 1: phases apart, KV over the network) or low-affinity (Alg. 2: prefill and decode segments of a stage share a node, KV over NVLink).", rich_help_panel="DistServe placement")] = None,
    nodes: Annotated[int, typer.Option(help="--placement: node limit per instance (Alg. 1) / pipeline stages (Alg. 2).", rich_help_panel="DistServe placement")] = 4,
    max_pp: Annotated[Optional[int], typer.Option(help="--placement: most pipeline stages to consider (default: as many as --nodes allows).", rich_help_panel="DistServe placement")] = None,
    probe_requests: Annotated[int, typer.Option(help="--placement: requests per simulated rate.", rich_help_panel="DistServe placement")] = 400,
    goodput_ttft: Annotated[Optional[float], typer.Option(help="With --goodput-tpot: the SLO is DistServe's instead of "
                                                               "the nine slowdowns: at least 90% of requests with TTFT "
                                                               "<= this (s) and TPOT <= --goodput-tpot (s) (default: the nine slowdowns).")] = None,
    goodput_tpot: Annotated[Optional[float], typer.Option(help="Time per output token SLO (s) for --goodput-ttft (default: the nine slowdowns).")] = None,
    tps: Annotated[str, typer.Option(help="capacity-per-dollar: tensor-parallel degrees to search.", rich_help_panel="Configuration search")] = "1,2,4,8",
    pps: Annotated[str, typer.Option(help="capacity-per-dollar: pipeline degrees to search.", rich_help_panel="Configuration search")] = "1",
    schedulers: Annotated[str, typer.Option(help="capacity-per-dollar: machine schedulers to search (splitwise, vllm, orca, sarathi, fastertransformer, lightllm).", rich_help_panel="Configuration search")] = "splitwise,vllm,orca,sarathi",
    batch_caps: Annotated[str, typer.Option(help="capacity-per-dollar: batch caps (requests holding KV at once; 0: memory decides).", rich_help_panel="Configuration search")] = "0,64,256",
    chunks: Annotated[str, typer.Option(help="capacity-per-dollar: chunk sizes for the chunking schedulers (empty: their default).", rich_help_panel="Configuration search")] = "512",
    policy_system: Annotated[str, typer.Option("--policy", help="Serving system whose policy every simulation runs (policy/systems.py; cost, power, machines, throughput and batch objectives): its kind of designs only.", show_default=False)] = "",
    catalog: Annotated[Optional[Path], typer.Option(envvar="SPLITSERVE_CATALOG", help=CATALOG_HELP)] = None,
    config: Annotated[Optional[Path], typer.Option(is_eager=True, callback=apply_config, help=CONFIG_HELP)] = None,
) -> None:
    """Find the cluster to buy: the cheapest / lowest-power / fewest machines meeting the SLOs at a
    load, or the most throughput within a power or cost budget, for each design; or, with
    --objective capacity-per-dollar, the replica configuration (tp, pp, machine scheduler, batch
    cap, chunk size) with the most capacity per dollar, and the Pareto front of cost and capacity."""
    if policy_system and objective in ("capacity-per-dollar", "goodput-per-gpu"):
        raise UserError(f"--policy goes with the cost, power, machines, throughput and batch objectives; "
                        f"--objective {objective} searches its own schedulers")
    cat = user_catalog(catalog)
    if objective == "capacity-per-dollar":
        from .provision import configs
        from .provision.plan import RateRange
        from .provision.search import RateLattice
        from .report.goodput import from_options

        slo = from_options(goodput_ttft, goodput_tpot)
        res = configs.run_config_search(
            designs=design or ["baseline-a100"], model=model, workload=workload, duration=duration, seed=seed,
            profile=str(profile) if profile else None, goodput=(slo.ttft_s, slo.tpot_s) if slo else None,
            tps=tps, pps=pps, schedulers=schedulers, batch_caps=batch_caps, chunks=chunks,
            rates=RateRange(min_rps, max_rps, RateLattice(tolerance)), workers=workers, backend=backend,
            address=address, cache_dir=str(cache_dir) if cache_dir else None, use_cache=not no_cache,
            progress=not (quiet or json_out), catalog=cat)
        record_run(res, ctx, cat)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "provision.json").write_text(json.dumps(res, indent=2) + "\n")
            for r in res["designs"]:
                configs.plot_pareto(r, out / f"pareto_{r['design']}.png")
            if not json_out:
                typer.echo(f"wrote {out / 'provision.json'} and the Pareto plots")
        if json_out:
            typer.echo(json.dumps(res, indent=2))
        else:
            configs.print_config_search(res)
        if res["best"] is None:
            raise typer.Exit(1)
        return
    if objective == "goodput-per-gpu":  # DistServe's placement (provision/placement.py)
        from .provision.placement import print_placement, run_placement

        res = run_placement(placement=placement or "low-affinity", rps=rps, model=model, workload=workload,
                            goodput_ttft=goodput_ttft, goodput_tpot=goodput_tpot, nodes=nodes, max_pp=max_pp,
                            requests=probe_requests, seed=seed, profile=str(profile) if profile else None,
                            workers=workers, cache_dir=str(cache_dir) if cache_dir else None,
                            use_cache=not no_cache, catalog=cat)
        record_run(res, ctx, cat)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "provision.json").write_text(json.dumps(res, indent=2) + "\n")
        if json_out:
            typer.echo(json.dumps(res, indent=2))
        else:
            print_placement(res)
        if not res["feasible"]:
            raise typer.Exit(1)
        return
    if placement is not None:
        raise UserError("--placement goes with --objective goodput-per-gpu")
    from .provision.command import infeasible_message, print_result, run_provision, write_result

    res = run_provision(
        objective=objective, rps=rps, constraint=constraint, budget=budget, designs=design,
        workload=workload, duration=duration, seed=seed, model=model,
        profile=str(profile) if profile else None, max_prompt=max_prompt, max_token=max_token,
        max_machines=max_machines, tolerance=tolerance, min_rps=min_rps, max_rps=max_rps,
        workers=workers, backend=backend, address=address,
        cache_dir=str(cache_dir) if cache_dir else None, use_cache=not no_cache,
        progress=not (quiet or json_out), goodput_ttft=goodput_ttft,
        goodput_tpot=goodput_tpot, system=policy_system, catalog=cat,
        log=None if quiet else (lambda line: typer.echo(line, err=True)))
    for w in res["warnings"]:
        typer.echo(f"warning: {w}", err=True)
    record_run(res, ctx, cat)   # the run again: provision --config provision.json
    if out is not None:
        path = write_result(res, out)
        if not json_out:
            typer.echo(f"wrote {path}")
    if json_out:
        typer.echo(json.dumps(res, indent=2))
    else:
        print_result(res)
    if res["best"] is None:
        if json_out:
            typer.echo(f"error: {infeasible_message(res)}", err=True)
        raise typer.Exit(1)


@app.command()
def generate(
    model: Annotated[str, typer.Option(help="A Hugging Face-format directory (config.json + *.safetensors) or a preset: tiny, small, llama3-8b, llama2-70b (add -<N>l for N layers, e.g. llama2-70b-8l).")] = "tiny",
    prompt: Annotated[Optional[str], typer.Option(help="Prompt text (needs the model's tokenizer).")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="Prompt as token ids: 1,2,3.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 16,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the sampler (preset weights are always the same).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"token_ids": [...], "text": ...}.')] = False,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "auto",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16, float16 or auto.")] = "auto",
) -> None:
    """Generate one completion with splitserve's own engine (paged KV cache)."""
    from .cli_generate import generate_command

    if max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {max_tokens}")
    generate_command(model=model, prompt=prompt, prompt_ids=prompt_ids, max_tokens=max_tokens,
                     temperature=temperature, seed=seed, json_out=json_out, device=device, dtype=dtype)


reproduce_app = typer.Typer(help="Reproduce published evaluations on the simulator.", no_args_is_help=True)
app.add_typer(reproduce_app, name="reproduce")


@reproduce_app.command("splitwise")
def reproduce_splitwise(
    out: Annotated[Path, typer.Option(help="Directory for report.md, its PNG plots and results.json.")] = Path("reproduction"),
    quick: Annotated[bool, typer.Option("--quick", help="Smaller grids and shorter traces (minutes on 2 cores).")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="Profile CSV (Splitwise format); calibrated roofline otherwise.")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker processes (default: all cores).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of every workload.")] = 0,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Cache of the provisioning searches (default ~/.cache/splitserve/provision).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate every provisioning search again.")] = False,
) -> None:
    """Run the Splitwise paper's evaluation (ISCA 2024) and write a report beside its numbers."""
    from .reproduce.report import reproduce_splitwise as run

    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    if profile is not None and not profile.is_file():
        raise UserError(f"profile {profile} not found")
    from .provision.evaluate import default_cache_dir

    cache = None if no_cache else str(cache_dir or default_cache_dir())
    path = run(out, quick=quick, profile=str(profile) if profile else None, workers=workers, seed=seed,
               log=lambda msg: typer.echo(msg, err=True), cache_dir=cache)
    typer.echo(f"wrote {path}")


@reproduce_app.command("distserve")
def reproduce_distserve(
    out: Annotated[Path, typer.Option(help="Directory for report.md, its PNG plots and results.json.")] = Path("reproduction/distserve"),
    scale: Annotated[str, typer.Option(help="tiny (a CI check), quick (minutes on 2 cores) or full.")] = "quick",
    workers: Annotated[Optional[int], typer.Option(help="Worker processes (default: all cores).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of every workload.")] = 0,
    cache_dir: Annotated[Optional[Path], typer.Option(help="Cache of the simulations (default ~/.cache/splitserve/provision).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Simulate everything again.")] = False,
) -> None:
    """Run DistServe's evaluation (OSDI 2024: Figures 8, 9, 11) on the simulator and write a report
    beside its numbers."""
    from .provision.evaluate import default_cache_dir
    from .reproduce.distserve import reproduce_distserve as run

    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    cache = None if no_cache else str(cache_dir or default_cache_dir())
    path = run(out, scale=scale, workers=workers, seed=seed, cache_dir=cache,
               log=lambda msg: typer.echo(msg, err=True))
    typer.echo(f"wrote {path}")


def _reproduce_neighbour(name: str, quick: str, seed_help: str, doc: str) -> None:
    """`splitserve reproduce NAME`: reproduce/NAME.py's `reproduce_NAME(out, scale, seed, log)`."""

    def command(  # (typer.Option defaults, not Annotated: these annotations are read in the module's scope)
        out: Path = typer.Option(Path(f"reproduction/{name}"), help="Directory for report.md, its PNG plots and results.json."),
        scale: str = typer.Option("quick", help=f"tiny (a CI check), quick ({quick} on 2 cores) or full."),
        seed: int = typer.Option(0, help=seed_help),
    ) -> None:
        import importlib
        run = getattr(importlib.import_module(f".reproduce.{name}", __package__), f"reproduce_{name}")
        path = run(out, scale=scale, seed=seed, log=lambda msg: typer.echo(msg, err=True))
        typer.echo(f"wrote {path}")

    command.__doc__ = doc
    reproduce_app.command(name)(command)


for _args in (
    ("tetriinfer", "seconds", "Added to every workload seed.",
     "Run TetriInfer's evaluation (2024: Figures 11-15, TTFT, JCT, resource use and perf/$ against vLLM on its "
     "five workloads; its instance flip under a load shift) on the simulator and write a report beside its numbers."),
    ("ecoserve", "about 2 minutes", "Seed of every workload.",
     "Run EcoServe's key comparison (Figure 10: normalized latency, SLO satisfaction and the rate sustained at the "
     "same latency against vLLM and FastGen on Alpaca, ShareGPT and BookCorpus) on the simulator and write a report "
     "beside its numbers."),
    ("aladdin", "minutes", "Seed of every workload.",
     "Run Aladdin's key result (2024: Figures 11 and 12, GPUs needed to meet the SLOs against the arrival rate, "
     "beside vLLM, JSQ and power of two) on the simulator and write a report beside its numbers."),
):
    _reproduce_neighbour(*_args)


from .bench.cli import bench as _bench_cmd; app.command("bench")(_bench_cmd)
from .compare.cli import compare as _compare_cmd; app.command("compare")(_compare_cmd)
from .serve.cli import serve as _serve_cmd; app.command("serve")(_serve_cmd)
from .twin.cli import profile as _profile_cmd; app.command("profile")(_profile_cmd)
from .twin.cli import twin as _twin_cmd; app.command("twin")(_twin_cmd)
from .cli_tokenizer import tokenizer_app as _tokenizer_app; app.add_typer(_tokenizer_app, name="tokenizer")


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes become one `error:` line and exit status 2, never a traceback."""
    try:
        result = app(args=argv, standalone_mode=False)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except typer.Exit as e:
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.filename is None:   # not a path the user gave (a socket, a library): a bug, keep the traceback
            raise
        print(f"error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    except Exception as e:
        # usage errors of the command-line parser (typer bundles its own click): bad option,
        # bad value, missing argument. They carry their own message and exit code.
        fmt = getattr(e, "format_message", None)
        if not callable(fmt) or not hasattr(e, "exit_code"):
            raise
        if e.exit_code == 0:
            return 0
        print(f"error: {fmt()}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())

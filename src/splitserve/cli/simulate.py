"""`splitserve simulate`: a cluster serving a workload, simulated: the options become one SimRequest
(sim/run.py); `--machine-profile` loads the measured machine (twin/machine.py) it runs on."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..cluster.designs import Parallelism
from ..errors import UserError
from ..policy.config import PolicyConfig, policy_options
from ..report.goodput import from_options
from ..report.summary import write_summary
from ..report.table import print_summary
from ..sim.chrome_trace import ChromeTrace
from ..sim.requests_out import RequestsOut
from ..sim.run import DEFAULT_DURATION, DEFAULT_MACHINES, DEFAULT_RPS, DEFAULT_SPLIT, SimRequest
from ..sim.run import simulate as simulate_run
from ..twin.machine import load_machine_profile
from .catalog import catalog_option, user_catalog
from .config_file import config_option, record_run
from .lists import ListedHelp

app = typer.Typer()
PARALLEL = "Parallelism"
log = logging.getLogger(__name__)


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's /proc, to 1/100 s); None where there is none."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])     # field 22, starttime
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@app.command(cls=ListedHelp)
@policy_options
def simulate(
    ctx: typer.Context,
    design: Annotated[str, typer.Option(help="Cluster design: {designs} (catalog/designs.toml).")] = "splitwise-hh",
    prompt_machines: Annotated[Optional[str], typer.Option("--prompt-machines", "-p", help=f"Prompt-pool machines (Splitwise designs): N, or a mix of kinds such as 2*dgx-h100+1*dgx-a100 (default {DEFAULT_SPLIT[0]} when none of -p/-t/-m is given).")] = None,
    token_machines: Annotated[Optional[str], typer.Option("--token-machines", "-t", help=f"Token-pool machines (Splitwise designs): N, or N*KIND+M*KIND (default {DEFAULT_SPLIT[1]} when none of -p/-t/-m is given).")] = None,
    machines: Annotated[Optional[str], typer.Option("--machines", "-m", help=f"Machines of an unsplit baseline: N, or N*KIND+M*KIND (default {DEFAULT_MACHINES} when none of -p/-t/-m is given).")] = None,
    model: Annotated[str, typer.Option(help="Model: {models} (catalog/models.toml).")] = "llama2-70b",
    workload: Annotated[str, typer.Option(help="{workloads}, or an Azure LLM trace CSV.")] = "coding",
    rps: Annotated[Optional[float], typer.Option(help=f"Mean arrival rate, requests/s (default {DEFAULT_RPS:g} for a synthetic workload; a trace CSV is time-scaled to it, and without it replays at its own timestamps and rate).")] = None,
    duration: Annotated[Optional[float], typer.Option(help=f"Seconds of arrivals to simulate (default {DEFAULT_DURATION:g}; a trace CSV without --rps: its own span, which this clips, or repeats back to back when longer).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic workload.")] = 0,
    arrivals: Annotated[str, typer.Option(help="poisson, trace (a CSV's own timestamps) or auto.")] = "auto",
    rate_profile: Annotated[Optional[str], typer.Option(help="Time-varying Poisson rate instead of --rps: "
                                                            "START_S:RATE,... (e.g. 0:5,60:20,120:5), "
                                                            "sin:MEAN:AMPLITUDE:PERIOD_S, or a measured rate shape "
                                                            "scaled to --rps as its mean: azure-code or azure-conv "
                                                            "(the Azure 2023 traces' hour, per minute, repeated; "
                                                            "they hold no 24-hour day) or a shape file NAME.json "
                                                            "(scripts/rate_shape.py); NAME:peak=R gives the busiest "
                                                            "minute's rate instead. docs/simulate.md.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Directory for summary.json.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print summary.json to stdout instead of tables.")] = False,
    profile: Annotated[Optional[Path], typer.Option(help="Profile CSV (Splitwise format), where it has rows for the "
                                                    "model, GPU and tp; --perf-model otherwise.")] = None,
    perf_model: Annotated[str, typer.Option(help="Model of step times where no profile applies: auto (operators "
                                                 "fitted on measured A100/H100 profiles, the roofline elsewhere and "
                                                 "where it stands in for the Splitwise profile), operators or "
                                                 "roofline. docs/perf-model.md.")] = "auto",
    decode_lookup: Annotated[str, typer.Option(help="How a decode batch's time is read off --profile: batch-size "
                                                    "(its batch sweep and context) or batch-tokens (SplitwiseSim's "
                                                    "lookup, an experiment: the rows' median token time by prompt "
                                                    "size x batch size, read at the number of decodes; "
                                                    "perf/decode_lookup.py, docs/splitwisesim.md).")] = "batch-size",
    machine_profile: Annotated[Optional[Path], typer.Option(help="A `splitserve profile` directory: simulate "
                                                                 "that machine running its model (--design "
                                                                 "splitwise* with -p/-t, else the unsplit baseline "
                                                                 "with -m; --model is ignored).")] = None,
    tp: Annotated[Optional[int], typer.Option(help="Tensor-parallel GPUs of each model instance, within one machine "
                                                   "(default: all its GPUs). -p/-t/-m then count instances.", rich_help_panel=PARALLEL)] = None,
    pp: Annotated[Optional[int], typer.Option(help="Pipeline stages of each instance (default 1); an instance has "
                                                   "tp x pp GPUs and pays for them.", rich_help_panel=PARALLEL)] = None,
    ep: Annotated[Optional[int], typer.Option(help="Expert parallel degree of a mixture-of-experts model "
                                                   "(equal to --tp: experts spread over the tensor-parallel GPUs, "
                                                   "all-to-alls in place of the MLP all-reduce; default 1: none).", rich_help_panel=PARALLEL)] = None,
    prompt_tp: Annotated[Optional[int], typer.Option(help="--tp of the prompt pool's instances (default --tp).", rich_help_panel=PARALLEL)] = None,
    prompt_pp: Annotated[Optional[int], typer.Option(help="--pp of the prompt pool's instances (default --pp).", rich_help_panel=PARALLEL)] = None,
    token_tp: Annotated[Optional[int], typer.Option(help="--tp of the token pool's instances (default --tp).", rich_help_panel=PARALLEL)] = None,
    token_pp: Annotated[Optional[int], typer.Option(help="--pp of the token pool's instances (default --pp).", rich_help_panel=PARALLEL)] = None,
    max_context: Annotated[Optional[int], typer.Option(help="Clip prompt+output to this many tokens (default: no clipping).")] = None,
    conversation: Annotated[Optional[str], typer.Option(help="--workload multiturn / sysprompt: the conversations' shape, "
                                                             "e.g. turns=10,system=0,user=64:256,reply=64:256,think=2 "
                                                             "(token ranges, mean think seconds; workload/conversations.py).")] = None,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="Model each machine's prefix "
                                                 "cache as serve's engine keeps it (a workload whose prompts share "
                                                 "prefixes: multiturn, sysprompt): cached blocks are not computed, nor "
                                                 "sent to a token machine holding them (sim/prefix.py).")] = True,
    block_size: Annotated[int, typer.Option(help="KV block tokens of the modelled prefix caches (serve's engine: 16).")] = 16,
    memory_utilization: Annotated[float, typer.Option(help="Fraction of HBM usable for weights and KV.")] = 0.9,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress line.")] = False,
    trace_out: Annotated[Optional[Path], typer.Option(help="Write a Chrome trace of every machine's batches and every "
                                                          "KV transfer here (open in ui.perfetto.dev).")] = None,
    requests_out: Annotated[Optional[Path], typer.Option(help="Write one row per request as it completes "
                                                              "(id, arrival, prompt and output tokens, TTFT, mean "
                                                              "TBT, E2E, its machines) to this .csv or .jsonl file, "
                                                              "streamed: memory stays flat.")] = None,
    trace_max_events: Annotated[int, typer.Option(help="Events the trace keeps at most (the first ones; the rest are "
                                                       "counted).")] = 500_000,
    goodput_ttft: Annotated[Optional[float], typer.Option(help="With --goodput-tpot: DistServe's SLO attainment, the "
                                                               "share of requests with TTFT <= this (s) and TPOT <= "
                                                               "--goodput-tpot (s) (default: not measured).")] = None,
    goodput_tpot: Annotated[Optional[float], typer.Option(help="Time per output token SLO (s) for --goodput-ttft (default: not measured).")] = None,
    catalog: Annotated[Optional[Path], catalog_option()] = None,
    config: Annotated[Optional[Path], config_option()] = None,
    policy: PolicyConfig = PolicyConfig(),
) -> None:
    """Simulate a cluster serving a workload; print latency, SLO and cost, write summary.json."""
    started, t0 = process_age_s(), time.perf_counter()
    goodput = from_options(goodput_ttft, goodput_tpot)
    cat = user_catalog(catalog)
    trace = None
    if trace_out is not None:
        if trace_max_events < 1:
            raise UserError("--trace-max-events must be at least 1")
        trace = ChromeTrace(trace_max_events)
    req = SimRequest(
        design=design, prompt_machines=prompt_machines, token_machines=token_machines, machines=machines,
        model=model, workload=workload, rps=rps, duration=duration, seed=seed, arrivals=arrivals,
        rate_profile=rate_profile, profile=str(profile) if profile else None, perf_model=perf_model,
        decode_lookup=decode_lookup,
        parallel=Parallelism(tp, pp, prompt_tp, prompt_pp, token_tp, token_pp, ep), policy=policy,
        max_context=max_context, memory_utilization=memory_utilization,
        machine=load_machine_profile(machine_profile) if machine_profile else None, goodput=goodput, catalog=cat,
        conversation=conversation, prefix_caching=prefix_caching, block_size=block_size)
    rows = RequestsOut(requests_out) if requests_out is not None else None
    try:
        summary, _ = simulate_run(req, progress=not (quiet or json_out), trace=trace, requests_out=rows)
    finally:
        if rows is not None:
            rows.close()
    if rows is not None and not json_out:
        typer.echo(f"wrote {requests_out} ({rows.rows:,} requests)")
    t1 = time.perf_counter()
    record_run(summary, ctx, cat)   # the run again: simulate --config summary.json
    _show(summary, trace, trace_out, out, json_out)
    loop = summary["sim"]["wall_s"]
    log.debug("where the time went: start-up %s, building the run and the summary %.2f s, simulation %.2f s "
              "(the workload generated as it runs), output %.2f s",
              "?" if started is None else f"{started:.2f} s", t1 - t0 - loop, loop, time.perf_counter() - t1)


def _show(summary: dict, trace: ChromeTrace | None, trace_out: Path | None, out: Path | None, json_out: bool) -> None:
    """The trace and summary.json written where asked; summary.json on stdout, or its tables."""
    if trace is not None and trace_out is not None:   # made for --trace-out
        trace.write(trace_out)
        if not json_out:
            typer.echo(f"wrote {trace_out} ({len(trace.events):,} events"
                       + (f"; {trace.dropped:,} more not kept, past --trace-max-events)" if trace.dropped else ")"))
    if out is not None:
        path = write_summary(summary, out)
        if not json_out:
            typer.echo(f"wrote {path}")
    if json_out:
        typer.echo(json.dumps(summary, indent=2))
    else:
        print_summary(summary)

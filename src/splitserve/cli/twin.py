"""`splitserve twin`: the live cluster and the simulator on the same requests, compared
(twin/command.py); the options become one TwinSpec (twin/run.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UserError
from ..policy.config import SERVING, PolicyConfig, policy_options
from .lists import ListedHelp

app = typer.Typer()


@app.command(cls=ListedHelp)
@policy_options(defaults=SERVING)
def twin(
    profile_dir: Annotated[Path, typer.Option("--profile-dir", help="A `splitserve profile --out` directory: the "
                                              "machine and model to run and to simulate.")] = Path("profiles/local"),
    design: Annotated[str, typer.Option(help="splitwise (--prompt-workers + --token-workers) or baseline "
                                             "(--mixed-workers).")] = "splitwise",
    prompt_workers: Annotated[int, typer.Option("--prompt-workers", "-p", help="Prompt workers (splitwise).")] = 1,
    token_workers: Annotated[int, typer.Option("--token-workers", "-t", help="Token workers (splitwise).")] = 1,
    mixed_workers: Annotated[int, typer.Option("--mixed-workers", "-m", help="Mixed workers (baseline).")] = 2,
    workload: Annotated[str, typer.Option(help="{workloads}, or an Azure LLM trace CSV.")] = "coding",
    rps: Annotated[Optional[float], typer.Option(help="Arrival rate, requests/s.")] = None,
    load: Annotated[Optional[float], typer.Option(help="Arrival rate as a fraction of the capacity the profile "
                                                       "predicts (instead of --rps).")] = None,
    duration: Annotated[float, typer.Option(help="Seconds of arrivals.")] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed of the workload (arrivals, sizes, prompt ids).")] = 0,
    max_prompt_tokens: Annotated[Optional[int], typer.Option(help="Cap each prompt (CHANGES the workload, in both "
                                                                   "runs alike).")] = 512,
    max_tokens_cap: Annotated[Optional[int], typer.Option(help="Cap each output (CHANGES the workload, in both "
                                                                "runs alike).")] = 64,
    transport: Annotated[str, typer.Option(help="KV transport: tcp or local.")] = "tcp",
    conversation: Annotated[Optional[str], typer.Option(help="--workload multiturn / sysprompt: the conversations' "
                                                             "shape (turns=4,user=32:96,reply=16:48,think=1); both "
                                                             "runs keep prefix caches and ignore the caps.")] = None,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="Conversations: "
                                                 "prefix caches in both runs (off: in neither).")] = True,
    pin_workers: Annotated[bool, typer.Option("--pin-workers/--no-pin-workers", help="Run serve with --pin-workers "
                                              "(each worker on its own cores, in turn) and simulate the cores shared "
                                              "per core; off: where the OS moves them, the cores shared evenly.")] = True,
    num_blocks: Annotated[Optional[int], typer.Option("--num-blocks", help="KV blocks per worker in both runs "
                                                        "(default: the profile's); fewer make the cluster run out of "
                                                        "KV, so that decodes are preempted (--kv-allocation "
                                                        "on-demand) or requests wait for memory.")] = None,
    calibrate: Annotated[bool, typer.Option("--calibrate/--no-calibrate", help="Before the live run, time 16 of "
                                            "the run's own requests alone in an engine (sizing --load), then send 32 "
                                            "through the server's workers one at a time (a few seconds) and "
                                            "simulate the host at the speed they ran at against the profile's model.")] = True,
    out: Annotated[Path, typer.Option(help="Directory for report.md, cdf.png, twin.json, live/ and sim/.")] =
    Path("twin"),
    policy: PolicyConfig = PolicyConfig(),
) -> None:
    """Run the live cluster and the simulator on the same requests and compare them: starts
    `splitserve serve` on this machine, replays the workload with `splitserve bench`, simulates
    the same arrivals and sizes on the measured machine (same design and policy), and writes a
    side-by-side report (P50/P90/P99 of TTFT, TBT, E2E, throughput, ...) with the relative errors,
    the latency CDFs of both, and the live workers' engine steps against the model's time for each
    (which term of the model misses)."""
    from ..twin.command import run_twin
    from ..twin.machine import load_machine_profile
    from ..twin.report import table_text
    from ..twin.run import TwinSpec, predicted_capacity

    if design not in ("splitwise", "baseline"):
        raise UserError(f"--design must be splitwise or baseline, got {design!r}")
    if (rps is None) == (load is None):
        raise UserError("give one of --rps and --load")
    machine = load_machine_profile(profile_dir, transport)
    spec = TwinSpec(design=design, prompt=prompt_workers, token=token_workers, machines=mixed_workers,
                    workload=workload, rps=rps or 1.0, duration=duration, seed=seed,
                    max_prompt_tokens=max_prompt_tokens, max_tokens_cap=max_tokens_cap, transport=transport,
                    policy=policy, conversation=conversation, prefix_caching=prefix_caching,
                    pin_workers=pin_workers)
    if calibrate:
        from ..twin.calibrate import calibrated
        machine = calibrated(machine, spec)
        typer.echo(f"the host runs prompt steps x{machine.drift[0]:.3f} and decode steps x{machine.drift[1]:.3f} "
                   "the profile's time now, timed on the run's own request sizes", err=True)
    if num_blocks is not None:  # serve's --num-blocks, and the simulated KV capacity alike (not the calibration's)
        if num_blocks < 1:
            raise UserError(f"--num-blocks must be at least 1, got {num_blocks}")
        bs = int(machine.facts.get("block_size", 16))
        machine = dataclasses.replace(machine, facts={**machine.facts, "num_blocks": num_blocks,
                                                      "kv_capacity_tokens": num_blocks * bs})
    capacity = predicted_capacity(spec, machine)
    if load is not None:
        spec = dataclasses.replace(spec, rps=load * capacity)
    typer.echo(f"capacity the profile predicts: {capacity:.2f} req/s; running at {spec.rps:.2f} req/s "
               f"({spec.rps / capacity:.0%})", err=True)
    rows, step_rows, report = run_twin(spec, machine, capacity, profile_dir, out,
                                       log=lambda m: typer.echo(m, err=True), calibrate=calibrate)
    typer.echo(table_text(rows))
    if step_rows:
        typer.echo(f"engine steps: live {step_rows[-1].live_s:.1f} s, model {step_rows[-1].model_s:.1f} s "
                   f"({step_rows[-1].error:+.1%}); by kind in the report")
    typer.echo(f"wrote {report}")

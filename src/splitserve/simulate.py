"""`splitserve simulate` as a function: validate, build the cluster and workload, run, summarise.

The provisioner calls `run_simulation` many times; the CLI once. Defaults give a small
Splitwise-HH cluster (4 prompt + 1 token DGX-H100) under 10 req/s of synthetic coding traffic
for two minutes.

One rule for the rate and the span (`arrival_defaults`): a synthetic workload defaults to
DEFAULT_RPS for DEFAULT_DURATION; a trace CSV given neither --rps nor --rate-profile is replayed
at its own timestamps and rate over its own span (--duration then clips it, or replays it back to
back when longer); a trace with --rps is time-scaled to that rate, for DEFAULT_DURATION unless
--duration says otherwise.
"""

from __future__ import annotations

import math
import sys

from .errors import UserError
from .policy.config import PolicyConfig

DEFAULT_SPLIT = (4, 1)
DEFAULT_MACHINES = 5
DEFAULT_RPS = 10.0
DEFAULT_DURATION = 120.0


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(msg)


def arrival_defaults(workload: str, rps: float | None, duration: float | None,
                     rate_profile: str | None) -> tuple[float | None, float | None]:
    """The rate and span a run uses when --rps / --duration are left out (the module's rule):
    None for a trace replayed at its own timestamps, which make_workload then takes from it."""
    from .workload.synthetic import SYNTHETIC

    if workload not in SYNTHETIC and rps is None and rate_profile is None:
        return None, duration                 # the trace's own rate; its own span unless clipped
    rps = DEFAULT_RPS if rps is None and rate_profile is None else rps
    return rps, DEFAULT_DURATION if duration is None else duration


def run_simulation(*, design: str = "splitwise-hh", prompt_machines: int | str | None = None,
                   token_machines: int | str | None = None, machines: int | str | None = None,
                   model: str = "llama2-70b", workload: str = "coding", rps: float | None = None,
                   duration: float | None = None, seed: int = 0, arrivals: str = "auto",
                   profile: str | None = None, parallel=None, policy: PolicyConfig = PolicyConfig(),
                   max_context: int | None = None, memory_utilization: float = 0.9,
                   progress: bool = False, record_requests: bool = False,
                   return_result: bool = False, machine_profile: str | None = None, trace=None,
                   goodput=None, colocated: bool = False, rate_profile: str | None = None,
                   catalog=None):
    """One simulation; `catalog` (catalog.Catalog) names the designs, machines and models (default:
    the built-in catalog)."""
    from .catalog import load_model
    from .designs import Parallelism, load_designs, make_cluster
    from .report.summary import simulation_summary
    from .sim.simulator import SimConfig, Simulation
    from .workload import make_workload

    prompt_machines, token_machines, machines = (int(c) if isinstance(c, str) and c.strip().isdigit() else c
                                                 for c in (prompt_machines, token_machines, machines))
    _check(rate_profile is None or rps is None, "give --rps or --rate-profile, not both")
    rps, duration = arrival_defaults(workload, rps, duration, rate_profile)
    _check(rps is None or (math.isfinite(rps) and rps > 0), f"--rps must be a positive number, got {rps}")
    _check(duration is None or (math.isfinite(duration) and duration > 0),
           f"--duration must be positive seconds, got {duration}")
    _check(0 < memory_utilization <= 1, f"--memory-utilization must be in (0, 1], got {memory_utilization}")
    _check(arrivals in ("auto", "poisson", "trace"), f"--arrivals must be auto, poisson or trace, got {arrivals!r}")
    machine = None
    if machine_profile is not None:  # every machine is the measured one (twin/machine.py)
        from .twin.machine import load_machine_profile
        machine = load_machine_profile(machine_profile)
        cluster = machine.cluster("splitwise" if design.startswith("splitwise") else "baseline",
                                  prompt=prompt_machines or 1, token=token_machines or 1, machines=machines or 2)
        spec = machine.model
    else:
        designs = load_designs(catalog)
        if design in designs and prompt_machines is None and token_machines is None and machines is None:
            if designs[design].split:
                prompt_machines, token_machines = DEFAULT_SPLIT
            else:
                machines = DEFAULT_MACHINES
        cluster = make_cluster(design, prompt_machines=prompt_machines, token_machines=token_machines,
                               machines=machines, parallel=parallel or Parallelism(), catalog=catalog)
        spec = load_model(model, catalog)
    if policy.split is False and cluster.design.split:
        cluster = cluster.unsplit()
    _check(policy.split is not True or cluster.design.split,
           f"--policy {policy.system} splits the phases: give a Splitwise design (--design splitwise-hh -p N -t M)")
    wl = make_workload(workload, rps=rps, duration=duration, seed=seed, arrivals=arrivals,
                       max_context=max_context, rate_profile=rate_profile)
    if machine is not None:  # the serving path's CPU at this load (twin/machine.py)
        prompts = [r.prompt_tokens for r in wl]
        moved = sum(prompts) / len(prompts) if prompts and cluster.design.split else 0.0
        machine = machine.under_load(wl.rps, moved)
    cfg = SimConfig(policy=policy, memory_utilization=memory_utilization, profile=profile,
                    record_requests=record_requests, machine=machine, trace=trace, goodput=goodput,
                    colocated=colocated, catalog=catalog)
    sim = Simulation(cluster, spec, wl, cfg)
    if progress and sys.stderr.isatty():
        result = _run_with_progress(sim, wl.duration or 0.0)
    else:
        result = sim.run()
    summary = simulation_summary(result, wl, goodput=goodput)
    return (summary, result) if return_result else summary


def _run_with_progress(sim, duration: float):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,.0f} s"),
                  TextColumn("{task.fields[ev]:,} events"), TimeElapsedColumn(), TimeRemainingColumn(),
                  transient=True) as bar:
        task = bar.add_task("sim", total=duration, ev=0)
        return sim.run(progress=lambda now, ev: bar.update(task, completed=min(now, duration), ev=ev))

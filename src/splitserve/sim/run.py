"""One simulation run, as `splitserve simulate`, provisioning's jobs, compare and the reproductions
ask for it: a SimRequest (checked when made), the cluster and workload it names built, simulated,
summarised (summary.json's dict).

Defaults give a small Splitwise-HH cluster (4 prompt + 1 token DGX-H100) under 10 req/s of
synthetic coding traffic for two minutes.

One rule for the rate and the span (`arrival_defaults`): a synthetic workload defaults to
DEFAULT_RPS for DEFAULT_DURATION (a rate shape, workload/shape.py, that names no rate: DEFAULT_RPS
its mean); a trace CSV given neither --rps nor --rate-profile is replayed
at its own timestamps and rate over its own span (--duration then clips it, or replays it back to
back when longer); a trace with --rps is time-scaled to that rate, for DEFAULT_DURATION unless
--duration says otherwise.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

from ..catalog import Catalog, ModelSpec, load_model
from ..cluster.designs import ClusterSpec, Parallelism, load_designs, make_cluster
from ..errors import UserError
from ..perf.decode_lookup import check_decode_lookup
from ..policy.config import PolicyConfig
from ..report.goodput import GoodputSLO
from ..report.summary import simulation_summary
from ..workload import make_workload
from ..workload.conversations import SHAPES
from ..workload.shape import is_shape, names_rate
from ..workload.synthetic import SYNTHETIC
from .chrome_trace import ChromeTrace
from .config import SimConfig
from .hosts import Hosts
from .metrics import SimResult
from .requests_out import RequestsOut
from .simulator import Simulation

DEFAULT_SPLIT = (4, 1)
DEFAULT_MACHINES = 5
DEFAULT_RPS = 10.0
DEFAULT_DURATION = 120.0


class MeasuredMachine(Protocol):
    """A measured machine every instance of the run is (twin/machine.py MachineProfile: `simulate
    --machine-profile`): its model, its cluster of a design, and the hosts a simulation runs on at a
    load (sim/hosts.py)."""

    @property
    def model(self) -> ModelSpec: ...

    def cluster(self, design: str, *, prompt: int = 1, token: int = 1, machines: int = 2) -> ClusterSpec: ...

    def under_load(self, rate: float, moved_tokens: float = 0.0) -> Hosts: ...


def arrival_defaults(workload: str, rps: float | None, duration: float | None,
                     rate_profile: str | None) -> tuple[float | None, float | None]:
    """The rate and span a run uses when --rps / --duration are left out (the module's rule):
    None for a trace replayed at its own timestamps, which make_workload then takes from it."""
    if workload not in SYNTHETIC and workload not in SHAPES and rps is None and rate_profile is None:
        return None, duration                 # the trace's own rate; its own span unless clipped
    rated = rate_profile is not None and not (is_shape(rate_profile) and not names_rate(rate_profile))
    rps = DEFAULT_RPS if rps is None and not rated else rps
    return rps, DEFAULT_DURATION if duration is None else duration


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(msg)


def _machines(count: int | str | None, default: int) -> int:
    """A count of a measured machine's cluster (`default` when not given): a number, as its
    machines are all of one kind."""
    if not count:
        return default
    if not isinstance(count, int):
        raise UserError(f"a measured machine's counts are numbers of machines, got {count!r}")
    return count


@dataclass(slots=True, kw_only=True)
class SimRequest:
    """What one simulation runs: the cluster (a design of `catalog`, None: the built-in one, with
    its pools' counts: N or N*KIND+M*KIND, and their parallelism; or a measured `machine`, then
    --model is its own), the model, the workload and its arrivals, the policy, the goodput SLOs
    to count. Made, `rps` and `duration` hold what the run uses (arrival_defaults)."""

    design: str = "splitwise-hh"
    prompt_machines: int | str | None = None
    token_machines: int | str | None = None
    machines: int | str | None = None
    model: str = "llama2-70b"
    workload: str = "coding"
    rps: float | None = None
    duration: float | None = None
    seed: int = 0
    arrivals: str = "auto"
    rate_profile: str | None = None
    profile: str | None = None
    perf_model: str = "auto"
    decode_lookup: str = "batch-size"      # how decode times are read off the profile (perf/decode_lookup.py)
    parallel: Parallelism | None = None
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    max_context: int | None = None
    memory_utilization: float = 0.9
    machine: MeasuredMachine | None = None
    goodput: GoodputSLO | None = None
    colocated: bool = False
    catalog: Catalog | None = None
    conversation: str | None = None    # multiturn / sysprompt: the conversations' shape (workload/conversations.py)
    prefix_caching: bool = True        # model the machines' prefix caches (sim/prefix.py)
    block_size: int = 16               # their KV block tokens

    def __post_init__(self) -> None:
        self.prompt_machines, self.token_machines, self.machines = (
            int(c) if isinstance(c, str) and c.strip().isdigit() else c
            for c in (self.prompt_machines, self.token_machines, self.machines))
        _check(self.rate_profile is None or self.rps is None or is_shape(self.rate_profile),
               "give --rps or --rate-profile, not both (--rps is the mean of a rate shape)")
        self.rps, self.duration = rps, duration = arrival_defaults(self.workload, self.rps, self.duration,
                                                                   self.rate_profile)
        _check(rps is None or (math.isfinite(rps) and rps > 0), f"--rps must be a positive number, got {rps}")
        _check(duration is None or (math.isfinite(duration) and duration > 0),
               f"--duration must be positive seconds, got {duration}")
        _check(0 < self.memory_utilization <= 1,
               f"--memory-utilization must be in (0, 1], got {self.memory_utilization}")
        _check(self.block_size >= 1, f"--block-size must be at least 1, got {self.block_size}")
        check_decode_lookup(self.decode_lookup)
        _check(self.arrivals in ("auto", "poisson", "trace"),
               f"--arrivals must be auto, poisson or trace, got {self.arrivals!r}")

    def cluster(self) -> tuple[ClusterSpec, ModelSpec]:
        """The cluster the run simulates and the model it serves."""
        p, t, m = self.prompt_machines, self.token_machines, self.machines
        if self.machine is not None:       # every machine is the measured one
            cluster = self.machine.cluster("splitwise" if self.design.startswith("splitwise") else "baseline",
                                           prompt=_machines(p, 1), token=_machines(t, 1),
                                           machines=_machines(m, 2))
            spec = self.machine.model
        else:
            designs = load_designs(self.catalog)
            if self.design in designs and p is None and t is None and m is None:
                if designs[self.design].split:
                    p, t = DEFAULT_SPLIT
                else:
                    m = DEFAULT_MACHINES
            cluster = make_cluster(self.design, prompt_machines=p, token_machines=t, machines=m,
                                   parallel=self.parallel or Parallelism(), catalog=self.catalog)
            spec = load_model(self.model, self.catalog)
        policy = self.policy
        if policy.split is False and cluster.design.split:
            cluster = cluster.unsplit()
        _check(policy.split is not True or cluster.design.split,
               f"--policy {policy.system} splits the phases: give a Splitwise design (--design splitwise-hh -p N -t M)")
        return cluster, spec


def simulate(req: SimRequest, *, progress: bool = False, record_requests: bool = False,
             trace: ChromeTrace | None = None,
             requests_out: RequestsOut | None = None) -> tuple[dict[str, Any], SimResult]:
    """Run `req`; returns (summary.json's dict, the SimResult). `progress`: a bar on a terminal;
    `record_requests`: keep every request with its token times; `trace`: every batch and transfer;
    `requests_out`: a row per request as it completes."""
    cluster, spec = req.cluster()
    wl = make_workload(req.workload, rps=req.rps, duration=req.duration, seed=req.seed, arrivals=req.arrivals,
                       max_context=req.max_context, rate_profile=req.rate_profile, conversation=req.conversation)
    machine: Hosts | None = None
    if req.machine is not None:  # the serving path's CPU at this load (twin/machine.py)
        prompts = [r.prompt_tokens for r in wl]
        moved = sum(prompts) / len(prompts) if prompts and cluster.design.split else 0.0
        machine = req.machine.under_load(wl.rps, moved)
    cfg = SimConfig(policy=req.policy, memory_utilization=req.memory_utilization, profile=req.profile,
                    perf_model=req.perf_model, decode_lookup=req.decode_lookup, record_requests=record_requests, machine=machine, trace=trace, goodput=req.goodput,
                    colocated=req.colocated, catalog=req.catalog, prefix_caching=req.prefix_caching,
                    block_size=req.block_size)
    sim = Simulation(cluster, spec, wl, cfg)
    sim.metrics.on_complete = requests_out
    if progress and sys.stderr.isatty():
        result = _run_with_progress(sim, wl.duration or 0.0)
    else:
        result = sim.run()
    return simulation_summary(result, wl, goodput=req.goodput), result


@overload
def run_simulation(*, progress: bool = False, record_requests: bool = False, return_result: Literal[False] = False,
                   trace: ChromeTrace | None = None, **settings: Any) -> dict[str, Any]: ...


@overload
def run_simulation(*, progress: bool = False, record_requests: bool = False, return_result: Literal[True],
                   trace: ChromeTrace | None = None, **settings: Any) -> tuple[dict[str, Any], SimResult]: ...


def run_simulation(*, progress: bool = False, record_requests: bool = False, return_result: bool = False,
                   trace: ChromeTrace | None = None,
                   **settings: Any) -> dict[str, Any] | tuple[dict[str, Any], SimResult]:
    """`simulate(SimRequest(**settings))` for callers that name the settings as keywords
    (provisioning's jobs, compare, the reproductions, tests): the summary, or (summary, SimResult)
    with `return_result`."""
    summary, result = simulate(SimRequest(**settings), progress=progress, record_requests=record_requests,
                               trace=trace)
    return (summary, result) if return_result else summary


def _run_with_progress(sim: Simulation, duration: float) -> SimResult:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,.0f} s"),
                  TextColumn("{task.fields[ev]:,} events"), TimeElapsedColumn(), TimeRemainingColumn(),
                  transient=True) as bar:
        task = bar.add_task("sim", total=duration, ev=0)
        return sim.run(progress=lambda now, ev: bar.update(task, completed=min(now, duration), ev=ev))

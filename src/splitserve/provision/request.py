"""What `splitserve provision` is asked (cost, power, machines, throughput and batch objectives),
as one typed object, checked once when it is made: a bad value is a UserError naming the option
to fix, before any simulation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..catalog import load_model
from ..cluster.designs import load_designs
from ..errors import UserError
from ..perf import check_perf_model
from ..policy.systems import system as named_system
from ..report.goodput import GoodputSLO, from_options
from ..workload import make_workload
from . import plan
from .days import day_shape, day_span

if TYPE_CHECKING:
    from ..catalog import Catalog

DEFAULT_DESIGNS = ("splitwise-aa", "splitwise-hh", "splitwise-ha", "splitwise-hhcap",
                   "baseline-a100", "baseline-h100")


@dataclass(slots=True)
class ProvisionRequest:
    """The question and how to search it. `designs` empty: DEFAULT_DESIGNS; `system` (--policy) a
    serving system whose policy every simulation runs, on the designs of its kind only; `catalog`
    (--catalog) names the designs, machines and models (None: the built-in one). Made, it holds
    the objective it answers (throughput when only a constraint is given), the designs it searches
    (`names`) and the budget as a number (`budget_x`, kW or $/h). `rate_profile` (a rate shape) and
    `day` (peak-hour, whole): the simulations over a day of traffic (provision/days.py); made, `shape`
    holds the shape they follow ("": a constant rate)."""

    objective: str | None = None
    rps: float | None = None
    constraint: str | None = None
    budget: str | None = None
    designs: tuple[str, ...] = ()
    workload: str = "coding"
    duration: float = 120.0
    seed: int = 0
    model: str = "llama2-70b"
    profile: str | None = None
    max_prompt: int = 70
    max_token: int = 70
    max_machines: int = 140
    tolerance: float = 0.02
    min_rps: float = 0.5
    max_rps: float = 2000.0
    stress_rps: float = 400.0
    workers: int | None = None
    backend: str = "local"
    address: str | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    progress: bool = True
    goodput_ttft: float | None = None
    goodput_tpot: float | None = None
    system: str = ""
    catalog: Catalog | None = None
    perf_model: str = "auto"
    rate_profile: str | None = None
    day: str | None = None
    names: list[str] = field(init=False)
    budget_x: float | None = field(init=False)
    shape: str = field(init=False)

    def __post_init__(self) -> None:
        check_perf_model(self.perf_model)
        self.designs = tuple(self.designs or ())
        self._check_question()
        self._check_search()
        self.names = self._design_names()
        load_model(self.model, self.catalog)
        self.shape = day_shape(self.workload, self.rate_profile, self.day, self.backend)
        make_workload(self.workload, rps=self.rps or 1.0, duration=self.duration, seed=self.seed,
                      rate_profile=self.shape or None)
        self.budget_x = (plan.budget_value(self.budget, self.constraint, self.catalog)
                         if self.constraint and self.budget is not None else None)  # both or neither (_check_question)
        self.goodput()

    def _check_question(self) -> None:
        objective, constraint, rps = self.objective, self.constraint, self.rps
        if constraint is not None and constraint not in plan.CONSTRAINTS:
            raise UserError(f"--constraint must be iso-power or iso-cost, got {constraint!r}")
        if objective is None:
            objective = self.objective = "throughput" if constraint else None
        if objective is None:
            raise UserError("say what to optimise: --objective cost|power|machines --rps R, or "
                            "--constraint iso-power|iso-cost --budget X [--objective throughput|batch]")
        if objective in plan.OBJECTIVES:
            if rps is None:
                raise UserError(f"--objective {objective} needs --rps: the load the cluster must carry")
            if not (math.isfinite(rps) and rps > 0):
                raise UserError(f"--rps must be a positive number, got {rps}")
            if constraint is not None:
                raise UserError(f"--objective {objective} minimises {objective} at --rps; "
                                "--constraint goes with --objective throughput or batch")
        elif objective in ("throughput", "batch"):
            if constraint is None or self.budget is None:
                raise UserError(f"--objective {objective} needs --constraint iso-power|iso-cost and --budget X "
                                "(kW, $/h, or N*HARDWARE such as 40*dgx-h100)")
            if objective == "throughput" and rps is not None:
                raise UserError("--objective throughput searches the rate itself; leave out --rps")
        else:
            raise UserError(f"--objective must be cost, power, machines, throughput or batch, got {objective!r}")

    def _check_search(self) -> None:
        for flag, v in (("--max-prompt", self.max_prompt), ("--max-token", self.max_token),
                        ("--max-machines", self.max_machines)):
            if v < 1:
                raise UserError(f"{flag} must be at least 1, got {v}")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise UserError(f"--duration must be positive seconds, got {self.duration}")
        if not (0 < self.tolerance < 1):
            raise UserError(f"--tolerance must be in (0, 1), got {self.tolerance}")
        if not (0 < self.min_rps < self.max_rps):
            raise UserError(f"need 0 < --min-rps < --max-rps, got {self.min_rps} and {self.max_rps}")
        if self.workers is not None and self.workers < 1:
            raise UserError(f"--workers must be at least 1, got {self.workers}")
        if self.backend not in ("local", "ray"):
            raise UserError(f"--backend must be local or ray, got {self.backend!r}")
        if self.profile is not None and not Path(self.profile).is_file():
            raise UserError(f"profile {self.profile} not found")

    def _design_names(self) -> list[str]:
        """The designs to search: those asked (default DEFAULT_DESIGNS), every name checked before
        any simulation; with --policy, those of its kind (split or not) only."""
        names = list(self.designs) if self.designs else list(DEFAULT_DESIGNS)
        for n in names:
            plan.design(n, self.catalog)
        if not self.system:
            return names
        known = load_designs(self.catalog)
        split = named_system(self.system).split
        wrong = [n for n in names if known[n].split != split]
        if self.designs and wrong:
            raise UserError(f"--policy {self.system} {'splits' if split else 'does not split'} the phases: "
                            f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} "
                            f"{'unsplit' if split else 'Splitwise'} design{'s' if len(wrong) > 1 else ''}")
        return [n for n in names if n not in wrong]

    def goodput(self) -> GoodputSLO | None:
        """DistServe's SLO (--goodput-ttft, --goodput-tpot), or None: the nine slowdowns."""
        return from_options(self.goodput_ttft, self.goodput_tpot)

    def scenario(self) -> plan.Scenario:
        slo = self.goodput()
        profile, duration = day_span(self.shape, self.day, self.duration)
        return plan.Scenario(self.workload, duration, self.seed, self.model, self.profile,
                             (slo.ttft_s, slo.tpot_s) if slo else None, self.system, self.catalog,
                             rate_profile=profile)

    def limits(self) -> plan.Limits:
        return plan.Limits(self.max_prompt, self.max_token, self.max_machines)

    def rates(self) -> plan.RateRange:
        return plan.RateRange(self.min_rps, self.max_rps, plan.RateLattice(self.tolerance))

"""What `splitserve compare` is asked, as one typed object, its options checked when it is made (a
UserError names the first wrong one, before any simulation)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import Catalog
from ..errors import UserError
from ..policy.systems import SYSTEMS
from .budget import DEFAULT_MACHINES

MAX_RPS_PER_MACHINE = 20.0    # the default ceiling of the rate search: 4x the most any system carried
                              # per DGX-H100 here (4.8 req/s on coding); it keeps the search from
                              # simulating clusters hundreds of times overloaded, the slowest runs


@dataclass(slots=True, kw_only=True)
class CompareRequest:
    """Every system of `systems` (empty: all of policy/systems.py) on one workload, model and budget
    (`machines` of `hardware`), written into `out`; `command` is the command line the report quotes,
    `config` the options results.json keeps (`compare --config results.json`), `catalog` --catalog
    (None: the built-in one). Made, `names` holds the systems and `max_rps` the rate search's
    ceiling (default: MAX_RPS_PER_MACHINE per machine)."""

    out: Path
    command: str
    workload: str = "coding"
    model: str = "llama2-70b"
    hardware: str = "dgx-h100"
    machines: int = DEFAULT_MACHINES
    duration: float = 120.0
    seed: int = 0
    goodput_ttft: float | None = None
    goodput_tpot: float | None = None
    tolerance: float = 0.02
    min_rps: float = 0.5
    max_rps: float | None = None
    curve_points: int = 6
    systems: tuple[str, ...] = ()
    workers: int | None = None
    cache_dir: str | None = None
    use_cache: bool = True
    config: dict | None = None
    catalog: Catalog | None = None
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = list(self.systems) if self.systems else list(SYSTEMS)
        for n in self.names:
            if n not in SYSTEMS:
                raise UserError(f"unknown --system {n!r}; choose from: {', '.join(SYSTEMS)}")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise UserError(f"--duration must be positive seconds, got {self.duration}")
        if not (0 < self.tolerance < 1):
            raise UserError(f"--tolerance must be in (0, 1), got {self.tolerance}")
        if self.max_rps is None:
            self.max_rps = MAX_RPS_PER_MACHINE * max(self.machines, 1)
        if not (0 < self.min_rps < self.max_rps and math.isfinite(self.max_rps)):
            raise UserError(f"need 0 < --min-rps < --max-rps, got {self.min_rps} and {self.max_rps}")
        if self.workers is not None and self.workers < 1:
            raise UserError(f"--workers must be at least 1, got {self.workers}")
        if self.curve_points < 0:
            raise UserError(f"--curve-points must be >= 0, got {self.curve_points}")

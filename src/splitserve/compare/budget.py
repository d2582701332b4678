"""The one budget every system gets: N machines of one kind, all prompt + token splits of them for
a system that splits the phases, all N as mixed machines for one that does not.

The budget is the cost of N machines (iso-cost, provision/plan.py `boundary`): with one kind of
machine in both pools that is exactly the splits (p, N - p), p = 1 .. N - 1, so provision's
within-a-budget search (`best_within_budget`) runs unchanged and every split is a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Catalog, load_hardware
from ..cluster.designs import Design, load_designs
from ..errors import UserError
from ..provision.plan import Limits

DEFAULT_MACHINES = 10      # the budget's N when `compare --machines` is not given


@dataclass(frozen=True, slots=True)
class Budget:
    hardware: str          # a machine kind of catalog/hardware.toml, e.g. dgx-h100
    machines: int          # N
    catalog: Catalog | None = None   # --catalog (None: the built-in one)

    def __post_init__(self) -> None:
        if self.machines < 2:
            raise UserError(f"--machines must be at least 2 (a split system needs a prompt and a token "
                            f"machine), got {self.machines}")
        load_hardware(self.hardware, self.catalog)

    def design(self, split: bool) -> Design:
        """The catalog design with every machine of this kind: Splitwise pools, or an unsplit
        baseline."""
        for d in load_designs(self.catalog).values():
            kinds = (d.prompt, d.token) if d.split else (d.machine,)
            if d.split == split and all(k == self.hardware for k in kinds):
                return d
        raise UserError(f"no {'split' if split else 'unsplit'} design of {self.hardware} machines in "
                        "catalog/designs.toml; choose a --hardware that has both (dgx-h100, dgx-a100)")

    @property
    def cost_per_hour(self) -> float:
        """The budget as provision's iso-cost constraint: N machines' $/h."""
        return self.machines * load_hardware(self.hardware, self.catalog).cost_per_hour

    def limits(self) -> Limits:
        return Limits(max_prompt=self.machines, max_token=self.machines, max_machines=self.machines)

    def splits(self) -> list[tuple[int, int]]:
        """Every (prompt, token) split of the N machines."""
        return [(p, self.machines - p) for p in range(1, self.machines)]

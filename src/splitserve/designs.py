"""Cluster designs (data in catalog/designs.toml) and the concrete cluster a run simulates."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from .errors import UserError
from .instance import Instance, make_instance
from .policy.state import Pool


@dataclass(frozen=True, slots=True)
class Design:
    name: str
    scheduler: str                # "splitwise" or "mixed"
    prompt: str | None = None     # hardware of the prompt pool (splitwise)
    token: str | None = None      # hardware of the token pool (splitwise)
    machine: str | None = None    # hardware of every machine (baseline)
    description: str = ""

    @property
    def split(self) -> bool:
        return self.scheduler == "splitwise"


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Tensor and pipeline degree of each pool's instances; None: the default (tp = all GPUs of
    one machine, pp = 1). A pool's own setting wins over the cluster-wide one."""

    tp: int | None = None
    pp: int | None = None
    prompt_tp: int | None = None
    prompt_pp: int | None = None
    token_tp: int | None = None
    token_pp: int | None = None

    def of(self, pool: Pool) -> tuple[int | None, int | None]:
        def pick(own: int | None, common: int | None) -> int | None:
            return common if own is None else own

        if pool is Pool.PROMPT:
            return pick(self.prompt_tp, self.tp), pick(self.prompt_pp, self.pp)
        if pool is Pool.TOKEN:
            return pick(self.token_tp, self.tp), pick(self.token_pp, self.pp)
        return self.tp, self.pp


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    design: Design
    groups: tuple[tuple[Instance, Pool, int], ...]    # (instance, home pool, count)

    @property
    def machines(self) -> int:
        """Instances (machines, for default instances)."""
        return sum(n for _, _, n in self.groups)

    @property
    def gpus(self) -> int:
        return sum(inst.gpus * n for inst, _, n in self.groups)

    def label(self) -> str:
        def par(inst: Instance) -> str:
            return "" if inst.name == inst.hardware else f" tp{inst.tp}pp{inst.pp}"

        if self.design.split:
            (pi, _, p), (ti, _, t) = self.groups
            return f"{self.design.name} ({p}P{par(pi)}, {t}T{par(ti)})"
        (inst, _, n), = self.groups
        return f"{self.design.name} ({n} {'machines' if not par(inst) else 'instances' + par(inst)})"


def load_designs() -> dict[str, Design]:
    text = resources.files("splitserve.catalog").joinpath("designs.toml").read_text()
    return {name: Design(name=name, **fields) for name, fields in tomllib.loads(text).items()}


def design_names() -> list[str]:
    return sorted(load_designs())


def make_cluster(design: str, *, prompt_machines: int | None = None,
                 token_machines: int | None = None, machines: int | None = None,
                 parallel: Parallelism = Parallelism()) -> ClusterSpec:
    """The cluster of `design` with these instance counts; each instance has the parallelism
    `parallel` gives its pool (instance.py). A count counts instances (machines by default)."""
    designs = load_designs()
    if design not in designs:
        raise UserError(f"unknown design {design!r}; choose one of: {', '.join(sorted(designs))}")
    d = designs[design]
    if d.split:
        if machines is not None:
            raise UserError(f"{design} is a Splitwise design: give --prompt-machines and "
                            f"--token-machines, not --machines")
        if prompt_machines is None or token_machines is None:
            raise UserError(f"{design} needs --prompt-machines N and --token-machines M")
        for flag, n in (("--prompt-machines", prompt_machines), ("--token-machines", token_machines)):
            if n < 1:
                raise UserError(f"{flag} must be at least 1, got {n}")
        return ClusterSpec(d, ((make_instance(d.prompt, *parallel.of(Pool.PROMPT)), Pool.PROMPT, prompt_machines),
                               (make_instance(d.token, *parallel.of(Pool.TOKEN)), Pool.TOKEN, token_machines)))
    if prompt_machines is not None or token_machines is not None:
        raise UserError(f"{design} is an unsplit baseline: give --machines N, not prompt/token counts")
    if machines is None:
        raise UserError(f"{design} needs --machines N")
    if machines < 1:
        raise UserError(f"--machines must be at least 1, got {machines}")
    if any(v is not None for v in (parallel.prompt_tp, parallel.prompt_pp, parallel.token_tp, parallel.token_pp)):
        raise UserError(f"{design} is an unsplit baseline: give --tp/--pp, not prompt/token parallelism")
    return ClusterSpec(d, ((make_instance(d.machine, *parallel.of(Pool.MIXED)), Pool.MIXED, machines),))

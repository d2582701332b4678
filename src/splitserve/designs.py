"""Cluster designs (data in catalog/designs.toml) and the concrete cluster a run simulates."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from .errors import UserError
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
class ClusterSpec:
    design: Design
    groups: tuple[tuple[str, Pool, int], ...]    # (hardware, home pool, count)

    @property
    def machines(self) -> int:
        return sum(n for _, _, n in self.groups)

    def label(self) -> str:
        if self.design.split:
            (_, _, p), (_, _, t) = self.groups
            return f"{self.design.name} ({p}P, {t}T)"
        return f"{self.design.name} ({self.machines} machines)"


def load_designs() -> dict[str, Design]:
    text = resources.files("splitserve.catalog").joinpath("designs.toml").read_text()
    return {name: Design(name=name, **fields) for name, fields in tomllib.loads(text).items()}


def design_names() -> list[str]:
    return sorted(load_designs())


def make_cluster(design: str, *, prompt_machines: int | None = None,
                 token_machines: int | None = None, machines: int | None = None) -> ClusterSpec:
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
        return ClusterSpec(d, ((d.prompt, Pool.PROMPT, prompt_machines),
                               (d.token, Pool.TOKEN, token_machines)))
    if prompt_machines is not None or token_machines is not None:
        raise UserError(f"{design} is an unsplit baseline: give --machines N, not prompt/token counts")
    if machines is None:
        raise UserError(f"{design} needs --machines N")
    if machines < 1:
        raise UserError(f"--machines must be at least 1, got {machines}")
    return ClusterSpec(d, ((d.machine, Pool.MIXED, machines),))

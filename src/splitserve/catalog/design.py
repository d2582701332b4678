"""The design entries of the catalog (designs.toml): which machine kinds a cluster design uses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Design:
    """A cluster design of designs.toml: a Splitwise design names the machine kind of its prompt
    and of its token pool, a baseline one machine kind for every machine (cluster/designs.py builds the
    cluster)."""

    name: str
    scheduler: str                # "splitwise" or "mixed"
    prompt: str | None = None     # hardware of the prompt pool (splitwise)
    token: str | None = None      # hardware of the token pool (splitwise)
    machine: str | None = None    # hardware of every machine (baseline)
    description: str = ""

    @property
    def split(self) -> bool:
        return self.scheduler == "splitwise"

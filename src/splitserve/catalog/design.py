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

    def kinds(self) -> list[str]:
        """The machine kind of each pool: [prompt, token] (Splitwise) or [machine] (baseline)."""
        if self.split:
            if self.prompt is None or self.token is None:
                raise ValueError(f"design {self.name}: a Splitwise design names its prompt and token machines")
            return [self.prompt, self.token]
        if self.machine is None:
            raise ValueError(f"design {self.name}: a baseline design names its machine")
        return [self.machine]

"""Each system's headline claim (compare/claims.toml) beside what the simulation finds: the
system's goodput over its baseline's, on the same budget, and the paragraph written for the
workload's committed report."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources


@dataclass(frozen=True, slots=True)
class Claim:
    system: str
    paper: str
    section: str
    claim: str
    paper_baseline: str
    baseline: str            # a system of policy/systems.py, or "" (the paper's baseline is none of them)
    baseline_note: str
    metric: str
    gain: float | None = None
    why: dict[str, str] = field(default_factory=dict)   # workload -> paragraph


def load_claims() -> dict[str, Claim]:
    text = resources.files("splitserve.compare").joinpath("claims.toml").read_text()
    return {name: Claim(system=name, **entry) for name, entry in tomllib.loads(text).items()}


def finding(claim: Claim | None, goodput: dict[str, float | None]) -> dict:
    """{baseline, ours}: the system's goodput over its claim's baseline's (None where either has
    none, the baseline is not compared, or the claim names no baseline)."""
    if claim is None or not claim.baseline or claim.baseline not in goodput:
        return {"baseline": claim.baseline if claim else "", "ours": None}
    mine, base = goodput.get(claim.system), goodput[claim.baseline]
    return {"baseline": claim.baseline, "ours": mine / base if mine and base else None}

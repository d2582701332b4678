"""Each system's headline claim (compare/claims.toml) beside what the simulation finds: the
system's goodput over its baseline's, on the same budget, and a paragraph per workload whose
figures are all the run's (templates filled by compare/explain.py from compare/facts.py)."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources

from . import explain
from .facts import facts


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
    why: dict[str, list[explain.Sentence]] = field(default_factory=dict)   # workload -> sentences

    def paper_side(self) -> dict:
        """The claim as the paper states it (results.json's `claim`): all but the templates."""
        d = asdict(self)
        del d["why"]
        return d


def parse_claims(text: str) -> dict[str, Claim]:
    """claims.toml's text as claims; ValueError lists every sentence naming an unknown figure or
    with a condition that does not parse."""
    out, bad = {}, []
    for name, entry in tomllib.loads(text).items():
        why = {w: [explain.sentence(e) for e in v] for w, v in entry.pop("why", {}).items()}
        for w, sentences in why.items():
            bad += [f"{name}.why.{w}[{i}]: {p}" for i, s in enumerate(sentences) for p in explain.problems(s)]
        out[name] = Claim(system=name, why=why, **entry)
    if bad:
        raise ValueError("compare/claims.toml: " + "; ".join(bad))
    return out


def load_claims() -> dict[str, Claim]:
    return parse_claims(resources.files("splitserve.compare").joinpath("claims.toml").read_text())


def finding(claim: Claim | None, goodput: dict[str, float | None]) -> dict:
    """{baseline, ours}: the system's goodput over its claim's baseline's (None where either has
    none, the baseline is not compared, or the claim names no baseline)."""
    if claim is None or not claim.baseline or claim.baseline not in goodput:
        return {"baseline": claim.baseline if claim else "", "ours": None}
    mine, base = goodput.get(claim.system), goodput[claim.baseline]
    return {"baseline": claim.baseline, "ours": mine / base if mine and base else None}


def explain_all(res: dict, claims: dict[str, Claim]) -> None:
    """Each row of res["systems"] gets `why`: its claim's paragraph for the run's workload filled
    from the run's figures (None: no paragraph written for that workload, or no claim)."""
    fx = facts(res)
    for r in res["systems"]:
        c = claims.get(r["system"])
        sentences = c.why.get(res["scenario"]["workload"]) if c else None
        r["why"] = explain.paragraph(sentences, fx[r["system"]]) if sentences else None

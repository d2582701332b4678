"""A system's goodput within the budget: the highest rate of the rate lattice at which its
simulation meets the SLOs, over every split of the budget for a system that splits the phases.

This is provision's `--objective throughput` search (provision/plan.py `best_within_budget`) with
the system's policy in every simulation (plan.Scenario.system): per candidate cluster, the rate
search of provision/search.py (`max_rate`: the answer passes its SLOs and the next lattice rate
fails them, both simulated), candidates after the first pruned by one simulation just above the
best rate so far. The simulations are provision/evaluate.py's, parallel and cached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..policy.systems import System
from ..provision.evaluate import Evaluator
from ..provision.plan import RateRange, Scenario, best_within_budget
from .budget import Budget


# Splitwise's baseline (its Baseline-A100/H100): the unsplit machines under the default policy,
# mixed continuous batching of prompts and decodes, JSQ over the machines. Not a system of
# policy/systems.py; compare finds its goodput as a reference for the claims' paragraphs.
REFERENCE = System("", False, {}, "unsplit, mixed continuous batching, JSQ (Splitwise's baseline)")


def cluster(result: dict) -> tuple[int, ...]:
    """The machine counts of a search result: (prompt, token) or (machines,)."""
    if "machines" in result:
        return (result["machines"],)
    return (result["prompt_machines"], result["token_machines"])


def split_label(counts: tuple[int, ...]) -> str:
    return f"{counts[0]}P + {counts[1]}T" if len(counts) == 2 else f"{counts[0]} mixed"


def system_goodput(ev: Evaluator, system: System, budget: Budget, sc: Scenario, rates: RateRange,
                   on_progress: Callable[[str], None] | None = None) -> dict:
    """{system, design, feasible, goodput_rps, cluster, split, simulations, candidates}: goodput_rps
    None when the system misses the SLOs at every candidate even at `rates.lo`."""
    d = budget.design(system.split)
    r = best_within_budget(ev, d, "iso-cost", budget.cost_per_hour, replace(sc, system=system.name),
                           budget.limits(), rates, on_progress)
    counts = cluster(r)
    return {"system": system.name, "split_system": system.split, "design": d.name,
            "feasible": bool(r.get("feasible")), "goodput_rps": r.get("throughput_at_slo"),
            "cluster": list(counts), "split": split_label(counts),
            "candidates": r.get("candidates", 0), "simulations": r.get("simulations", 0),
            "worst_check": r.get("worst_check"), "worst_ratio": r.get("worst_ratio")}

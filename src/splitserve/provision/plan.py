"""What to buy: the searches of `splitserve provision`, one function per question.

- `cheapest`: for one design and a request rate, the (prompt, token) split or machine count
  that meets all nine SLOs with the least cost, power or machines (paper §VI-B, Fig. 12).
- `throughput_at_slo`: for one cluster, the highest rate at which it meets all nine SLOs.
- `best_within_budget`: for one design and a power or cost budget, the split with the highest
  throughput at SLO (paper Figs. 13-15, the iso-power / iso-cost comparisons).
- `batch_within_budget`: for one design and a budget, the split that serves the most requests
  per $/h when offered far more than it can serve, with no latency SLO (paper §VI-E).

Each takes an `Evaluator` (simulations, parallel and cached) and a `Scenario` (the workload every
simulation replays). Results are plain dicts, ready for JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from ..catalog import Catalog, load_hardware
from ..cluster.designs import Design, load_designs
from ..errors import UserError
from .evaluate import Evaluator, Job, Outcome
from .search import Oracle, RateLattice, first_true, max_rate, min_split

OBJECTIVES = {
    "cost": ("cost_per_hour", lambda hw: hw.cost_per_hour),
    "power": ("power_kw", lambda hw: hw.power_kw),
    "machines": ("machines", lambda hw: 1.0),
}
CONSTRAINTS = {"iso-power": "power_kw", "iso-cost": "cost_per_hour"}
ASSUMPTION = ("more machines of a pool never make a cluster miss an SLO, and neither does a lower "
              "request rate; under it every search returns the brute-force optimum")


@dataclass(frozen=True)
class Scenario:
    workload: str = "coding"
    duration: float = 120.0
    seed: int = 0
    model: str = "llama2-70b"
    profile: str | None = None
    goodput: tuple[float, float] | None = None   # DistServe's (TTFT, TPOT) SLOs in place of the nine slowdowns
    system: str = ""                             # serving system by name (policy/systems.py; --policy)
    catalog: Catalog | None = None               # --catalog: designs, machines, models (None: built-in)
    rate_profile: str = ""                       # a rate shape, its mean the job's rate (workload/shape.py); "": constant

    def job(self, design: str, counts: tuple[int, ...], rps: float) -> Job:
        if len(counts) == 2:
            return Job(design, counts[0], counts[1], None, rps, self.workload, self.duration,
                       self.seed, self.model, self.profile, self.goodput, system=self.system,
                       catalog=self.catalog, rate_profile=self.rate_profile)
        return Job(design, None, None, counts[0], rps, self.workload, self.duration, self.seed,
                   self.model, self.profile, self.goodput, system=self.system, catalog=self.catalog,
                   rate_profile=self.rate_profile)


@dataclass(frozen=True)
class Limits:
    max_prompt: int = 70
    max_token: int = 70
    max_machines: int = 140

    def brute_force(self, design: Design) -> int:
        return self.max_prompt * self.max_token if design.split else self.max_machines


def design(name: str, catalog: Catalog | None = None) -> Design:
    designs = load_designs(catalog)
    if name not in designs:
        raise UserError(f"unknown design {name!r}; choose from: {', '.join(sorted(designs))}")
    return designs[name]


def unit_values(d: Design, per_machine: Callable, catalog: Catalog | None = None) -> tuple[float, ...]:
    """The per-machine value (cost, power, 1) of each pool of the design."""
    return tuple(per_machine(load_hardware(kind, catalog)) for kind in d.kinds())


def _entry(d: Design, counts: tuple[int, ...], out: Outcome | None, **extra) -> dict:
    c = ({"prompt_machines": counts[0], "token_machines": counts[1]} if d.split
         else {"machines": counts[0]})
    e = {"design": d.name, **c}
    if out is not None:
        e.update(machine_count=out.machines, cost_per_hour=out.cost_per_hour, power_kw=out.power_kw,
                 slo_met=out.slo_met, worst_check=out.worst, worst_ratio=out.violation,
                 slowdowns=out.slowdowns, throughput_rps=out.throughput_rps)
    e.update(extra)
    return e


def _counter(ev: Evaluator) -> Callable[[], int]:
    start = ev.simulated + ev.cached
    return lambda: ev.simulated + ev.cached - start


# ---- least cost / power / machines at a rate --------------------------------------------------
def cheapest(ev: Evaluator, d: Design, rps: float, objective: str, sc: Scenario, lim: Limits,
             on_progress: Callable[[str], None] | None = None) -> dict:
    field, per_machine = OBJECTIVES[objective]
    weights = unit_values(d, per_machine, sc.catalog)
    count = _counter(ev)
    slo = lambda cfgs: [o.slo_met for o in ev([sc.job(d.name, c, rps) for c in cfgs])]
    corner: tuple[int, ...]
    found: tuple[int, ...] | None
    if d.split:
        wp, wt = weights
        key = lambda p, t: (wp * p + wt * t, p + t, p)
        oracle = Oracle(lambda pts: slo(pts))
        best = min_split(oracle, lim.max_prompt, lim.max_token, key, ev.width,
                         on_column=lambda p, left: on_progress and on_progress(
                             f"{d.name}: {p} prompt machines, {left} columns left"))
        corner = (lim.max_prompt, lim.max_token)
        found = best
    else:
        n = first_true(1, lim.max_machines, lambda ns: slo([(x,) for x in ns]), ev.width)
        corner = (lim.max_machines,)
        found = (n,) if n is not None else None
    if found is None:
        (out,) = ev([sc.job(d.name, corner, rps)])
        return _entry(d, corner, out, feasible=False, simulations=count(),
                      brute_force=lim.brute_force(d))
    (out,) = ev([sc.job(d.name, found, rps)])
    return _entry(d, found, out, feasible=True, objective_value=getattr(out, field),
                  simulations=count(), brute_force=lim.brute_force(d))


# ---- throughput at SLO ------------------------------------------------------------------------
@dataclass(frozen=True)
class RateRange:
    lo: float = 0.5
    hi: float = 2000.0
    lattice: RateLattice = RateLattice(0.02)

    def size(self) -> int:
        return self.lattice.index(self.hi) - self.lattice.index(self.lo) + 1


def throughput_at_slo(ev: Evaluator, d: Design, counts: tuple[int, ...], sc: Scenario,
                      rates: RateRange = RateRange(), at_least: float | None = None) -> float | None:
    """The highest lattice rate at which the cluster meets all nine SLOs (None: not even
    `rates.lo`; with `at_least`, None means not above it)."""
    test = lambda rs: [o.slo_met for o in ev([sc.job(d.name, counts, r) for r in rs])]
    return max_rate(test, rates.lattice, rates.lo, rates.hi, ev.width, at_least)


def budget_value(spec: str, constraint: str, catalog: Catalog | None = None) -> float:
    """A budget as a number (kW for iso-power, $/h for iso-cost) or as N*HARDWARE, e.g.
    40*dgx-h100: the power or cost of 40 DGX-H100."""
    field = CONSTRAINTS[constraint]
    if "*" in spec:
        n, hw = spec.split("*", 1)
        try:
            count = float(n)
        except ValueError:
            raise UserError(f"--budget {spec!r}: expected N*HARDWARE, e.g. 40*dgx-h100") from None
        value = count * getattr(load_hardware(hw.strip(), catalog), field)
    else:
        try:
            value = float(spec)
        except ValueError:
            raise UserError(f"--budget {spec!r}: give a number ({'kW' if field == 'power_kw' else '$/h'}) "
                            "or N*HARDWARE, e.g. 40*dgx-h100") from None
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"--budget must be positive, got {spec}")
    return value


def boundary(d: Design, constraint: str, budget: float, lim: Limits,
             catalog: Catalog | None = None) -> list[tuple[int, ...]]:
    """The largest clusters within the budget: for each prompt count, the most token machines
    that fit (more machines never lower throughput at SLO, so the best is among these)."""
    per = unit_values(d, lambda hw: getattr(hw, CONSTRAINTS[constraint]), catalog)
    eps = 1e-9 * budget
    if not d.split:
        n = min(lim.max_machines, math.floor((budget + eps) / per[0]))
        return [(n,)] if n >= 1 else []
    out: list[tuple[int, ...]] = []
    for p in range(1, lim.max_prompt + 1):
        t = min(lim.max_token, math.floor((budget - p * per[0] + eps) / per[1]))
        if t >= 1:
            out.append((p, t))
    return out


def spread_order(n: int) -> list[int]:
    """0..n-1 middle first, then quarters, eighths...: good candidates early, so later ones are
    pruned with a single simulation."""
    order: list[int] = []
    seen: set[int] = set()
    step = 2
    while len(order) < n:
        for i in range(1, step, 2):
            k = min(n - 1, (i * n) // step)
            if k not in seen:
                seen.add(k)
                order.append(k)
        step *= 2
        if step > 4 * n:
            order.extend(k for k in range(n) if k not in seen)
            break
    return order


def best_within_budget(ev: Evaluator, d: Design, constraint: str, budget: float, sc: Scenario,
                       lim: Limits, rates: RateRange = RateRange(),
                       on_progress: Callable[[str], None] | None = None, stride: int = 1) -> dict:
    """`stride` > 1 tries only every stride-th split of the boundary (and its last): a coarse,
    no longer exact, answer for quick looks."""
    cands = boundary(d, constraint, budget, lim, sc.catalog)
    if stride > 1 and cands:
        cands = sorted(set(cands[::stride]) | {cands[-1]})
    count = _counter(ev)
    if not cands:
        return {"design": d.name, "feasible": False, "reason": "not one machine of each pool fits the budget",
                "simulations": 0}
    best_rate, best = None, None
    order = [cands[i] for i in spread_order(len(cands))]
    i = 0
    while i < len(order):
        if best_rate is None:
            c = order[i]
            i += 1
            r = throughput_at_slo(ev, d, c, sc, rates)
            if r is not None:
                best_rate, best = r, c
            continue
        # one simulation each, just above the best so far, prunes most candidates
        batch = order[i:i + ev.width]
        i += len(batch)
        nxt = rates.lattice.rate(rates.lattice.index(best_rate) + 1)
        outs = ev([sc.job(d.name, c, nxt) for c in batch]) if nxt <= rates.hi else [None] * len(batch)
        for c, o in zip(batch, outs):
            if o is not None and o.slo_met:
                # the whole range, as for the first candidate: over short runs SLO attainment is
                # not strictly monotone in the rate, and a search from best_rate up could stop
                # at a different edge than the one this cluster's own search finds
                r = throughput_at_slo(ev, d, c, sc, rates)
                if r is not None and r > best_rate:
                    best_rate, best = r, c
        if on_progress:
            on_progress(f"{d.name}: {i}/{len(order)} candidate splits, best {best_rate:g} req/s")
    if best is None or best_rate is None:   # set together
        (out,) = ev([sc.job(d.name, order[0], rates.lo)])
        return _entry(d, order[0], out, feasible=False, throughput_at_slo=None, candidates=len(cands),
                      simulations=count(), brute_force=len(cands) * rates.size())
    (out,) = ev([sc.job(d.name, best, best_rate)])
    return _entry(d, best, out, feasible=True, throughput_at_slo=best_rate, candidates=len(cands),
                  simulations=count(), brute_force=len(cands) * rates.size())


# ---- batch jobs: requests per dollar under stress ---------------------------------------------
def batch_within_budget(ev: Evaluator, d: Design, constraint: str, budget: float, sc: Scenario,
                        lim: Limits, stress_rps: float) -> dict:
    cands = boundary(d, constraint, budget, lim, sc.catalog)
    count = _counter(ev)
    if not cands:
        return {"design": d.name, "feasible": False, "reason": "not one machine of each pool fits the budget",
                "simulations": 0}
    outs = ev([sc.job(d.name, c, stress_rps) for c in cands])
    score = [o.throughput_rps / o.cost_per_hour for o in outs]
    k = max(range(len(cands)), key=lambda i: (score[i], -i))
    return _entry(d, cands[k], outs[k], feasible=True, requests_per_dollar=score[k] * 3600,
                  rps_per_dollar_hour=score[k], candidates=len(cands), simulations=count(),
                  brute_force=len(cands))


def scenario_dict(sc: Scenario) -> dict:
    d = asdict(replace(sc, catalog=None))
    del d["catalog"]    # the user catalog is reported on its own (provision.json "catalog")
    return d

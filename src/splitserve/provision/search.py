"""Exact searches over monotone feasibility, with parallel probes.

Everything here rests on one assumption, which the provisioner states in its output: more machines
of a pool never make a cluster miss its SLOs, and a lower request rate never does either. Given it,
the searches return exactly the optimum a brute-force sweep would, after far fewer simulations.

- `first_true`: the smallest integer in a range where a monotone predicate (false ... true)
  holds, probing up to `width` points per round (a `width`-section search).
- `Oracle`: memoised feasibility of (prompt, token) splits that answers from dominance without
  simulating: a known-feasible (p', t') with p' <= p, t' <= t makes (p, t) feasible, and a
  known-infeasible (p', t') with p' >= p, t' >= t makes it infeasible.
- `min_split`: the least-key feasible split over a P x T grid, for any key that strictly
  increases in both counts (cost, power, machines). The feasible set is an up-set whose lower
  edge is a staircase; the search finds the least p whose column is feasible at all and the
  least t that the full prompt pool needs (no column needs fewer), then resolves columns from
  columns still open, taking in turn the one with the cheapest possible point and the middle one:
  each column's edge, binary-searched below the best key seen so far, bounds the columns on its
  left from below and on its right from above, and a column whose cheapest possible point is no
  better than the best is dropped unsimulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Batch = Callable[[list], list[bool]]        # evaluates several probes at once


def _section(lo: int, hi: int, width: int) -> list[int]:
    """Up to `width` distinct points strictly between lo and hi, evenly spread."""
    n = hi - lo - 1
    k = min(width, n)
    pts = sorted({lo + max(1, min(n, round(i * (hi - lo) / (k + 1)))) for i in range(1, k + 1)})
    return pts


def first_true(a: int, b: int, test: Callable[[list[int]], list[bool]], width: int = 1,
               known: Callable[[int], bool | None] | None = None) -> int | None:
    """Smallest x in [a, b] with test(x) true, for a predicate false below some point and true
    from it on; None if it is false on all of [a, b]. `known(x)` may answer without a test."""
    lo, hi = a - 1, b + 1                   # largest known false, smallest known true
    if known is not None:
        for x in range(a, b + 1):
            k = known(x)
            if k is False:
                lo = x
            elif k is True:
                hi = x
                break
    while hi - lo > 1:
        pts = _section(lo, hi, max(1, width))
        for x, ok in zip(pts, test(pts)):
            if ok:
                hi = min(hi, x)
            else:
                lo = max(lo, x)
    return hi if hi <= b else None


@dataclass
class Oracle:
    """Feasibility of splits, simulated through `batch` or implied by earlier answers."""
    batch: Batch
    feasible: set[tuple[int, int]] = field(default_factory=set)
    infeasible: set[tuple[int, int]] = field(default_factory=set)
    asked: int = 0                          # points passed to `batch`

    def implied(self, p: int, t: int) -> bool | None:
        if any(fp <= p and ft <= t for fp, ft in self.feasible):
            return True
        if any(ip >= p and it >= t for ip, it in self.infeasible):
            return False
        return None

    def __call__(self, points: Sequence[tuple[int, int]]) -> list[bool]:
        todo = [pt for pt in dict.fromkeys(points) if self.implied(*pt) is None]
        if todo:
            self.asked += len(todo)
            for pt, ok in zip(todo, self.batch(todo)):
                (self.feasible if ok else self.infeasible).add(pt)
        return [bool(self.implied(*pt)) for pt in points]


def _column(oracle: Oracle, p: int) -> tuple[Callable[[list[int]], list[bool]], Callable[[int], bool | None]]:
    """`first_true`'s test and `known` over column p: the oracle at (p, t) for each t, and what it
    implies there already."""
    return (lambda ts: oracle([(p, t) for t in ts])), (lambda t: oracle.implied(p, t))


def min_split(oracle: Oracle, P: int, T: int, key: Callable[[int, int], tuple], width: int = 1,
              on_column: Callable[[int, int], None] | None = None) -> tuple[int, int] | None:
    """The split (p, t) in [1, P] x [1, T] of least key(p, t) among the feasible ones, or None.

    `key` must strictly increase in p and in t. `on_column(p, columns_left)` reports progress.
    """
    p0 = first_true(1, P, lambda ps: oracle([(p, T) for p in ps]), width,
                    known=lambda p: oracle.implied(p, T))
    if p0 is None:
        return None
    # no column needs fewer token machines than the full prompt pool does
    test, known = _column(oracle, P)
    t0 = first_true(1, T, test, width, known=known)
    if t0 is None:  # (P, T) is feasible as (p0, T) is, p0 <= P: a non-monotone oracle
        raise AssertionError(f"feasibility is not monotone: ({p0}, {T}) is feasible, ({P}, {T}) is not")
    best = min((p0, T), (P, t0), key=lambda pt: key(*pt))
    todo = set(range(p0, P + 1))
    step = 0
    while True:
        kb = key(*best)
        open_ = []
        for p in sorted(todo):
            lo = max([t for q, t in oracle.infeasible if q >= p] + [t0 - 1])
            hi = min([t for q, t in oracle.feasible if q <= p] + [T + 1])
            if hi > lo + 1 and key(p, lo + 1) < kb:
                open_.append((p, lo, hi))
        if not open_:
            break
        todo = {p for p, _, _ in open_}
        # alternately the open column with the cheapest possible point (often the answer) and
        # the middle one (its answer bounds the columns on both sides of it)
        step += 1
        p, lo, hi = (min(open_, key=lambda c: key(c[0], c[1] + 1)) if step % 2
                     else open_[len(open_) // 2])
        todo.discard(p)
        if on_column:
            on_column(p, len(todo))
        cap = max(t for t in range(lo + 1, hi) if key(p, t) < kb)
        test, known = _column(oracle, p)
        t = first_true(lo + 1, cap, test, width, known=known)
        if t is not None:
            best = min(best, (p, t), key=lambda pt: key(*pt))
    # the best is a point some simulation met, or is dominated by one with no greater key
    return min(oracle.feasible, key=lambda pt: key(*pt)) if oracle.feasible else best


def brute_force_min_split(feasible: Callable[[int, int], bool], P: int, T: int,
                          key: Callable[[int, int], tuple]) -> tuple[int, int] | None:
    ok = [(p, t) for p in range(1, P + 1) for t in range(1, T + 1) if feasible(p, t)]
    return min(ok, key=lambda pt: key(*pt)) if ok else None


# ---- request rates on a geometric lattice ----------------------------------------------------
@dataclass(frozen=True)
class RateLattice:
    """Rates base * (1 + tol)^k: a search over k is exact on the lattice, so the reported
    throughput at SLO is within `tol` (relative) of the true one, and every rate probed is
    reproducible (and cacheable) from (base, tol, k)."""
    tol: float = 0.02
    base: float = 1.0

    def rate(self, k: int) -> float:
        return float(f"{self.base * (1 + self.tol) ** k:.9g}")

    def index(self, rps: float) -> int:
        """The largest k with rate(k) <= rps (rates keep 9 significant digits, hence the slack)."""
        x = math.log(rps / self.base) / math.log1p(self.tol)
        k = round(x)
        return k if abs(x - k) < 1e-4 else math.floor(x)


def max_rate(test: Callable[[list[float]], list[bool]], lattice: RateLattice, lo_rps: float,
             hi_rps: float, width: int = 1, at_least: float | None = None) -> float | None:
    """The highest lattice rate in [lo_rps, hi_rps] that passes `test` (monotone: passes below
    some rate, fails above), or None when even lo_rps fails. With `at_least`, only rates above it
    are searched: None then means "no better than at_least"."""
    a, b = lattice.index(lo_rps), lattice.index(hi_rps)
    if at_least is not None:
        a = max(a, lattice.index(at_least) + 1)
    if a > b:
        return None
    # failing is monotone in k: the first failing k, minus one, is the answer
    k = first_true(a, b, lambda ks: [not ok for ok in test([lattice.rate(k) for k in ks])], width)
    top = b if k is None else k - 1
    return lattice.rate(top) if top >= a else None

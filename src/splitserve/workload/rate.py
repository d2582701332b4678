"""Time-varying arrival rates: a piecewise-constant or sinusoidal rate lambda(t) in req/s, for
scaling experiments (Aladdin, Nie et al. 2024, §1: "The demand for LLM inference varies
throughout the day"; it gives no numbers, so any profile's shape and figures are the run's own).

Arrivals are a non-homogeneous Poisson process drawn by thinning (Lewis and Shedler 1979): each
block draws BLOCK candidate gaps at the profile's peak rate, then BLOCK uniforms, and keeps the
candidate at t when u * peak < lambda(t). Text forms (`--rate-profile`):

  "0:5,60:20,120:5"     5 req/s from 0 s, 20 from 60 s, 5 from 120 s on (times strictly rising,
                         the first 0; a rate may be 0 except the last)
  "sin:10:5:600"        10 + 5 sin(2 pi t / 600) req/s (mean, amplitude <= mean, period s)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import UserError

if TYPE_CHECKING:
    from .shape import ShapeProfile


@dataclass(frozen=True, slots=True)
class RateProfile:
    kind: str                              # "piecewise" or "sin"
    times: tuple[float, ...] = ()          # piecewise: segment starts, seconds
    rates: tuple[float, ...] = ()          # piecewise: req/s of each segment
    mean: float = 0.0                      # sin
    amplitude: float = 0.0
    period: float = 0.0

    @property
    def peak(self) -> float:
        return max(self.rates) if self.kind == "piecewise" else self.mean + self.amplitude

    def rate(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        if self.kind == "piecewise":
            idx = np.searchsorted(np.asarray(self.times), t, side="right") - 1
            return np.asarray(self.rates)[np.maximum(idx, 0)]
        return self.mean + self.amplitude * np.sin(2 * math.pi * t / self.period)

    def expected(self, a: float, b: float) -> float:
        """Expected arrivals in [a, b): the integral of the rate."""
        if self.kind == "sin":
            w = 2 * math.pi / self.period
            return self.mean * (b - a) + self.amplitude / w * (math.cos(w * a) - math.cos(w * b))
        edges = list(self.times) + [math.inf]
        return sum(r * max(0.0, min(b, hi) - max(a, lo)) for lo, hi, r in zip(edges, edges[1:], self.rates))

    def describe(self) -> str:
        if self.kind == "sin":
            return f"{self.mean:g} + {self.amplitude:g} sin(2 pi t / {self.period:g}) req/s"
        return ", ".join(f"{r:g} req/s from {t:g} s" for t, r in zip(self.times, self.rates))


def _num(text: str, what: str, spec: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise UserError(f"rate profile {spec!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise UserError(f"rate profile {spec!r}: {what} must be finite, got {text!r}")
    return v


def parse_rate_profile(spec: str) -> RateProfile:
    s = spec.strip()
    if s.lower().startswith(("sin:", "sine:")):
        parts = s.split(":")[1:]
        if len(parts) != 3:
            raise UserError(f"rate profile {spec!r}: give sin:MEAN:AMPLITUDE:PERIOD")
        mean, amp, period = (_num(p, w, spec) for p, w in zip(parts, ("mean", "amplitude", "period")))
        if mean <= 0 or period <= 0 or not 0 <= amp <= mean:
            raise UserError(f"rate profile {spec!r}: need mean > 0, period > 0 and 0 <= amplitude <= mean")
        return RateProfile("sin", mean=mean, amplitude=amp, period=period)
    times, rates = [], []
    for item in s.split(","):
        if item.count(":") != 1:
            raise UserError(f"rate profile {spec!r}: each segment is START_S:RATE, got {item.strip()!r}")
        t, r = item.split(":")
        times.append(_num(t.strip(), "start", spec))
        rates.append(_num(r.strip(), "rate", spec))
    if times[0] != 0 or any(b <= a for a, b in zip(times, times[1:])):
        raise UserError(f"rate profile {spec!r}: segment starts must begin at 0 and strictly rise")
    if any(r < 0 for r in rates) or rates[-1] <= 0:
        raise UserError(f"rate profile {spec!r}: rates must be >= 0 and the last one > 0")
    return RateProfile("piecewise", tuple(times), tuple(rates))


def thinned_arrivals(rng: np.random.Generator, profile: RateProfile | ShapeProfile, block: int):
    """Blocks of (arrival times, kept count) of the non-homogeneous Poisson process, forever."""
    peak = profile.peak
    t = 0.0
    while True:
        cand = t + np.cumsum(rng.exponential(1.0 / peak, block))
        keep = rng.random(block) * peak < profile.rate(cand)
        t = float(cand[-1])
        yield cand[keep], t

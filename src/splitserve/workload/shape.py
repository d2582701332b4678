"""Measured shapes of the request rate (`--rate-profile azure-code`, `azure-conv`, or a shape file
NAME.json): arrivals per time bin of a trace, as rates relative to their mean, repeated with the
shape's period, scaled to a mean or a peak rate; the arrivals a Poisson process at that
piecewise-constant rate, drawn by thinning (workload/rate.py `thinned_arrivals`).

The built-in shapes (data/rate_shapes.json, made by scripts/rate_shape.py from the Azure LLM
inference traces of 2023 in ../shared/traces) are those traces' arrivals per minute. The traces
cover about one hour each (2023-11-16, 18:15 to 19:14 on the trace's clock), so `azure-code` has a
period of 57 minutes and `azure-conv` of 58, and a day of traffic is that hour repeated: the
minute-to-minute swings are measured, the hour-to-hour ones of a real day are not (no 24-hour
shape ships; `diurnal` says so). A shape file made by scripts/rate_shape.py from a trace of days
(`--fold 86400`) gives a real day's shape.

Text forms: `NAME[:mean=R][:peak=R][:start=S]`, NAME a built-in shape or a path ending in .json.
`mean=R`: the mean over the period is R req/s (a run's `--rps`, when it gives none); `peak=R`: the
busiest bin's rate is R; `start=S`: the run's time 0 is the shape's second S (provision's
`--day peak-hour` starts at the busiest hour of the day, `peak_hour`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import UserError

DAY_S = 86_400.0
HOUR_S = 3_600.0
NO_DAY = ("the Azure LLM inference traces of 2023 cover about one hour (2023-11-16, 18:15 to 19:14), so no "
          "24-hour shape ships: use azure-code or azure-conv (that hour's arrivals per minute, repeated), "
          "or a shape file made from a trace of days (scripts/rate_shape.py --fold 86400)")


@dataclass(frozen=True, slots=True)
class RateShape:
    """A shape: `relative[i]` is bin i's rate over the mean of all bins' rates (mean 1)."""

    name: str
    bin_s: float
    relative: tuple[float, ...]
    source: str                    # where it comes from, one line

    @property
    def period(self) -> float:
        return self.bin_s * len(self.relative)


def _shape(d: dict[str, Any], where: str) -> RateShape:
    """A data file's shape entry (scripts/rate_shape.py) as a RateShape, checked."""
    try:
        name, bin_s = str(d["name"]), float(d["bin_s"])
        counts = np.asarray(d["counts"], dtype=float)
        exposure = np.asarray(d.get("exposure_s", [bin_s] * len(counts)), dtype=float)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{where}: a shape needs name, bin_s and counts (scripts/rate_shape.py): {e}") from None
    if not (bin_s > 0 and counts.ndim == 1 and len(counts) and exposure.shape == counts.shape
            and np.all(counts >= 0) and np.all(exposure > 0) and counts.sum() > 0):
        raise UserError(f"{where}: shape {name!r} needs bin_s > 0 and counts >= 0, not all 0 (and exposure_s > 0)")
    rate = counts / exposure
    src = f"{d.get('trace', where)}, {int(d.get('requests', counts.sum()))} requests from {d.get('first_request', '?')}"
    return RateShape(name, bin_s, tuple(float(x) for x in rate / rate.mean()), src)


@cache
def built_in_shapes() -> dict[str, RateShape]:
    """The shapes that ship (data/rate_shapes.json), by name."""
    doc = json.loads(resources.files("splitserve.workload").joinpath("data/rate_shapes.json").read_text())
    return {s["name"]: _shape(s, "rate_shapes.json") for s in doc["shapes"]}


def load_shape_file(path: str) -> RateShape:
    """The one shape of a file made by scripts/rate_shape.py --trace."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError:
        raise UserError(f"rate shape file {path} not found") from None
    except ValueError as e:
        raise UserError(f"rate shape file {path}: not JSON ({e})") from None
    shapes = doc.get("shapes") if isinstance(doc, dict) else None
    if not isinstance(shapes, list) or len(shapes) != 1 or not isinstance(shapes[0], dict):
        raise UserError(f"rate shape file {path}: expected one shape under \"shapes\" (scripts/rate_shape.py --trace)")
    return _shape(shapes[0], path)


@dataclass(frozen=True, slots=True)
class ShapeProfile:
    """A shape at `scale` req/s per relative unit (its mean over the period), from its second
    `start`: the rate profile a workload draws its arrivals from (`rate`, `peak`, `expected`)."""

    shape: RateShape
    scale: float
    start: float = 0.0
    kind: ClassVar[str] = "shape"
    _rates: np.ndarray = field(init=False, repr=False, compare=False)
    _cum: np.ndarray = field(init=False, repr=False, compare=False)    # relative units before bin i

    def __post_init__(self) -> None:
        rel = np.asarray(self.shape.relative)
        object.__setattr__(self, "_rates", rel * self.scale)
        object.__setattr__(self, "_cum", np.concatenate(([0.0], np.cumsum(rel))))

    @property
    def peak(self) -> float:
        return float(self._rates.max())

    @property
    def mean(self) -> float:
        """The long-run rate: the mean over a period."""
        return self.scale

    def rate(self, t: np.ndarray | float) -> np.ndarray:
        s = np.asarray(t, dtype=float) + self.start
        return self._rates[(s // self.shape.bin_s).astype(np.int64) % len(self._rates)]

    def _integral(self, s: float) -> float:
        """Expected arrivals in the shape's [0, s), at scale 1."""
        if math.isinf(s):
            return math.inf
        k, r = divmod(s, self.shape.period)
        j = min(int(r // self.shape.bin_s), len(self._rates) - 1)
        rel = self.shape.relative
        return k * len(rel) * self.shape.bin_s + (float(self._cum[j]) * self.shape.bin_s
                                                   + rel[j] * (r - j * self.shape.bin_s))

    def expected(self, a: float, b: float) -> float:
        """Expected arrivals in the run's [a, b)."""
        return self.scale * (self._integral(b + self.start) - self._integral(a + self.start))

    def describe(self) -> str:
        s = self.shape
        return (f"rate shape {s.name} ({len(s.relative)} bins of {s.bin_s:g} s, repeated every {s.period:g} s) at "
                f"mean {self.scale:.4g}, peak {self.peak:.4g} req/s"
                + (f", from its second {self.start:g}" if self.start else ""))


def is_shape(spec: str) -> bool:
    """Whether a --rate-profile text names a shape (built in, a .json file, or `diurnal`)."""
    head = spec.strip().split(":")[0].strip()
    return head in built_in_shapes() or head.lower().endswith(".json") or head.lower() == "diurnal"


def _settings(spec: str, parts: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in parts:
        key, eq, val = p.strip().partition("=")
        key = key.strip().lower()
        if not eq or key not in ("mean", "peak", "start") or key in out:
            raise UserError(f"rate profile {spec!r}: after the shape's name give :mean=R, :peak=R or :start=S "
                            f"(each at most once), got {p.strip()!r}")
        try:
            v = float(val)
        except ValueError:
            raise UserError(f"rate profile {spec!r}: {key} {val.strip()!r} is not a number") from None
        if not math.isfinite(v) or v < 0 or (key != "start" and v == 0):
            raise UserError(f"rate profile {spec!r}: {key} must be finite and {'>= 0' if key == 'start' else '> 0'}")
        out[key] = v
    if "mean" in out and "peak" in out:
        raise UserError(f"rate profile {spec!r}: give mean or peak, not both")
    return out


def names_rate(spec: str) -> bool:
    """Whether a shape's text gives its own rate (mean= or peak=); else the run's --rps is its mean."""
    return any(p.strip().lower().startswith(("mean=", "peak=")) for p in spec.split(":")[1:])


def parse_shape(spec: str, rps: float | None = None) -> ShapeProfile:
    """A shape's text (the module's forms) as a profile; `rps`, the run's rate, is its mean when the
    text gives no rate (one of the two is needed)."""
    head, *parts = spec.strip().split(":")
    head = head.strip()
    if head.lower() == "diurnal":
        raise UserError(f"rate profile {spec!r}: {NO_DAY}")
    if head.lower().endswith(".json"):
        shape = load_shape_file(head)
    elif head in built_in_shapes():
        shape = built_in_shapes()[head]
    else:
        raise UserError(f"rate profile {spec!r}: no shape {head!r}; built in: {', '.join(built_in_shapes())}")
    got = _settings(spec, parts)
    if rps is not None and ("mean" in got or "peak" in got):
        raise UserError(f"rate profile {spec!r} gives its own rate: leave out --rps")
    if rps is None and "mean" not in got and "peak" not in got:
        raise UserError(f"rate profile {spec!r}: give its mean rate (--rps R, or {head}:mean=R) or its peak "
                        f"({head}:peak=R)")
    scale = got["peak"] / max(shape.relative) if "peak" in got else got.get("mean", rps or 0.0)
    return ShapeProfile(shape, scale, got.get("start", 0.0))


def peak_hour(shape: RateShape, day: float = DAY_S, width: float = HOUR_S) -> float:
    """The start of the `width` seconds of the shape's first `day` with the most arrivals (the
    earliest of equals): a window's count is piecewise linear in its start, so the best starts
    where its start or its end meets a bin's edge."""
    prof = ShapeProfile(shape, 1.0)
    edges = np.arange(0.0, day + shape.bin_s, shape.bin_s)
    cands = np.unique(np.concatenate((edges, edges - width)))
    cands = cands[(cands >= 0) & (cands <= day - width)]
    counts = [prof.expected(float(s), float(s) + width) for s in cands]
    return float(cands[int(np.argmax(np.round(counts, 9)))])

"""Power models: the watts one machine's GPUs draw while it runs a prompt batch, a decode batch, or
nothing; GPU watts only, the quantity the Splitwise paper provisions by (Table V).

Each busy GPU (`tp` of them) draws a fraction of TDP, the others idle, every fraction capped at
`hw.power_cap_frac`:

    watts = min(frac, cap) * TDP * tp + min(idle, cap) * TDP * (gpus - tp)

(with `others_idle` False, the simulator's instances, only the first term: the other GPUs belong
to other instances). AnalyticalPowerModel needs no measurements: prompt power rises with batched
prompt tokens to TDP (paper Fig. 8a), decode power is flat at 0.65 TDP (Fig. 8b; high of the
profile's readings, the safe side for budgets), idle 0.2 TDP. ProfilePowerModel reads the
profile's `peak_power` and `average_power` columns, holds the nearest measured value outside their
range, and falls back to the analytical model where a phase has none. docs/perf-model.md ("Power")
has the constants' sources.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from splitserve.catalog import HardwareSpec
from splitserve.errors import UserError

__all__ = ["AnalyticalPowerModel", "ProfilePowerModel"]


class _MachineWatts:
    """Turns a per-busy-GPU fraction of TDP into capped machine watts."""

    __slots__ = ("hw", "tp", "_busy_w", "_cap", "_idle_rest_w")

    def __init__(self, hw: HardwareSpec, tp: int | None, idle_frac: float, others_idle: bool = True) -> None:
        if tp is None:
            tp = hw.gpus
        if not 1 <= tp <= hw.gpus:
            raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} on {hw.name}")
        self.hw, self.tp = hw, tp
        self._cap = hw.power_cap_frac
        self._busy_w = hw.gpu_tdp_w * tp
        rest = hw.gpus - tp if others_idle else 0
        self._idle_rest_w = min(idle_frac, self._cap) * hw.gpu_tdp_w * rest

    def watts(self, frac: float) -> float:
        if frac > self._cap:
            frac = self._cap
        elif frac < 0.0:
            frac = 0.0
        return frac * self._busy_w + self._idle_rest_w


class AnalyticalPowerModel:
    """Power from phase-level rules of thumb (module docstring has the forms and sources)."""

    __slots__ = ("hw", "tp", "idle_frac", "token_frac", "prompt_floor", "prompt_tokens_per_gpu",
                 "_m", "_scale")

    def __init__(
        self,
        hw: HardwareSpec,
        tp: int | None = None,
        *,
        idle_frac: float = 0.2,
        token_frac: float = 0.65,
        prompt_floor: float = 0.45,
        prompt_tokens_per_gpu: float = 128.0,
        others_idle: bool = True,
    ) -> None:
        self._m = _MachineWatts(hw, tp, idle_frac, others_idle)
        self.hw, self.tp = hw, self._m.tp
        self.idle_frac = idle_frac
        self.token_frac = token_frac
        self.prompt_floor = prompt_floor
        self.prompt_tokens_per_gpu = prompt_tokens_per_gpu
        self._scale = self.tp * prompt_tokens_per_gpu

    def prompt_power_w(self, tokens: int) -> float:
        if tokens <= 0:
            return self.idle_power_w()
        frac = 1.0 - (1.0 - self.prompt_floor) * math.exp(-tokens / self._scale)
        return self._m.watts(frac)

    def token_power_w(self, batch: int) -> float:
        if batch <= 0:
            return self.idle_power_w()
        return self._m.watts(self.token_frac)

    def idle_power_w(self) -> float:
        return self._m.watts(self.idle_frac)


def _knots(points: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    groups: dict[float, list[float]] = defaultdict(list)
    for x, y in points:
        if y > 0.0:  # zero = not measured
            groups[x].append(y)
    xs = sorted(groups)
    return xs, [statistics.median(groups[x]) for x in xs]


def _hold_interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear inside [xs[0], xs[-1]], constant outside."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x) - 1
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])


class ProfilePowerModel:
    """Power interpolated from a profile's peak_power / average_power columns."""

    __slots__ = ("hw", "tp", "fallback", "prompt_xs", "prompt_fracs", "token_xs", "token_fracs",
                 "_m")

    def __init__(
        self,
        hw: HardwareSpec,
        tp: int | None,
        prompt_knots: Iterable[tuple[float, float]] = (),
        token_knots: Iterable[tuple[float, float]] = (),
        fallback: AnalyticalPowerModel | None = None,
        others_idle: bool = True,
    ) -> None:
        """Knots are (batched prompt tokens, fraction of TDP) and (batch size, fraction of TDP)."""
        self.fallback = fallback if fallback is not None else AnalyticalPowerModel(hw, tp, others_idle=others_idle)
        self._m = _MachineWatts(hw, tp, self.fallback.idle_frac, others_idle)
        self.hw, self.tp = hw, self._m.tp
        self.prompt_xs, self.prompt_fracs = _knots(prompt_knots)
        self.token_xs, self.token_fracs = _knots(token_knots)

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[Mapping[str, Any]],
        hw: HardwareSpec,
        tp: int | None = None,
        fallback: AnalyticalPowerModel | None = None,
        others_idle: bool = True,
    ) -> ProfilePowerModel:
        """From profile rows of one (model, hardware, tp): prompt power from every row's
        peak_power at batch_size * prompt_size; decode power from the batch sweep's
        average_power (the (prompt_size, token_size) most often run at batch > 1)."""
        rows = list(rows)
        multi = [(r["prompt_size"], r["token_size"]) for r in rows if r["batch_size"] > 1]
        ref = max(sorted(set(multi)), key=multi.count) if multi else None
        prompt = [(r["batch_size"] * r["prompt_size"], r["peak_power"]) for r in rows]
        token = [
            (r["batch_size"], r["average_power"]) for r in rows
            if ref is None or (r["prompt_size"], r["token_size"]) == ref
        ]
        return cls(hw, tp, prompt, token, fallback, others_idle)

    @property
    def has_data(self) -> bool:
        return bool(self.prompt_xs or self.token_xs)

    def prompt_power_w(self, tokens: int) -> float:
        if tokens <= 0:
            return self.idle_power_w()
        if not self.prompt_xs:
            return self.fallback.prompt_power_w(tokens)
        return self._m.watts(_hold_interp(self.prompt_xs, self.prompt_fracs, tokens))

    def token_power_w(self, batch: int) -> float:
        if batch <= 0:
            return self.idle_power_w()
        if not self.token_xs:
            return self.fallback.token_power_w(batch)
        return self._m.watts(_hold_interp(self.token_xs, self.token_fracs, batch))

    def idle_power_w(self) -> float:
        return self.fallback.idle_power_w()

"""Performance model interpolated from a measured profile table.

Input: a CSV with the Splitwise authors' profile columns (model, hardware, prompt_size,
batch_size, token_size, peak_power, average_power, prompt_time, token_time, e2e_time,
tensor_parallel), one row per measured request batch; the package ships no such file.
`prompt_time(T)` is piecewise linear through the median time of each batched prompt-token count,
made non-decreasing by isotonic regression; `token_time(b, C)` is the batch sweep's monotone curve
in b times a context factor, a line in the mean per-request context C / b fitted on the batch-1
rows (a line because the context effect is the size of the repeat noise). A batch-sweep group
faster than physically possible (under half the previous batch size's prompt time) is dropped.
Calls are O(1): both curves are tabulated per integer up to _PROMPT_TABLE_MAX / _TOKEN_TABLE_MAX.
docs/perf-model.md ("The profile data", "ProfilePerfModel") has the fit, the points it drops, its
held-out errors and the call times.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from splitserve.errors import UserError
from .mixed import MixedBatching
from .profile_fit import fit_profile, interpolate, isotonic_increasing, read_profile_rows

__all__ = [
    "MIN_TIME_S", "ProfilePerfModel", "fit_profile", "isotonic_increasing", "read_profile_rows",
]

MIN_TIME_S = 1e-4           # floor of any non-empty iteration, seconds
_PROMPT_TABLE_MAX = 65_536  # tabulate prompt_time per integer token count up to this
_TOKEN_TABLE_MAX = 4_096    # tabulate the batch curve per integer batch size up to this

# ----------------------------------------------------------------------------- model


class ProfilePerfModel(MixedBatching):
    """Interpolating perf model over a measured profile; see the module docstring for the form."""

    __slots__ = (
        "source", "prompt_xs", "prompt_ys", "batch_xs", "batch_ys", "ctx_ref", "ctx_a", "ctx_k",
        "dropped", "attention", "additive", "_ptab", "_pn", "_p_last_x", "_p_last_y", "_p_slope",
        "_ttab", "_tn", "_t_last_x", "_t_last_y", "_t_slope", "_g0", "_gk", "ctx_slopes", "_ktab",
    )

    def __init__(
        self,
        prompt_knots: Sequence[tuple[float, float]],
        batch_knots: Sequence[tuple[float, float]],
        ctx_ref: float,
        ctx_a: float = 1.0,
        ctx_k: float = 0.0,
        source: str = "profile",
        dropped: Sequence[str] = (),
        attention: float = 0.0,
        ctx_slopes: Sequence[tuple[float, float]] = (),
    ) -> None:
        """Build from fitted knots (x, seconds), already sorted by x and non-decreasing in y.

        prompt_knots: (batched prompt tokens, seconds). batch_knots: (batch size, seconds of one
        decode iteration at mean per-request context ctx_ref). Context line: a + k * x.
        ctx_slopes: (batch size, seconds per KV token): the additive decode form (profile_fit).
        Prefer `from_csv` / `from_rows`, which fit these from measured rows.
        """
        if not prompt_knots or not batch_knots:
            raise UserError("profile has no usable prompt or token points")
        self.source = source
        self.dropped = tuple(dropped)
        self.attention = float(attention)
        self.additive = False
        self.prompt_xs = [float(x) for x, _ in prompt_knots]
        self.prompt_ys = [float(y) for _, y in prompt_knots]
        self.batch_xs = [float(x) for x, _ in batch_knots]
        self.batch_ys = [float(y) for _, y in batch_knots]
        for xs in (self.prompt_xs, self.batch_xs):
            if any(b <= a for a, b in zip(xs, xs[1:])):
                raise ValueError("knots must have strictly increasing x")
        self.ctx_ref = float(ctx_ref)
        self.ctx_a = float(ctx_a)
        self.ctx_k = max(0.0, float(ctx_k))
        norm = self.ctx_a + self.ctx_k * self.ctx_ref
        if norm <= 0.0:
            self.ctx_k, norm = 0.0, 1.0
            self.ctx_a = 1.0
        self._g0 = self.ctx_a / norm
        self._gk = self.ctx_k / norm

        self._tables(ctx_slopes)

    def _tables(self, ctx_slopes: Sequence[tuple[float, float]]) -> None:
        """The prompt and decode times per integer token count and batch size (and past the last
        knot, its slope); with `ctx_slopes`, the slope per KV token per batch size."""
        # prompt: table per integer token count, then the last slope
        pxs, pys = self.prompt_xs, self.prompt_ys
        self._p_last_x = pxs[-1]
        self._p_last_y = pys[-1]
        self._p_slope = (pys[-1] - pys[-2]) / (pxs[-1] - pxs[-2]) if len(pxs) > 1 else 0.0
        self._pn = int(min(math.floor(pxs[-1]), _PROMPT_TABLE_MAX)) + 1
        self._ptab = [max(MIN_TIME_S, interpolate(pxs, pys, t)) for t in range(self._pn)]

        # decode: table per integer batch size, then the last slope
        bxs, bys = self.batch_xs, self.batch_ys
        self._t_last_x = bxs[-1]
        self._t_last_y = bys[-1]
        self._t_slope = (bys[-1] - bys[-2]) / (bxs[-1] - bxs[-2]) if len(bxs) > 1 else 0.0
        self._tn = max(_TOKEN_TABLE_MAX, int(bxs[-1])) + 1
        self._ttab = [max(MIN_TIME_S, interpolate(bxs, bys, b)) for b in range(self._tn)]
        # additive decode form: slope per KV token, per integer batch size, flat past the ends
        self.ctx_slopes = tuple((float(b), float(k)) for b, k in ctx_slopes)
        self._ktab = None
        if self.ctx_slopes:
            kx, ky = [b for b, _ in self.ctx_slopes], [k for _, k in self.ctx_slopes]
            self._ktab = [ky[0] if b <= kx[0] else ky[-1] if b >= kx[-1] else interpolate(kx, ky, b)
                          for b in range(self._tn)]

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_csv(
        cls,
        path: str | os.PathLike[str],
        model: Any,
        hardware_profile_name: str,
        tp: int,
    ) -> ProfilePerfModel:
        """Fit from the rows of `path` for (model, hardware_profile_name, tp).

        `model` is a model name or anything with a `.name` (a ModelSpec).
        Raises UserError when the file has no such rows.
        """
        name = model if isinstance(model, str) else model.name
        rows = read_profile_rows(path, name, hardware_profile_name, tp)
        if not rows:
            raise UserError(
                f"profile {os.fspath(path)!r} has no rows for model={name} "
                f"hardware={hardware_profile_name} tensor_parallel={tp}"
            )
        return cls.from_rows(rows, source=f"profile:{os.fspath(path)}")

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], source: str = "profile",
                  attention: bool = False) -> ProfilePerfModel:
        """Fit from rows of one (model, hardware, tp) with numeric prompt_size, batch_size,
        token_size, prompt_time (ms), token_time (ms); `attention`: with the attention term
        (profile_fit.fit_profile)."""
        fit = fit_profile(rows, attention)
        return cls(
            fit["prompt_knots"], fit["batch_knots"], fit["ctx_ref"], fit["ctx_a"], fit["ctx_k"],
            source=source, dropped=fit["dropped"], attention=fit["attention"], ctx_slopes=fit["ctx_slopes"],
        )

    # ------------------------------------------------------------------ queries (hot path)

    def prompt_time(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        if tokens < self._pn:
            return self._ptab[tokens]
        if tokens <= self._p_last_x:  # only when the profile reaches past the table
            return max(MIN_TIME_S, interpolate(self.prompt_xs, self.prompt_ys, tokens))
        t = self._p_last_y + self._p_slope * (tokens - self._p_last_x)
        return t if t > MIN_TIME_S else MIN_TIME_S

    def token_time(self, batch: int, context: int) -> float:
        if batch <= 0:
            return 0.0
        if batch < self._tn:
            d = self._ttab[batch]
        else:
            d = self._t_last_y + self._t_slope * (batch - self._t_last_x)
        if self._ktab is not None:
            t = d + self._ktab[batch if batch < self._tn else -1] * (context - batch * self.ctx_ref)
        else:
            t = d * (self._g0 + self._gk * context / batch)
        return t if t > MIN_TIME_S else MIN_TIME_S

    def __repr__(self) -> str:
        return f"ProfilePerfModel(source={self.source!r})"

"""Performance model interpolated from a measured profile table.

Input: a CSV with the columns of the Splitwise authors' profile
    model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,
    prompt_time,token_time,e2e_time,tensor_parallel
where each row is one measured request batch: `batch_size` prompts of `prompt_size` tokens each
took `prompt_time` ms to prefill, then every decode iteration took `token_time` ms on average
while the batch generated `token_size` tokens per request. The package does not ship such a file.

Fitted form (times in seconds; docs/perf-model.md has the reasoning and the fit errors):

* prompt_time(T): piecewise linear in T = batch_size * prompt_size (batched prompt tokens).
  Rows with the same T are merged by the median of their times; the medians are then made
  non-decreasing in T by weighted isotonic regression (pool-adjacent-violators; the weight is the
  number of rows), which leaves already monotone points untouched. Beyond the last point the last
  segment's slope continues; below the first, the first segment's slope, never under MIN_TIME_S.
* token_time(b, C): D(b) * g(C / b).
  D(b): piecewise linear in the batch size, through the medians of the batch sweep (the rows
  that vary batch_size at one (prompt_size, token_size), 512/128 in the Splitwise profile),
  made monotone the same way, last slope beyond the last point.
  g(x): context factor of the mean per-request context x = C / b, from a least-squares line
  y = a + k x through the batch-1 rows, each placed at its mean decode context
  prompt_size + token_size / 2, normalised so that g = 1 at the batch sweep's own mean context
  (576 for 512/128): g(x) = (a + k x) / (a + k x_ref), k clamped at >= 0. A line rather than
  a polyline because the batch-1 context effect (~5% over 128..8192 tokens) is of the same size
  as the repeat noise, so a polyline through the medians would chase noise.
* mixed_time(p, b, C) = max(prompt_time(p + b), token_time(b, C)) when p > 0 and b > 0 (the
  decodes ride in the prefill pass as b extra tokens), prompt_time(p) when b == 0,
  token_time(b, C) when p == 0; 0.0 for an empty iteration.

Dropped points: a batch-sweep group whose median prompt time is less than half of the previous
batch size's is physically impossible (twice the prompt tokens in under half the time) and is
dropped whole, prompt and token time. In the Splitwise profile this removes llama2-70b tp 2,
batch 64, on a100-80gb, h100-80gb and h100-80gb-pcap (794 ms after 6633 ms at batch 32 on A100;
the run most likely failed to hold 64 x 640 tokens of KV next to 138 GB of weights on 2 GPUs).
Exact duplicate rows are counted once (the file repeats the 512/1/128 group in all three sweeps).

Speed: every call is O(1) in pure Python: prompt times are tabulated per integer token count up
to the last profile point (or 65,536), decode times per integer batch size up to 4,096, with the
linear formulas as fallback. Measured with `python -m timeit` on the development machine
(AMD EPYC, Python 3.11.7): prompt_time 0.06 us, token_time 0.16 us, mixed_time 0.29 us per
call inside the tables; 0.15 us / 0.21 us for prompt / decode calls past them. Building the model
from the CSV takes ~25 ms.
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

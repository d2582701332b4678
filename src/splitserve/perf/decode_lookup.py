"""How a decode batch's step time is read off a profile table (`simulate --decode-lookup`).

- "batch-size" (the default): the profile model's own decode form, the batch sweep D(b) times a
  context factor (perf/profile.py), or whatever the perf model answers for (batch, context).
- "batch-tokens": SplitwiseSim's lookup (its `performance_model.py`
  `DatabasePerformanceModel`, docs/splitwisesim.md row 4), kept as an experiment: the profile's
  rows of (model, hardware, tp) grouped by batch tokens = prompt_size x batch_size, the median
  token_time of each group, a line between the medians and the end segments extended (scipy's
  `interp1d(fill_value="extrapolate")`); a decode iteration of b requests is read at x = b, its
  number of decode tokens. The rows of a batch of b decodes sit at x = 128 b or more (the
  smallest prompt is 128 tokens), so every decode batch below 128 x 512 reads the times the
  profile measured for small batches: on the Splitwise profile's H100 rows (Llama2-70B, tp 8)
  28.3-31.5 ms for any batch of 1-512, where its batch sweep measured 30.6 ms at 1 and 50.2 ms at
  64. Context does not enter. Every row counts, repeated ones too, as pandas' median sees them.

Only the decode time changes: prompts and the mixed-batch rule (perf/mixed.py) are the wrapped
model's. The rule has one owner: this module (scripts/splitwisesim_agreement.py's `perf-db`
reads its lines from `batch_token_lines`).
"""

from __future__ import annotations

import os
import statistics
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from splitserve.errors import UserError
from .mixed import MixedBatching
from .model import PerfModel
from .profile_fit import read_profile_rows

DECODE_LOOKUPS = ("batch-size", "batch-tokens")
DEFAULT_DECODE_LOOKUP = "batch-size"


def check_decode_lookup(name: str) -> None:
    if name not in DECODE_LOOKUPS:
        raise UserError(f"--decode-lookup must be one of {', '.join(DECODE_LOOKUPS)}, got {name!r}")


def extrapolating_line(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """The polyline through (xs, ys) at x, its first and last segments extended beyond the ends
    (scipy's interp1d with fill_value="extrapolate"); xs sorted, at least two."""
    i = bisect_right(xs, x)
    i = 1 if i < 1 else (len(xs) - 1 if i > len(xs) - 1 else i)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


def batch_token_lines(rows: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[float], list[float]]:
    """(batch tokens, median prompt seconds, median token seconds) of profile rows of one
    (model, hardware, tp), sorted by batch tokens: SplitwiseSim's two predictors' points."""
    prompt: dict[float, list[float]] = defaultdict(list)
    token: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        x = float(r["prompt_size"]) * float(r["batch_size"])
        prompt[x].append(float(r["prompt_time"]) / 1000.0)
        token[x].append(float(r["token_time"]) / 1000.0)
    xs = sorted(prompt)
    if len(xs) < 2:
        raise UserError("--decode-lookup batch-tokens: the profile needs rows at two batch-token counts at least")
    return xs, [statistics.median(prompt[x]) for x in xs], [statistics.median(token[x]) for x in xs]


class BatchTokensDecode(MixedBatching):
    """A perf model whose decode time is SplitwiseSim's lookup (module docstring); its prompt time,
    attention term and mixed-batch rule are `base`'s."""

    __slots__ = ("base", "source", "attention", "additive", "xs", "ys")

    def __init__(self, base: PerfModel, xs: Sequence[float], ys: Sequence[float]) -> None:
        self.base, self.xs, self.ys = base, list(xs), list(ys)
        self.source = f"{base.source}+decode-lookup:batch-tokens"
        self.attention, self.additive = base.attention, base.additive

    def prompt_time(self, tokens: int) -> float:
        return self.base.prompt_time(tokens)

    def token_time(self, batch: int, context: int) -> float:
        if batch <= 0:
            return 0.0
        return extrapolating_line(self.xs, self.ys, float(batch))


def with_decode_lookup(perf: PerfModel, lookup: str, profile: str | os.PathLike[str] | None, model: str,
                       hardware: str | None, tp: int) -> PerfModel:
    """`perf` with decode times read by `lookup` (DECODE_LOOKUPS); "batch-tokens" needs `profile`
    rows for (model, hardware, tp)."""
    check_decode_lookup(lookup)
    if lookup == DEFAULT_DECODE_LOOKUP:
        return perf
    rows = (read_profile_rows(profile, model, hardware, tp, unique=False)
            if profile is not None and hardware is not None else [])
    if not rows:
        raise UserError(f"--decode-lookup batch-tokens reads a profile's rows: give --profile with rows for "
                        f"{model} on {hardware or 'this machine'} at tp {tp}")
    xs, _, ys = batch_token_lines(rows)
    return BatchTokensDecode(perf, xs, ys)

"""Per-request metrics in `vllm bench serve`'s terms: TPOT, goodput against SLOs, chosen percentiles.

TPOT (time per output token, first excluded) of one completed request: (e2e - ttft) / (tokens - 1),
for requests with at least 2 tokens (vLLM's definition). Beside it, TBT (bench's every-gap
histogram, vLLM's ITL) weighs each gap once, so long requests count more there.

Goodput (`--goodput KEY:MS ...`, vLLM's `--goodput`): a request is good when it completed and meets
every given limit, in milliseconds: `ttft`, `tpot`, `e2el` (alias `e2e`: end-to-end latency), and
`tbt` (every gap between two of its tokens, i.e. its largest gap). A request with one token has no
TPOT and no gap: those limits hold for it. Reported as the count, the fraction of all requests sent
(a failed or rejected request is not good) and the rate (good / the run's span, like
`throughput_rps`).

`--percentiles 50,90,99` (vLLM's `--metric-percentiles`): the percentiles written as ms aliases
(`p99_ttft_ms`, ...), each from the same histogram as the seconds block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError

GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "tbt": "tbt", "e2el": "e2el", "e2e": "e2el"}


def tpot(ttft: float | None, e2e: float | None, tokens: int) -> float | None:
    if ttft is None or e2e is None or tokens < 2:
        return None
    return (e2e - ttft) / (tokens - 1)


@dataclass(frozen=True, slots=True)
class GoodputSLO:
    """Limits in seconds; None: not limited."""
    ttft: float | None = None
    tpot: float | None = None
    tbt: float | None = None
    e2el: float | None = None

    def meets(self, ttft: float, tpot_s: float | None, max_gap: float | None, e2e: float) -> bool:
        return ((self.ttft is None or ttft <= self.ttft)
                and (self.tpot is None or tpot_s is None or tpot_s <= self.tpot)
                and (self.tbt is None or max_gap is None or max_gap <= self.tbt)
                and (self.e2el is None or e2e <= self.e2el))

    def as_ms(self) -> dict[str, float]:
        return {k: v * 1000 for k in ("ttft", "tpot", "tbt", "e2el") if (v := getattr(self, k)) is not None}


def parse_goodput(values: list[str] | None) -> GoodputSLO | None:
    """`["ttft:500", "tpot:50"]`, `["ttft:500 tpot:50"]` or `["ttft:500,tpot:50"]` -> the SLO."""
    if not values:
        return None
    limits: dict[str, float] = {}
    for value in values:
        for item in value.replace(",", " ").split():
            key, sep, ms = item.partition(":")
            name = GOODPUT_KEYS.get(key.strip().lower())
            if not sep or name is None:
                raise UserError(f"--goodput takes KEY:MILLISECONDS with KEY one of ttft, tpot, tbt, e2el "
                                f"(or e2e), got {item!r}")
            try:
                v = float(ms)
            except ValueError:
                v = math.nan
            if not (math.isfinite(v) and v > 0):
                raise UserError(f"--goodput {key}: the limit must be a positive number of milliseconds, got {ms!r}")
            if name in limits:
                raise UserError(f"--goodput gives {name} twice")
            limits[name] = v / 1000
    return GoodputSLO(**limits)


def parse_percentiles(text: str) -> tuple[float, ...]:
    """ "50,90,99" -> (50.0, 90.0, 99.0): each in (0, 100], no repeats, in the order given."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            p = float(part)
        except ValueError:
            p = math.nan
        if not (0 < p <= 100):
            raise UserError(f"--percentiles takes numbers in (0, 100] separated by commas, got {part!r}")
        if p not in out:
            out.append(p)
    if not out:
        raise UserError("--percentiles needs at least one percentile, e.g. 50,90,99")
    return tuple(out)


def percentile_name(p: float) -> str:
    """vLLM's key: 99 -> 'p99', 99.9 -> 'p99.9'."""
    return f"p{int(p)}" if p == int(p) else f"p{p:g}"


def ms_aliases(hists: dict, percentiles: tuple[float, ...]) -> dict[str, float | None]:
    """`{name: Histogram}` (seconds) -> vLLM's flat millisecond keys: mean_X_ms, median_X_ms and
    pP_X_ms for each percentile P; None where there is no sample."""
    out: dict[str, float | None] = {}
    for name, h in hists.items():
        out[f"mean_{name}_ms"] = _ms(h, h.mean)
        out[f"median_{name}_ms"] = _ms(h, h.quantile(0.5))
        for p in percentiles:
            out[f"{percentile_name(p)}_{name}_ms"] = _ms(h, h.quantile(p / 100))
    return out


def _ms(h, v: float | None) -> float | None:
    """`v` seconds of histogram `h` in milliseconds; None where `h` has no sample or `v` is none."""
    return v * 1000 if h.n and v is not None and math.isfinite(v) else None

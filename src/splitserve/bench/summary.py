"""`summary.json` of a live benchmark: the simulator's names (docs/architecture.md, "summary.json")
plus `bench`.

What a client cannot see (queueing, KV transfers, the cluster's price and power, the Table VI
SLOs' reference) is absent or null; `failed` excludes rejections: completed + failed +
bench.rejected == requests. Added beside the simulator's names, in `vllm bench serve`'s terms (its
result JSON's names): `tpot_s`, token totals and throughputs, `request_goodput` and `goodput`
(`--goodput` limits), and millisecond aliases `mean_X_ms`, `median_X_ms`, `pP_X_ms` of the same
histograms (X in ttft, tpot, itl = tbt, e2el). `prefix_cache` counts the prompt tokens the
server's usage says its prefix cache gave (`usage.prompt_tokens_details.cached_tokens`).
docs/bench.md ("Metrics") lists each field.
"""

from __future__ import annotations

from collections.abc import Callable

from ..report.summary import finite_or_none, prefix_summary
from .collector import Collector
from .metrics import ms_aliases


def bench_summary(c: Collector, workload: dict, *, url: str, model: str | None, wall_s: float,
                  options: dict, percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)) -> dict:
    """`workload`: {name, rps, duration_s}."""
    span = _span(c)

    def per_s(x: float) -> float:
        return x / span if span > 0 else 0.0

    goodput = _goodput(c, per_s)
    out = finite_or_none({
        "design": "live",
        "cluster_label": f"live server {url}",
        "model": model,
        "workload": dict(workload),
        "requests": c.sent,
        "completed": c.completed,
        "failed": c.failed,
        "throughput_rps": per_s(c.completed),
        "offered_rps": _offered_rps(c),
        "tokens_generated": c.tokens,
        "ttft_s": c.ttft.summary(),
        "tbt_s": c.tbt.summary(),
        "e2e_s": c.e2e.summary(),
        "tpot_s": c.tpot.summary(),
        "total_input_tokens": c.input_tokens,
        "total_output_tokens": c.output_tokens,
        "input_throughput": per_s(c.input_tokens),
        "output_throughput": per_s(c.output_tokens),
        "total_token_throughput": per_s(c.input_tokens + c.output_tokens),
        "request_goodput": goodput["rate_rps"] if goodput else None,
        "goodput": goodput,
        **ms_aliases({"ttft": c.ttft, "tpot": c.tpot, "itl": c.tbt, "e2el": c.e2e}, percentiles),
        **_UNSEEN,
        "bench": _bench_fields(c, url, wall_s, options, percentiles),
    })
    if c.input_tokens:
        out["prefix_cache"] = finite_or_none(prefix_summary(c.input_tokens, c.cached_tokens))
    return out


# what a client of the server cannot know: null, with why
_UNSEEN = {
    "slo": {"met": None, "evaluated": False,
            "reason": "SLOs are slowdowns against an uncontended reference; a live run has "
                      "none (compare its ttft_s/tbt_s/e2e_s with a simulation instead)"},
    "cluster": {"design": None, "machines": None, "machine_count": None,
                "cost_per_hour": None, "power_kw": None,
                "note": "unknown to a client of the server"},
}


def _span(c: Collector) -> float:
    """Seconds from the first scheduled arrival to the last request's end (0 before any completed)."""
    if not c.completed or c.last_end is None or c.first_arrival is None:
        return 0.0
    return c.last_end - c.first_arrival


def _goodput(c: Collector, per_s: Callable[[float], float]) -> dict | None:
    """The requests within every --goodput limit: how many, what fraction, at what rate (None
    without --goodput)."""
    if c.goodput is None:
        return None
    return {"slo_ms": c.goodput.as_ms(), "good": c.good,
            "fraction": c.good / c.sent if c.sent else None, "rate_rps": per_s(c.good)}


def _offered_rps(c: Collector) -> float | None:
    """The rate the requests were sent at, from their scheduled arrivals (None under two)."""
    first, last = c.first_arrival, c.last_arrival
    if c.sent > 1 and first is not None and last is not None and last > first:
        return (c.sent - 1) / (last - first)
    return None


def _bench_fields(c: Collector, url: str, wall_s: float, options: dict,
                  percentiles: tuple[float, ...]) -> dict:
    """`bench`: what the client saw beyond the simulator's names (rejections, errors, its own
    send lag), and the run's options."""
    lag = c.send_lag
    return {
        "url": url,
        "rejected": c.rejected,
        "rejected_by_status": dict(c.rejected_by_status),
        "errors": dict(c.errors),
        "first_error": c.first_error,
        "wall_s": wall_s,
        "short_outputs": c.short_outputs,
        "usage_mismatch": c.usage_mismatch,
        "peak_in_flight": c.peak_in_flight,
        "prompt_tokens_off": c.prompt_tokens_off,
        "no_prompt_usage": c.no_prompt_usage,
        "percentiles": list(percentiles),
        "send_lag_s": {"p50": lag.quantile(0.5), "p99": lag.quantile(0.99),
                       "max": lag.hi if lag.n else None},
        **options,
    }

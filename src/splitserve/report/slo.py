"""Latency SLOs as slowdowns against the same request on an uncontended DGX-A100 (paper Table VI).

A run meets its SLO when all nine percentiles hold: P50/P90/P99 of the per-request TTFT slowdown,
of the per-token-gap TBT slowdown and of the per-request E2E slowdown. The reference latency of a
request is the model's prompt time for its prompt on one DGX-A100 with nothing else running, and
its TBT the batch-1 decode time at its mean context; E2E adds one TBT per further token.
"""

from __future__ import annotations

from dataclasses import dataclass

from .histogram import Histogram

PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


@dataclass(frozen=True, slots=True)
class SLO:
    ttft: tuple[float, float, float] = (2.0, 3.0, 6.0)
    tbt: tuple[float, float, float] = (1.25, 1.5, 5.0)
    e2e: tuple[float, float, float] = (1.25, 1.5, 5.0)


def evaluate(slo: SLO, ttft: Histogram, tbt: Histogram, e2e: Histogram) -> dict:
    checks = {}
    for metric, hist, limits in (("ttft", ttft, slo.ttft), ("tbt", tbt, slo.tbt), ("e2e", e2e, slo.e2e)):
        for (name, q), limit in zip(PERCENTILES, limits):
            value = hist.quantile(q)
            checks[f"{metric}_{name}"] = {"slowdown": value, "limit": limit,
                                          "met": bool(value <= limit)}
    return {"met": all(c["met"] for c in checks.values()),
            "reference": "same request alone on one DGX-A100 (Splitwise Table VI)",
            "checks": checks}

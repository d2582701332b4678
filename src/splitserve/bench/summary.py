"""`summary.json` of a live benchmark: the simulator's names (docs/architecture.md, "summary.json") plus `bench`.

Shared with `report.summary.simulation_summary`: `workload` {name, rps, duration_s}, `requests`,
`completed`, `failed`, `throughput_rps` (completed / span from the first scheduled arrival to the
last completion), `offered_rps` (from the scheduled arrivals), `tokens_generated`, `ttft_s`,
`tbt_s`, `e2e_s` (p50/p90/p99/mean from the same `Histogram`), `slo`, `cluster`. A client cannot
see what the simulator reports about queueing, KV transfers or the cluster's price and power:
`queue_s`, `kv_transfer` and `sim` are absent, `cluster`'s cost and power are null, and `slo.met`
is null (the Table VI SLOs are slowdowns against a reference that a live run does not have).
`failed` excludes rejections: completed + failed + bench.rejected == requests.
"""

from __future__ import annotations

from ..report.summary import _clean
from ..workload import Workload
from .client import Collector


def bench_summary(c: Collector, workload: Workload, *, url: str, model: str | None, wall_s: float,
                  options: dict) -> dict:
    span = (c.last_end - c.first_arrival) if c.completed and c.last_end is not None else 0.0
    offered = None
    if c.sent > 1 and c.last_arrival > c.first_arrival:
        offered = (c.sent - 1) / (c.last_arrival - c.first_arrival)
    lag = c.send_lag
    return _clean({
        "design": "live",
        "cluster_label": f"live server {url}",
        "model": model,
        "workload": {"name": workload.name, "rps": workload.rps, "duration_s": workload.duration},
        "requests": c.sent,
        "completed": c.completed,
        "failed": c.failed,
        "throughput_rps": c.completed / span if span > 0 else 0.0,
        "offered_rps": offered,
        "tokens_generated": c.tokens,
        "ttft_s": c.ttft.summary(),
        "tbt_s": c.tbt.summary(),
        "e2e_s": c.e2e.summary(),
        "slo": {"met": None, "evaluated": False,
                "reason": "SLOs are slowdowns against an uncontended reference; a live run has "
                          "none (compare its ttft_s/tbt_s/e2e_s with a simulation instead)"},
        "cluster": {"design": None, "machines": None, "machine_count": None,
                    "cost_per_hour": None, "power_kw": None,
                    "note": "unknown to a client of the server"},
        "bench": {
            "url": url,
            "rejected": c.rejected,
            "rejected_by_status": dict(c.rejected_by_status),
            "errors": dict(c.errors),
            "first_error": c.first_error,
            "wall_s": wall_s,
            "short_outputs": c.short_outputs,
            "usage_mismatch": c.usage_mismatch,
            "send_lag_s": {"p50": lag.quantile(0.5), "p99": lag.quantile(0.99),
                           "max": lag.hi if lag.n else None},
            **options,
        },
    })

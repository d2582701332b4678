"""The router's periodic stats in the server log, one line per pool, as vLLM logs its engine's:

    router: prompt pool (1/1 workers up): Avg prompt throughput: 412.0 tokens/s, Avg generation
    throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, KV cache usage: 3.1% (4120
    prompt tokens, 20 generated tokens in 10.0 s)

(one line in the log), every `--log-stats-interval` seconds (0: never). The throughputs are the
pool's engines' work since the last line, from the same counters /metrics serves
(splitserve_prompt_tokens_computed_total: prefill chunks run, recomputations included;
splitserve_tokens_generated_total: tokens made, in a split cluster the first token on the prompt
pool and the others on the token pool), over the seconds since the last line. Running, Waiting and
the KV usage are those of the gauges splitserve_requests_running/_waiting and
splitserve_kv_cache_usage_perc at that moment (metrics.py says what each counts). An interval with
no work and no request in flight is logged once (the return to idle), then not again until there
is work.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .metrics import ServeMetrics
from .metrics_splitwise import POOLS
from .pool_load import kv_usage, request_counts

logger = logging.getLogger(__name__)


class StatsLog:
    def __init__(self, metrics: ServeMetrics) -> None:
        self.metrics = metrics
        self.last: dict[str, tuple[float, float]] = {}  # pool -> counters at the last line
        self.last_at: float | None = None
        self.idle_logged = False

    def counters(self, pool: str) -> tuple[float, float]:
        get = self.metrics.registry.get_sample_value
        return (get("splitserve_prompt_tokens_computed_total", {"pool": pool}) or 0.0,
                get("splitserve_tokens_generated_total", {"pool": pool}) or 0.0)

    def lines(self, router, now: float) -> list[str]:
        """The lines for the interval that ends at `now` (monotonic seconds); the first call only
        starts the first interval."""
        start, self.last_at = self.last_at, now
        pools = [p for p in POOLS if any(w.home == p for w in router.workers)]
        totals = {p: self.counters(p) for p in pools}
        before, self.last = self.last, totals
        if start is None:
            return []
        dt = max(now - start, 1e-9)
        counts, kv = request_counts(router), kv_usage(router.workers)
        out, busy = [], False
        for p in pools:
            prompt, made = (a - b for a, b in zip(totals[p], before.get(p, (0.0, 0.0))))
            run, wait = counts.get(p, (0, 0))
            busy |= bool(prompt or made or run or wait)
            ws = [w for w in router.workers if w.home == p]
            out.append(f"router: {p} pool ({sum(w.up for w in ws)}/{len(ws)} workers up): "
                       f"Avg prompt throughput: {prompt / dt:.1f} tokens/s, "
                       f"Avg generation throughput: {made / dt:.1f} tokens/s, Running: {run} reqs, "
                       f"Waiting: {wait} reqs, KV cache usage: {100 * kv.get(p, 0.0):.1f}% "
                       f"({prompt:.0f} prompt tokens, {made:.0f} generated tokens in {dt:.1f} s)")
        busy |= any(c[0] or c[1] for c in counts.values())
        if not busy:
            if self.idle_logged:
                return []
            self.idle_logged = True
        else:
            self.idle_logged = False
        return out

    async def run(self, router, interval: float) -> None:
        """Every `interval` seconds, the lines in the log (the router's task, until it stops)."""
        self.lines(router, time.monotonic())
        while True:
            await asyncio.sleep(interval)
            for line in self.lines(router, time.monotonic()):
                logger.info(line)

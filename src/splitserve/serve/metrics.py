"""Prometheus metrics of one server, in their own registry (no global state): vLLM's names, so a
dashboard built for vLLM reads them (metrics_vllm.py), and splitserve's own, with the Splitwise view
(per pool, per worker, KV transfers; metrics_splitwise.py). Served at GET /metrics (api.py); no
`_created` series (prom.py `NoCreated`). Each series, what it counts and when: the docstrings of
those two modules. This module: what the router reports (a request's tokens, its completion, a
worker's step, a KV transfer) and the gauges refreshed at each scrape (pool_load.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from .metrics_splitwise import POOLS, SplitwiseSeries
from .metrics_vllm import VllmSeries
from .pool_load import kv_usage, request_counts
from .prom import NoCreated


class ServeMetrics:
    """The metrics of one server in their own registry: the series, `splitwise` (SplitwiseSeries)
    and `vllm` (VllmSeries), and what the router reports into them; `render` answers a scrape."""

    def __init__(self, model_name: str = "", max_model_len: int = 4096) -> None:
        r = self.registry = CollectorRegistry()
        self.model_name = model_name
        self.splitwise = SplitwiseSeries(r)
        self.vllm = VllmSeries(r, model_name, max_model_len, self.splitwise.ttft, self.splitwise.tbt)
        self.exposition = NoCreated(r)
        self._step_prompt: dict[int, int] = {}  # worker id -> prompt tokens of its step reported, not ended
        self._borrowed_seen = 0                 # machines borrowed at the last scrape

    # ---- what the router reports -------------------------------------------------------------
    def first_token(self, ttft: float, prompt_tokens: int, k: int) -> None:
        """A request's first k tokens reached its client, `ttft` seconds after its arrival (its
    prompt's tokens count now; the k tokens count as generated, no gap is observed)."""
        self.splitwise.ttft.observe(ttft)  # also vllm:time_to_first_token_seconds (an Alias)
        self.vllm.prompt.inc(prompt_tokens)
        self.vllm.generation.inc(k)

    def prefix_queried(self, tokens: int) -> None:
        """A prompt of `tokens` went to a worker that looks it up in its prefix cache (vLLM's
        prefix_cache_queries; with the hits, the hit rate)."""
        self.vllm.cache_queries.inc(tokens)

    def prefix_hit(self, tokens: int) -> None:
        """A worker's step started a prompt with `tokens` of it from its prefix cache (counted
        whether or not the request is still followed: its first token may overtake the report)."""
        self.vllm.cache_hits.inc(tokens)

    def tokens(self, gap: float, k: int) -> None:
        """k more tokens of a request reached its client, `gap` seconds after its previous ones."""
        self.vllm.generation.inc(k)
        tbt = self.splitwise.tbt
        for _ in range(k):  # also vllm:inter_token_latency_seconds, vllm:time_per_output_token_seconds
            tbt.observe(gap / k)

    def completed(self, req, reason: str, now: float) -> None:
        """`req` (a router LiveRequest) completed with `reason` at `now` (perf_counter seconds)."""
        v = self.vllm
        e2e = now - req.created
        self.splitwise.e2e.observe(e2e)
        v.e2e.observe(e2e)
        self.splitwise.requests.labels("completed").inc()
        success = v.success.get(reason)
        if success is not None:
            success.inc()
        n = len(req.delivered)
        v.req_prompt.observe(len(req.prompt_ids))
        v.req_generation.observe(n)
        v.max_tokens.observe(req.params.max_tokens)
        if req.first_at:
            v.decode.observe(req.last_at - req.first_at)
            if n > 1:
                v.req_tpot.observe((req.last_at - req.first_at) / (n - 1))
        if not req.scheduled_at:
            self.splitwise.unscheduled.inc()
        else:
            v.queue.observe(req.scheduled_at - req.created)
            v.inference.observe(req.last_at - req.scheduled_at)
            if req.first_at:
                v.prefill.observe(req.first_at - req.scheduled_at)

    def step(self, wid: int, pool: str, prompt_tokens: int, preempted: int) -> None:
        """Worker `wid` (in `pool`) reported an engine step: its prefill chunks' prompt tokens, the
        decodes it preempted."""
        self._step_prompt[wid] = prompt_tokens
        if prompt_tokens:
            self.splitwise.prompt_computed.labels(pool).inc(prompt_tokens)
        if preempted:
            self.vllm.preemptions.inc(preempted)

    def step_out(self, wid: int, pool: str, made: int, prefills: int) -> None:
        """Worker `wid`'s step made `made` tokens, `prefills` of them the token that ends a prefill."""
        if made:
            self.splitwise.generated.labels(pool).inc(made)
        prompt = self._step_prompt.pop(wid, None)
        if prompt is not None or made:
            self.vllm.iteration.observe((prompt or 0) + made - prefills)

    def transfer(self, mode: str, nbytes: int, seconds: float, exposed: float, skipped: int = 0) -> None:
        sw = self.splitwise
        sw.transfers.labels(mode).inc()
        sw.transfer_bytes.labels(mode).inc(nbytes)
        sw.transfer_skipped.labels(mode).inc(skipped)
        sw.transfer_s.labels(mode).inc(seconds)
        sw.transfer_exposed.labels(mode).inc(exposed)
        sw.transfer_time.labels(mode).observe(seconds)
        sw.transfer_exposed_time.labels(mode).observe(exposed)

    # ---- a scrape ------------------------------------------------------------------------------
    def refresh(self, router) -> None:
        """The gauges, from the router's view and the workers' last heartbeats."""
        self._refresh_pools(router)
        self._refresh_workers(router.workers)
        sw = self.splitwise
        sw.bad_messages.labels("router").set(router.state.chan.rejected)
        sw.in_flight.set(len(router.active))
        borrowed = router.views.borrowed()
        if borrowed > self._borrowed_seen:
            sw.borrowed.inc(borrowed - self._borrowed_seen)
            self._borrowed_seen = borrowed

    def _refresh_pools(self, router) -> None:
        """Per pool: queues and pending tokens of the policy view, requests running and waiting,
        KV usage (also vLLM's totals)."""
        sw, v = self.splitwise, self.vllm
        pools: dict[str, list[int]] = {}
        for m in router.views.cluster_snapshot():
            q = pools.setdefault(m["pool"], [0, 0])
            if m["alive"]:
                q[0] += m["prompt_queue"] + m["admit_queue"]
                q[1] += m["pending"]
        counts = request_counts(router)
        kv = kv_usage(router.workers)
        for pool in POOLS:
            q = pools.get(pool, [0, 0])
            sw.queue.labels(pool).set(q[0])
            sw.pending.labels(pool).set(q[1])
            run, wait = counts.get(pool, (0, 0))
            sw.running.labels(pool).set(run)
            sw.waiting.labels(pool).set(wait)
            sw.pool_kv.labels(pool).set(kv.get(pool, 0.0))
        v.running.set(sum(c[0] for c in counts.values()))
        v.waiting.set(sum(c[1] for c in counts.values()))
        v.kv.set(kv["all"])
        v.gpu_kv.set(kv["all"])

    def _refresh_workers(self, workers) -> None:
        sw = self.splitwise
        for w in workers:
            wid = str(w.id)
            sw.worker_up.labels(wid, w.home).set(1 if w.up else 0)
            sw.blocks_total.labels(wid).set(w.blocks)
            sw.blocks_free.labels(wid).set(w.free)
            sw.blocks_used.labels(wid).set(w.blocks - w.free)
            sw.worker_kv.labels(wid).set((w.blocks - w.free) / w.blocks if w.up and w.blocks else 0.0)
            sw.bad_messages.labels(f"worker{wid}").set(w.rejected)

    def render(self, router) -> bytes:
        self.refresh(router)
        return generate_latest(self.exposition)

"""Prometheus metrics of one server, in their own registry (no global state): vLLM's names, so a
dashboard built for vLLM reads them, and splitserve's own, with the Splitwise view (per pool, per
worker, KV transfers). Served at GET /metrics (api.py); no `_created` series (see `NoCreated`).

vLLM's names (each with the label model_name, the served model's name as /v1/models gives it).
The router measures them: it sees every request, every token it hands to a client and every
worker's step reports (reports.py). "Scheduled" below is the moment the router receives the
first `step` report (sent by a worker before the engine step runs) that holds a prefill chunk of
the request: in a phase-split cluster, on its prompt worker. Request-level histograms are
observed when a request completes (stop or length), as vLLM observes them at a request's finish.

    vllm:num_requests_running        gauge: requests in flight whose prefill started, decoding, or
                                     whose KV is in transfer (split: on either pool)
    vllm:num_requests_waiting        gauge: requests in flight not in an engine now: queued for a
                                     prompt worker (also a preempted one, to be recomputed),
                                     waiting for KV memory on a token worker, or parked
    vllm:kv_cache_usage_perc         gauge (0-1): KV blocks in use over all blocks, summed over the
                                     live workers of both pools (their heartbeats, every 0.2 s)
    vllm:gpu_cache_usage_perc        gauge: the same value under vLLM v0's name (CPU workers too)
    vllm:prompt_tokens_total         counter: prompt tokens of requests whose first token reached
                                     their client (a restarted request counts once)
    vllm:generation_tokens_total     counter: output tokens handed to clients (a restarted request's
                                     recomputed tokens are not counted again)
    vllm:request_success_total       counter {finished_reason}: completed requests, "stop" or
                                     "length" (cancelled and failed: splitserve_requests_total)
    vllm:num_preemptions_total       counter: decodes the workers' engines preempted, from their
                                     step reports (under ecoserve also waiting generation tasks
                                     dropped, "unstuck")
    vllm:iteration_tokens_total      histogram: tokens per engine step, any worker: its prefill
                                     chunks' prompt tokens (step report) plus the decode tokens it
                                     made (its `out` report; a worker splits a step's report only
                                     past max_model_len tokens, then each part is one observation)
    vllm:time_to_first_token_seconds histogram: arrival at the router to the first token handed to
                                     the client (split: it comes from the prompt worker); the
                                     samples of splitserve_ttft_seconds under this name (`Alias`)
    vllm:inter_token_latency_seconds histogram: every gap between tokens handed to a client (k
                                     tokens arriving together count as k gaps of 1/k); the
                                     samples of splitserve_tbt_seconds
    vllm:time_per_output_token_seconds  the same samples (vLLM v1's earlier name)
    vllm:request_time_per_output_token_seconds  histogram: per request, (last token - first
                                     token) / (output tokens - 1), requests of 2 tokens or more
    vllm:e2e_request_latency_seconds histogram: arrival at the router to the last token
    vllm:request_queue_time_seconds  histogram: arrival to scheduled (above). In a split cluster
                                     this is the prompt worker's queue and, before it, the wait for
                                     the token worker's KV reservation
    vllm:request_prefill_time_seconds  histogram: scheduled to first token (the whole prefill)
    vllm:request_decode_time_seconds histogram: first token to last token. Split: includes the KV
                                     transfer to the token worker and its queue there
    vllm:request_inference_time_seconds  histogram: scheduled to last token
    vllm:request_prompt_tokens       histogram: prompt tokens per completed request
    vllm:request_generation_tokens   histogram: output tokens per completed request
    vllm:request_params_max_tokens   histogram: max_tokens per completed request

A request is scheduled at its first engine step: when its worker formed the step, by the worker's
clock where the router shares it (the same boot id, serve/reports.py), else when the router reads
the step's report. The router can learn of a split request's first token before that report: the
token worker's `kv_in` can overtake it (two sockets; seen under load on the 2-core dev VM). On a
shared clock the step is placed all the same; otherwise such a request has no scheduling moment:
it is left out of the queue, prefill and inference histograms and counted in
splitserve_requests_schedule_unseen_total, so those histograms' counts plus that counter equal the
completed requests.

A restarted request (its worker died, or it was quarantined) keeps its arrival, its first
scheduling and the tokens already handed out: its times span all its tries.

splitserve's names (kept: tests, docs and `splitserve twin` use them). Latency histograms
(seconds): splitserve_ttft_seconds, splitserve_tbt_seconds (the same gaps as
vllm:inter_token_latency_seconds), splitserve_e2e_seconds.
Gauges, refreshed at each scrape: splitserve_queue_requests{pool} (requests waiting in the prompt
queues and KV-admission queues of each pool's machines), splitserve_pending_tokens{pool} (the JSQ
queue length), splitserve_requests_running{pool} and splitserve_requests_waiting{pool} (the two
vLLM gauges by the pool the request is on: queued and prefilling on its prompt worker's, waiting
for KV, in transfer and decoding on its token worker's), splitserve_kv_cache_usage_perc{pool}
(0-1, the pool's live workers), splitserve_worker_kv_cache_usage_perc{worker},
splitserve_kv_blocks_in_use{worker}, splitserve_kv_blocks_free{worker},
splitserve_kv_blocks_total{worker}, splitserve_worker_up{worker,pool}, splitserve_requests_in_flight.
Counters: splitserve_prompt_tokens_computed_total{pool} (prompt tokens of the prefill chunks the
pool's engines ran, recomputations included), splitserve_tokens_generated_total{pool} (tokens the
pool's engines made: in a split cluster the prompt pool makes each request's first token),
splitserve_kv_transfers_total{mode}, splitserve_kv_transfer_bytes_total{mode},
splitserve_kv_transfer_seconds_total{mode}, splitserve_kv_transfer_exposed_seconds_total{mode}
(the non-overlapped part), splitserve_kv_transfer_failures_total, splitserve_requests_schedule_unseen_total
(above), splitserve_requests_total{outcome},
splitserve_rejected_total{status}, splitserve_request_restarts_total,
splitserve_worker_restarts_total, splitserve_instance_flips_total{to} (TetriInfer's instance flip, the
role taken); splitserve_rejected_internal_messages{where} (router, worker<N>).
Histograms: splitserve_kv_transfer_time_seconds{mode} (first byte put to last byte in, as the token
worker measures it), splitserve_kv_transfer_exposed_time_seconds{mode} (its part after the prefill
ended).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from ..policy.state import Phase
from .messages import Stage


class _Children:
    """A labelled metric whose children are looked up once each: prometheus_client's `labels()`
    takes a lock and re-checks the label values on every call (about 3 us, several times per
    request). Everything else is the metric's own."""

    __slots__ = ("_metric", "_children")

    def __init__(self, metric) -> None:
        self._metric, self._children = metric, {}

    def labels(self, *values):
        try:
            return self._children[values]
        except KeyError:
            child = self._children[values] = self._metric.labels(*values)
            return child

    def __getattr__(self, name):
        return getattr(self._metric, name)


class NoCreated:
    """A registry's metrics without their `_created` samples. prometheus_client (0.26) turns them
    off only process-wide (`disable_created_metrics()`, or PROMETHEUS_DISABLE_CREATED_SERIES read
    at import); its per-registry `restricted_registry` (experimental) keeps listed sample names
    and yields its collectors in set order. This keeps every sample but `_created`, in order."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self):
        for m in self.registry.collect():
            out = Metric(m.name, m.documentation, m.type, m.unit)
            out.samples = [s for s in m.samples if not s.name.endswith("_created")]
            yield out


class Alias:
    """A metric of the registry under another name, with constant labels added: the same samples,
    so one observation serves both names (a token's gap is observed once, not three times)."""

    def __init__(self, source, name: str, documentation: str, labels: dict[str, str]) -> None:
        self.source, self.name, self.documentation, self.labels = source, name, documentation, labels

    def collect(self):
        for m in self.source.collect():
            out = Metric(self.name, self.documentation, m.type)
            out.samples = [s._replace(name=self.name + s.name[len(m.name):], labels={**s.labels, **self.labels})
                           for s in m.samples]
            yield out


def one_two_five(top: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `top` (vLLM's buckets for token counts)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > top:
                return out
            out.append(float(m * scale))
        scale *= 10


_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GAP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_REQ = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0,
        120.0, 240.0, 480.0, 960.0)
_ITER = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
POOLS = ("prompt", "token", "mixed")
REASONS = ("stop", "length")


class ServeMetrics:
    def __init__(self, model_name: str = "", max_model_len: int = 4096) -> None:
        r = self.registry = CollectorRegistry()
        self.model_name = model_name
        self.ttft = Histogram("splitserve_ttft_seconds", "Time to first token", registry=r, buckets=_LAT)
        self.tbt = Histogram("splitserve_tbt_seconds", "Time between tokens", registry=r, buckets=_GAP)
        self.e2e = Histogram("splitserve_e2e_seconds", "End-to-end request latency", registry=r, buckets=_LAT)
        self.queue = Gauge("splitserve_queue_requests", "Requests queued per pool", ["pool"], registry=r)
        self.pending = Gauge("splitserve_pending_tokens", "Pending tokens per pool (JSQ)", ["pool"], registry=r)
        self.running = Gauge("splitserve_requests_running", "Requests in an engine, by pool", ["pool"], registry=r)
        self.waiting = Gauge("splitserve_requests_waiting", "Requests waiting, by pool", ["pool"], registry=r)
        self.pool_kv = Gauge("splitserve_kv_cache_usage_perc", "KV blocks in use over all, per pool (0-1)",
                             ["pool"], registry=r)
        self.worker_kv = Gauge("splitserve_worker_kv_cache_usage_perc", "KV blocks in use over all (0-1)",
                               ["worker"], registry=r)
        self.blocks_used = Gauge("splitserve_kv_blocks_in_use", "KV blocks in use", ["worker"], registry=r)
        self.blocks_free = Gauge("splitserve_kv_blocks_free", "KV blocks free", ["worker"], registry=r)
        self.blocks_total = Gauge("splitserve_kv_blocks_total", "KV blocks", ["worker"], registry=r)
        self.worker_up = Gauge("splitserve_worker_up", "1 if the worker is alive", ["worker", "pool"], registry=r)
        self.in_flight = Gauge("splitserve_requests_in_flight", "Requests admitted, not finished", registry=r)
        self.prompt_computed = Counter("splitserve_prompt_tokens_computed", "Prompt tokens prefilled, by pool",
                                       ["pool"], registry=r)
        self.generated = Counter("splitserve_tokens_generated", "Tokens made by the engines, by pool",
                                 ["pool"], registry=r)
        self.transfers = Counter("splitserve_kv_transfers", "KV transfers", ["mode"], registry=r)
        self.transfer_bytes = Counter("splitserve_kv_transfer_bytes", "KV bytes moved", ["mode"], registry=r)
        self.transfer_s = Counter("splitserve_kv_transfer_seconds", "KV transfer time", ["mode"], registry=r)
        self.transfer_exposed = Counter("splitserve_kv_transfer_exposed_seconds",
                                        "Non-overlapped KV transfer time", ["mode"], registry=r)
        self.transfer_time = Histogram("splitserve_kv_transfer_time_seconds", "KV transfer time, first byte put "
                                       "to last byte in", ["mode"], registry=r, buckets=_LAT)
        self.transfer_exposed_time = Histogram("splitserve_kv_transfer_exposed_time_seconds",
                                               "KV transfer time after the prefill ended", ["mode"], registry=r,
                                               buckets=_LAT)
        self.unscheduled = Counter("splitserve_requests_schedule_unseen", "Completed requests whose first step "
                                   "report came after their first token from a worker of another clock", registry=r)
        self.transfer_failures = Counter("splitserve_kv_transfer_failures", "KV transfers that failed", registry=r)
        self.requests = Counter("splitserve_requests", "Requests by outcome", ["outcome"], registry=r)
        self.rejected = Counter("splitserve_rejected", "Requests shed by overload", ["status"], registry=r)
        self.restarts = Counter("splitserve_request_restarts", "Requests restarted on another worker", registry=r)
        self.worker_restarts = Counter("splitserve_worker_restarts", "Workers replaced", registry=r)
        self.flips = Counter("splitserve_instance_flips", "Workers that flipped role", ["to"], registry=r)
        self.bad_messages = Gauge("splitserve_rejected_internal_messages",
                                  "Internal messages dropped for a bad MAC (no cluster secret)", ["where"],
                                  registry=r)
        for name in ("queue", "pending", "running", "waiting", "pool_kv", "worker_kv", "blocks_used", "blocks_free",
                     "blocks_total", "worker_up", "prompt_computed", "generated", "transfers", "transfer_bytes",
                     "transfer_s", "transfer_exposed", "transfer_time", "transfer_exposed_time", "requests",
                     "rejected", "bad_messages"):
            setattr(self, name, _Children(getattr(self, name)))
        for mode in ("layerwise", "serialized"):
            for c in (self.transfers, self.transfer_bytes, self.transfer_s, self.transfer_exposed,
                      self.transfer_time, self.transfer_exposed_time):
                c.labels(mode)
        self._vllm(r, model_name, max_model_len)
        self.exposition = NoCreated(r)
        self._step_prompt: dict[int, int] = {}  # worker id -> prompt tokens of its step reported, not ended

    def _vllm(self, r: CollectorRegistry, model: str, max_model_len: int) -> None:
        """vLLM's metrics, each the child of the served model's name (see the module docstring)."""
        m = ["model_name"]

        def gauge(name, doc):
            return Gauge(name, doc, m, registry=r).labels(model)

        def counter(name, doc):
            return Counter(name, doc, m, registry=r).labels(model)

        def hist(name, doc, buckets):
            return Histogram(name, doc, m, registry=r, buckets=buckets).labels(model)

        toks = one_two_five(max_model_len)
        self.v_running = gauge("vllm:num_requests_running", "Requests in an engine or in KV transfer")
        self.v_waiting = gauge("vllm:num_requests_waiting", "Requests waiting for an engine or for KV memory")
        self.v_kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage of the live workers; 1 means 100 percent")
        self.v_gpu_kv = gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (vLLM v0's name); 1 means 100 percent")
        self.v_prompt = counter("vllm:prompt_tokens", "Prompt tokens of requests that got their first token")
        self.v_generation = counter("vllm:generation_tokens", "Output tokens handed to clients")
        self.v_preemptions = counter("vllm:num_preemptions", "Decodes preempted by the workers' engines")
        success = Counter("vllm:request_success", "Completed requests", ["model_name", "finished_reason"], registry=r)
        self.v_success = {reason: success.labels(model, reason) for reason in REASONS}
        self.v_iteration = hist("vllm:iteration_tokens_total", "Tokens per engine step", _ITER)
        for source, name, doc in ((self.ttft, "vllm:time_to_first_token_seconds", "Time to first token"),
                                  (self.tbt, "vllm:inter_token_latency_seconds", "Time between tokens"),
                                  (self.tbt, "vllm:time_per_output_token_seconds", "Time between tokens (earlier name)")):
            r.register(Alias(source, name, doc, {"model_name": model}))
        self.v_req_tpot = hist("vllm:request_time_per_output_token_seconds", "Mean time per output token of a "
                               "request after its first", _GAP)
        self.v_e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to last token", _REQ)
        self.v_queue = hist("vllm:request_queue_time_seconds", "Arrival to the first engine step holding the "
                            "request's prompt", _REQ)
        self.v_prefill = hist("vllm:request_prefill_time_seconds", "Scheduled to first token", _REQ)
        self.v_decode = hist("vllm:request_decode_time_seconds", "First token to last token", _REQ)
        self.v_inference = hist("vllm:request_inference_time_seconds", "Scheduled to last token", _REQ)
        self.v_req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per request", toks)
        self.v_req_generation = hist("vllm:request_generation_tokens", "Output tokens per request", toks)
        self.v_max_tokens = hist("vllm:request_params_max_tokens", "max_tokens per request", toks)

    # ---- what the router reports -------------------------------------------------------------
    def first_token(self, ttft: float, prompt_tokens: int, k: int) -> None:
        """A request's first k tokens reached its client, `ttft` seconds after its arrival (its
    prompt's tokens count now; the k tokens count as generated, no gap is observed)."""
        self.ttft.observe(ttft)  # also vllm:time_to_first_token_seconds (an Alias)
        self.v_prompt.inc(prompt_tokens)
        self.v_generation.inc(k)

    def tokens(self, gap: float, k: int) -> None:
        """k more tokens of a request reached its client, `gap` seconds after its previous ones."""
        self.v_generation.inc(k)
        self.observe_gap(gap, k)

    def observe_gap(self, gap: float, k: int) -> None:
        for _ in range(k):  # also vllm:inter_token_latency_seconds, vllm:time_per_output_token_seconds
            self.tbt.observe(gap / k)

    def completed(self, req, reason: str, now: float) -> None:
        """`req` (a router LiveRequest) completed with `reason` at `now` (perf_counter seconds)."""
        e2e = now - req.created
        self.e2e.observe(e2e)
        self.v_e2e.observe(e2e)
        self.requests.labels("completed").inc()
        success = self.v_success.get(reason)
        if success is not None:
            success.inc()
        n = len(req.delivered)
        self.v_req_prompt.observe(len(req.prompt_ids))
        self.v_req_generation.observe(n)
        self.v_max_tokens.observe(req.params.max_tokens)
        if req.first_at:
            self.v_decode.observe(req.last_at - req.first_at)
            if n > 1:
                self.v_req_tpot.observe((req.last_at - req.first_at) / (n - 1))
        if not req.scheduled_at:
            self.unscheduled.inc()
        else:
            self.v_queue.observe(req.scheduled_at - req.created)
            self.v_inference.observe(req.last_at - req.scheduled_at)
            if req.first_at:
                self.v_prefill.observe(req.first_at - req.scheduled_at)

    def step(self, wid: int, pool: str, prompt_tokens: int, preempted: int) -> None:
        """Worker `wid` (in `pool`) reported an engine step: its prefill chunks' prompt tokens, the
        decodes it preempted."""
        self._step_prompt[wid] = prompt_tokens
        if prompt_tokens:
            self.prompt_computed.labels(pool).inc(prompt_tokens)
        if preempted:
            self.v_preemptions.inc(preempted)

    def step_out(self, wid: int, pool: str, made: int, prefills: int) -> None:
        """Worker `wid`'s step made `made` tokens, `prefills` of them the token that ends a prefill."""
        if made:
            self.generated.labels(pool).inc(made)
        prompt = self._step_prompt.pop(wid, None)
        if prompt is not None or made:
            self.v_iteration.observe((prompt or 0) + made - prefills)

    def transfer(self, mode: str, nbytes: int, seconds: float, exposed: float) -> None:
        self.transfers.labels(mode).inc()
        self.transfer_bytes.labels(mode).inc(nbytes)
        self.transfer_s.labels(mode).inc(seconds)
        self.transfer_exposed.labels(mode).inc(exposed)
        self.transfer_time.labels(mode).observe(seconds)
        self.transfer_exposed_time.labels(mode).observe(exposed)

    # ---- a scrape ------------------------------------------------------------------------------
    def refresh(self, router) -> None:
        """The gauges, from the router's view and the workers' last heartbeats."""
        pools: dict[str, list[int]] = {}
        for m in router.cluster_snapshot():
            q = pools.setdefault(m["pool"], [0, 0])
            if m["alive"]:
                q[0] += m["prompt_queue"] + m["admit_queue"]
                q[1] += m["pending"]
        for pool in POOLS:
            q = pools.get(pool, [0, 0])
            self.queue.labels(pool).set(q[0])
            self.pending.labels(pool).set(q[1])
        counts = request_counts(router)
        for pool in POOLS:
            run, wait = counts.get(pool, (0, 0))
            self.running.labels(pool).set(run)
            self.waiting.labels(pool).set(wait)
        self.v_running.set(sum(c[0] for c in counts.values()))
        self.v_waiting.set(sum(c[1] for c in counts.values()))
        kv = kv_usage(router.workers)
        for pool in POOLS:
            self.pool_kv.labels(pool).set(kv.get(pool, 0.0))
        self.v_kv.set(kv["all"])
        self.v_gpu_kv.set(kv["all"])
        for w in router.workers:
            wid = str(w.id)
            self.worker_up.labels(wid, w.home).set(1 if w.up else 0)
            self.blocks_total.labels(wid).set(w.blocks)
            self.blocks_free.labels(wid).set(w.free)
            self.blocks_used.labels(wid).set(w.blocks - w.free)
            self.worker_kv.labels(wid).set((w.blocks - w.free) / w.blocks if w.up and w.blocks else 0.0)
            self.bad_messages.labels(f"worker{wid}").set(w.rejected)
        self.bad_messages.labels("router").set(router.chan.rejected)
        self.in_flight.set(len(router.active))

    def render(self, router) -> bytes:
        self.refresh(router)
        return generate_latest(self.exposition)


def kv_usage(workers) -> dict[str, float]:
    """KV blocks in use over all blocks (0-1) of the live workers, per pool (a worker's home: its
    role now) and over all ("all"), from their last heartbeats."""
    used: dict[str, list[int]] = {"all": [0, 0]}
    for w in workers:
        if w.up and w.blocks:
            for key in (w.home, "all"):
                u = used.setdefault(key, [0, 0])
                u[0] += w.blocks - w.free
                u[1] += w.blocks
    return {k: (u[0] / u[1] if u[1] else 0.0) for k, u in used.items()}


def request_counts(router) -> dict[str, tuple[int, int]]:
    """(running, waiting) requests per pool (module docstring): a request waits while it is
    parked, unrouted, waiting for KV memory (on its token worker's pool) or queued for its prompt
    worker (prefill not started, or to be recomputed after a preemption); it runs while its prefill
    runs (prompt worker's pool), in KV transfer, ready or decoding (token worker's pool)."""
    machines = router.cluster.machines if router.cluster is not None else []
    out: dict[str, list[int]] = {}
    for req in router.active.values():
        r = req.pr
        if r is None or req.stage in (Stage.NEW, Stage.PARKED) or r.prompt_machine < 0:
            out.setdefault("none", [0, 0])[1] += 1
            continue
        waiting = r.phase is Phase.QUEUED or r.phase is Phase.WAITING or req.stage is Stage.WAITING
        on_prompt = r.phase is Phase.QUEUED or r.phase is Phase.PREFILL
        wid = r.prompt_machine if on_prompt and req.stage is not Stage.WAITING or r.token_machine < 0 \
            else r.token_machine
        pool = machines[wid].pool.name.lower() if 0 <= wid < len(machines) else "none"
        out.setdefault(pool, [0, 0])[1 if waiting else 0] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}

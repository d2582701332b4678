"""The Splitwise view of a server in Prometheus series (no label model_name): latencies, and per
pool, per worker and per KV-transfer mode what the router sees.

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
(the non-overlapped part), splitserve_kv_transfer_skipped_tokens_total{mode} (prompt tokens not sent:
the token worker's prefix cache held them), splitserve_kv_transfer_failures_total, splitserve_requests_schedule_unseen_total
(metrics_vllm.py), splitserve_requests_total{outcome},
splitserve_rejected_total{status}, splitserve_request_restarts_total,
splitserve_worker_restarts_total, splitserve_recomputes_total{where} (decodes preempted, their KV
dropped, by where they recompute: in_place on the worker that preempted them, or prompt_pool when
sent back through the prompt pool, --recompute), splitserve_instance_flips_total{to} (TetriInfer's instance flip, the
role taken), splitserve_machines_borrowed_total (machines the Splitwise scheduler moved into the mixed
pool, as the simulator's `borrowed_into_mixed_pool`); splitserve_rejected_internal_messages{where} (router, worker<N>).
Histograms: splitserve_kv_transfer_time_seconds{mode} (first byte put to last byte in, as the token
worker measures it), splitserve_kv_transfer_exposed_time_seconds{mode} (its part after the prefill
ended).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .prom import GAP, LAT, Children

POOLS = ("prompt", "token", "mixed")


class SplitwiseSeries:
    """splitserve's own series (see the module docstring), as attributes; ServeMetrics and the
    router update them."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram("splitserve_ttft_seconds", "Time to first token", registry=r, buckets=LAT)
        self.tbt = Histogram("splitserve_tbt_seconds", "Time between tokens", registry=r, buckets=GAP)
        self.e2e = Histogram("splitserve_e2e_seconds", "End-to-end request latency", registry=r, buckets=LAT)
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
        self.transfer_skipped = Counter("splitserve_kv_transfer_skipped_tokens", "Prompt tokens not sent: the token "
                                        "worker's prefix cache held them", ["mode"], registry=r)
        self.transfer_s = Counter("splitserve_kv_transfer_seconds", "KV transfer time", ["mode"], registry=r)
        self.transfer_exposed = Counter("splitserve_kv_transfer_exposed_seconds",
                                        "Non-overlapped KV transfer time", ["mode"], registry=r)
        self.transfer_time = Histogram("splitserve_kv_transfer_time_seconds", "KV transfer time, first byte put "
                                       "to last byte in", ["mode"], registry=r, buckets=LAT)
        self.transfer_exposed_time = Histogram("splitserve_kv_transfer_exposed_time_seconds",
                                               "KV transfer time after the prefill ended", ["mode"], registry=r,
                                               buckets=LAT)
        self.unscheduled = Counter("splitserve_requests_schedule_unseen", "Completed requests whose first step "
                                   "report came after their first token from a worker of another clock", registry=r)
        self.transfer_failures = Counter("splitserve_kv_transfer_failures", "KV transfers that failed", registry=r)
        self.requests = Counter("splitserve_requests", "Requests by outcome", ["outcome"], registry=r)
        self.rejected = Counter("splitserve_rejected", "Requests shed by overload", ["status"], registry=r)
        self.restarts = Counter("splitserve_request_restarts", "Requests restarted on another worker", registry=r)
        self.worker_restarts = Counter("splitserve_worker_restarts", "Workers replaced", registry=r)
        self.recomputes = Counter("splitserve_recomputes", "Decodes preempted, by where they recompute", ["where"],
                                  registry=r)
        for where in ("in_place", "prompt_pool"):
            self.recomputes.labels(where)
        self.flips = Counter("splitserve_instance_flips", "Workers that flipped role", ["to"], registry=r)
        self.borrowed = Counter("splitserve_machines_borrowed", "Machines moved into the mixed pool", registry=r)
        self.bad_messages = Gauge("splitserve_rejected_internal_messages",
                                  "Internal messages dropped for a bad MAC (no cluster secret)", ["where"],
                                  registry=r)
        for name in ("queue", "pending", "running", "waiting", "pool_kv", "worker_kv", "blocks_used", "blocks_free",
                     "blocks_total", "worker_up", "prompt_computed", "generated", "transfers", "transfer_bytes",
                     "transfer_skipped", "transfer_s", "transfer_exposed", "transfer_time", "transfer_exposed_time", "requests",
                     "rejected", "bad_messages"):
            setattr(self, name, Children(getattr(self, name)))
        for mode in ("layerwise", "serialized"):
            for c in (self.transfers, self.transfer_bytes, self.transfer_skipped, self.transfer_s, self.transfer_exposed,
                      self.transfer_time, self.transfer_exposed_time):
                c.labels(mode)

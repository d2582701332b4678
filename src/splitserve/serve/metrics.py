"""Prometheus metrics of one server, in their own registry (no global state).

Latency histograms (seconds): splitserve_ttft_seconds, splitserve_tbt_seconds (every gap between
tokens; k tokens arriving together count as k gaps of 1/k), splitserve_e2e_seconds.
Gauges, refreshed at each scrape: splitserve_queue_requests{pool} (requests waiting in the prompt
queues and KV-admission queues of each pool's machines), splitserve_pending_tokens{pool} (the JSQ
queue length), splitserve_kv_blocks_in_use{worker}, splitserve_kv_blocks_free{worker},
splitserve_kv_blocks_total{worker}, splitserve_worker_up{worker,pool}, splitserve_requests_in_flight.
Counters: splitserve_kv_transfers_total{mode}, splitserve_kv_transfer_bytes_total{mode},
splitserve_kv_transfer_seconds_total{mode}, splitserve_kv_transfer_exposed_seconds_total{mode}
(the non-overlapped part), splitserve_kv_transfer_failures_total, splitserve_requests_total{outcome},
splitserve_rejected_total{status}, splitserve_request_restarts_total,
splitserve_worker_restarts_total, splitserve_instance_flips_total{to} (TetriInfer's instance flip, the
role taken); splitserve_rejected_internal_messages{where} (router, worker<N>).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


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


_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GAP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("splitserve_ttft_seconds", "Time to first token", registry=r, buckets=_LAT)
        self.tbt = Histogram("splitserve_tbt_seconds", "Time between tokens", registry=r, buckets=_GAP)
        self.e2e = Histogram("splitserve_e2e_seconds", "End-to-end request latency", registry=r, buckets=_LAT)
        self.queue = Gauge("splitserve_queue_requests", "Requests queued per pool", ["pool"], registry=r)
        self.pending = Gauge("splitserve_pending_tokens", "Pending tokens per pool (JSQ)", ["pool"], registry=r)
        self.blocks_used = Gauge("splitserve_kv_blocks_in_use", "KV blocks in use", ["worker"], registry=r)
        self.blocks_free = Gauge("splitserve_kv_blocks_free", "KV blocks free", ["worker"], registry=r)
        self.blocks_total = Gauge("splitserve_kv_blocks_total", "KV blocks", ["worker"], registry=r)
        self.worker_up = Gauge("splitserve_worker_up", "1 if the worker is alive", ["worker", "pool"], registry=r)
        self.in_flight = Gauge("splitserve_requests_in_flight", "Requests admitted, not finished", registry=r)
        self.transfers = Counter("splitserve_kv_transfers", "KV transfers", ["mode"], registry=r)
        self.transfer_bytes = Counter("splitserve_kv_transfer_bytes", "KV bytes moved", ["mode"], registry=r)
        self.transfer_s = Counter("splitserve_kv_transfer_seconds", "KV transfer time", ["mode"], registry=r)
        self.transfer_exposed = Counter("splitserve_kv_transfer_exposed_seconds",
                                        "Non-overlapped KV transfer time", ["mode"], registry=r)
        self.transfer_failures = Counter("splitserve_kv_transfer_failures", "KV transfers that failed", registry=r)
        self.requests = Counter("splitserve_requests", "Requests by outcome", ["outcome"], registry=r)
        self.rejected = Counter("splitserve_rejected", "Requests shed by overload", ["status"], registry=r)
        self.restarts = Counter("splitserve_request_restarts", "Requests restarted on another worker", registry=r)
        self.worker_restarts = Counter("splitserve_worker_restarts", "Workers replaced", registry=r)
        self.flips = Counter("splitserve_instance_flips", "Workers that flipped role", ["to"], registry=r)
        self.bad_messages = Gauge("splitserve_rejected_internal_messages",
                                  "Internal messages dropped for a bad MAC (no cluster secret)", ["where"],
                                  registry=r)
        for name in ("queue", "pending", "blocks_used", "blocks_free", "blocks_total", "worker_up", "transfers",
                     "transfer_bytes", "transfer_s", "transfer_exposed", "requests", "rejected", "bad_messages"):
            setattr(self, name, _Children(getattr(self, name)))
        for mode in ("layerwise", "serialized"):
            for c in (self.transfers, self.transfer_bytes, self.transfer_s, self.transfer_exposed):
                c.labels(mode)

    def observe_gap(self, gap: float, k: int) -> None:
        for _ in range(k):
            self.tbt.observe(gap / k)

    def render(self, router) -> bytes:
        pools: dict[str, list[int]] = {}
        for m in router.cluster_snapshot():
            q = pools.setdefault(m["pool"], [0, 0])
            if m["alive"]:
                q[0] += m["prompt_queue"] + m["admit_queue"]
                q[1] += m["pending"]
        for pool in ("prompt", "token", "mixed"):
            q = pools.get(pool, [0, 0])
            self.queue.labels(pool).set(q[0])
            self.pending.labels(pool).set(q[1])
        for w in router.workers:
            wid = str(w.id)
            self.worker_up.labels(wid, w.home).set(1 if w.up else 0)
            self.blocks_total.labels(wid).set(w.blocks)
            self.blocks_free.labels(wid).set(w.free)
            self.blocks_used.labels(wid).set(w.blocks - w.free)
            self.bad_messages.labels(f"worker{wid}").set(w.rejected)
        self.bad_messages.labels("router").set(router.chan.rejected)
        self.in_flight.set(len(router.active))
        return generate_latest(self.registry)

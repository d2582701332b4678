"""vLLM's series of a server, so a dashboard built for vLLM reads them.

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
token worker's `kv_in` can overtake it (it comes over another socket). On a
shared clock the step is placed all the same; otherwise such a request has no scheduling moment:
it is left out of the queue, prefill and inference histograms and counted in
splitserve_requests_schedule_unseen_total, so those histograms' counts plus that counter equal the
completed requests.

A restarted request (its worker died, or it was quarantined) keeps its arrival, its first
scheduling and the tokens already handed out: its times span all its tries.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .prom import GAP, ITER, REQ, Alias, one_two_five

REASONS = ("stop", "length")


class VllmSeries:
    """vLLM's series (see the module docstring), each the child of the served model's name, as
    attributes; ServeMetrics updates them. Three of them are the samples of `ttft` and `tbt`
    (SplitwiseSeries' histograms) under vLLM's names."""

    def __init__(self, r: CollectorRegistry, model: str, max_model_len: int, ttft: Histogram,
                 tbt: Histogram) -> None:
        m = ["model_name"]

        def gauge(name, doc):
            return Gauge(name, doc, m, registry=r).labels(model)

        def counter(name, doc):
            return Counter(name, doc, m, registry=r).labels(model)

        def hist(name, doc, buckets):
            return Histogram(name, doc, m, registry=r, buckets=buckets).labels(model)

        toks = one_two_five(max_model_len)
        self.running = gauge("vllm:num_requests_running", "Requests in an engine or in KV transfer")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting for an engine or for KV memory")
        self.kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage of the live workers; 1 means 100 percent")
        self.gpu_kv = gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (vLLM v0's name); 1 means 100 percent")
        self.prompt = counter("vllm:prompt_tokens", "Prompt tokens of requests that got their first token")
        self.generation = counter("vllm:generation_tokens", "Output tokens handed to clients")
        self.preemptions = counter("vllm:num_preemptions", "Decodes preempted by the workers' engines")
        self.cache_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the workers' prefix "
                                       "caches (each prompt as its prefill starts)")
        self.cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the workers' prefix caches")
        success = Counter("vllm:request_success", "Completed requests", ["model_name", "finished_reason"], registry=r)
        self.success = {reason: success.labels(model, reason) for reason in REASONS}
        self.iteration = hist("vllm:iteration_tokens_total", "Tokens per engine step", ITER)
        for source, name, doc in ((ttft, "vllm:time_to_first_token_seconds", "Time to first token"),
                                  (tbt, "vllm:inter_token_latency_seconds", "Time between tokens"),
                                  (tbt, "vllm:time_per_output_token_seconds", "Time between tokens (earlier name)")):
            r.register(Alias(source, name, doc, {"model_name": model}))
        self.req_tpot = hist("vllm:request_time_per_output_token_seconds", "Mean time per output token of a "
                               "request after its first", GAP)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to last token", REQ)
        self.queue = hist("vllm:request_queue_time_seconds", "Arrival to the first engine step holding the "
                            "request's prompt", REQ)
        self.prefill = hist("vllm:request_prefill_time_seconds", "Scheduled to first token", REQ)
        self.decode = hist("vllm:request_decode_time_seconds", "First token to last token", REQ)
        self.inference = hist("vllm:request_inference_time_seconds", "Scheduled to last token", REQ)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per request", toks)
        self.req_generation = hist("vllm:request_generation_tokens", "Output tokens per request", toks)
        self.max_tokens = hist("vllm:request_params_max_tokens", "max_tokens per request", toks)

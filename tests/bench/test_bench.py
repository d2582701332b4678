"""`splitserve bench` against a TEST DOUBLE of the server (tests/bench/fake_server.py, not the
real `splitserve serve`): known delays in, the same numbers out."""

import json
import time

import numpy as np
import pytest

from fake_server import FakeServer, running
from splitserve.bench.plan import Caps, PromptMaker, plan_requests
from splitserve.bench.run import BenchOptions, run_bench
from splitserve.workload import make_workload

FIRST, GAP = 0.050, 0.010          # the double's first-token delay and token gap
SLACK = 0.025   # client + double overhead on one busy machine: measured 1-3 ms idle, up to 13 ms
                # with two CPU burners on the 2-core dev box
CAPS = dict(max_prompt_tokens=16, max_tokens_cap=8)


def bench(fake, tmp_path=None, **kw):
    opts = dict(workload="coding", rps=20, duration=3, seed=0, **CAPS)
    opts.update(kw)
    return run_bench(BenchOptions(url=f"http://127.0.0.1:{fake.port}", out=tmp_path, **opts),
                     return_records=True)


def test_latencies_match_the_known_delays(tmp_path):
    with running(FakeServer(first_token_s=FIRST, token_gap_s=GAP)) as fake:
        s, recs = bench(fake, tmp_path)
    planned = list(plan_requests(make_workload("coding", rps=20, duration=3, seed=0),
                                 Caps(16, 8)))
    n = len(planned)
    assert n > 40 and s["requests"] == n == s["completed"] and s["failed"] == 0
    assert s["bench"]["rejected"] == 0 and s["bench"]["errors"] == {}

    # every request got exactly max_tokens tokens
    assert [r.tokens for r in recs] == [p.max_tokens for p in planned]
    assert s["tokens_generated"] == sum(p.max_tokens for p in planned)
    assert s["bench"]["short_outputs"] == 0 and s["bench"]["usage_mismatch"] == 0

    # TTFT = 50 ms, every TBT gap = 10 ms, E2E = 50 + 10 (max_tokens - 1) ms, at the client
    ttft, tbt, e2e = s["ttft_s"], s["tbt_s"], s["e2e_s"]
    assert FIRST <= ttft["p50"] < FIRST + SLACK, ttft
    assert ttft["p90"] < FIRST + 2 * SLACK, ttft
    assert GAP * 0.9 < tbt["p50"] < GAP * 1.2, tbt
    assert tbt["mean"] == pytest.approx(GAP, rel=0.1)           # deadlines: gaps do not drift
    assert tbt["p99"] < GAP + 4 * SLACK, tbt                  # a rare stall of a busy CI host
    excess = np.array([r.e2e - (FIRST + GAP * (r.max_tokens - 1)) for r in recs])
    assert 0 <= np.median(excess) < SLACK, excess
    assert np.quantile(excess, 0.9) < 2 * SLACK, excess
    assert e2e["p50"] == pytest.approx(np.median([r.e2e for r in recs]), rel=0.01)

    # what the server saw: capped sizes, token-id prompts in range, greedy, ignore_eos, model
    bodies = sorted(fake.bodies, key=lambda b: len(b["prompt"]))   # order-free comparison
    assert sorted(len(b["prompt"]) for b in fake.bodies) == sorted(p.prompt_tokens for p in planned)
    assert sorted(b["max_tokens"] for b in fake.bodies) == sorted(p.max_tokens for p in planned)
    for b in bodies:
        assert b["stream"] is True and b["temperature"] == 0 and b["ignore_eos"] is True
        assert b["model"] == "fake-model"                  # from GET /v1/models
        assert all(isinstance(t, int) and 1 <= t <= 255 for t in b["prompt"])

    # summary.json and requests.jsonl on disk
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(x)["index"] for x in lines] == list(range(n))


def test_sends_follow_the_workload_arrivals_open_loop():
    # a slow server (first token after 1 s): a closed-loop client would fall behind at once
    with running(FakeServer(first_token_s=1.0, token_gap_s=GAP)) as fake:
        s, recs = bench(fake, rps=25, duration=2, seed=3)
    wl = [r for r in make_workload("coding", rps=25, duration=2, seed=3)]
    sched = np.array([r.arrival for r in wl])
    seen = np.sort(np.array(fake.arrivals))
    assert len(seen) == len(sched) == s["requests"] == s["completed"] > 30
    # server clock vs the simulator's schedule, less the constant transport delay
    dev = (seen - sched) - np.median(seen - sched)
    # most sends on schedule; none anywhere near the 1 s a closed-loop client would lose
    assert np.quantile(np.abs(dev), 0.8) < 2 * SLACK, np.abs(dev)
    assert np.abs(dev).max() < 0.5, np.abs(dev).max()
    assert s["bench"]["send_lag_s"]["p50"] < SLACK and s["bench"]["send_lag_s"]["p99"] < 0.5
    # open loop: at the last arrival, about rps * 1 s requests were still waiting for tokens
    ends = np.array([r.end for r in recs])
    in_flight_at_last = int(np.sum(ends > sched[-1]))
    assert in_flight_at_last >= 10
    # same sizes as the simulator sees (capped), in arrival order
    assert [(r.prompt_tokens, r.max_tokens) for r in recs] == \
           [(min(w.prompt_tokens, 16), min(w.output_tokens, 8)) for w in wl]
    assert s["offered_rps"] == pytest.approx((len(wl) - 1) / (sched[-1] - sched[0]))
    assert 1.0 <= s["ttft_s"]["p50"] < 1.0 + SLACK


def prompt_index(seed, rps, duration, caps):
    """prompt token ids -> request index: the bench's prompts are reproducible from its seed."""
    maker = PromptMaker(seed)
    planned = plan_requests(make_workload("coding", rps=rps, duration=duration, seed=seed), caps)
    return {tuple(maker(p.prompt_tokens)): p for p in planned}


def test_rejections_errors_and_dropped_streams_are_accounted():
    kinds = ["ok", "reject", "drop", "error", "unavailable"]
    plan = prompt_index(0, 20, 2, Caps(16, 6))
    kind_of = {p.index: kinds[p.index % 5] for p in plan.values()}
    # a drop after 2 tokens only shows when the request asks for more
    assert all(p.max_tokens > 2 for p in plan.values() if kind_of[p.index] == "drop")

    def behaviour(n, body):
        return kind_of[plan[tuple(body["prompt"])].index]

    with running(FakeServer(behaviour=behaviour, drop_after=2)) as fake:
        s, recs = bench(fake, rps=20, duration=2, max_tokens_cap=6)
    n = s["requests"]
    assert n == len(plan) > 30
    per = {k: sum(1 for v in kind_of.values() if v == k) for k in kinds}
    b = s["bench"]
    assert s["completed"] == per["ok"]
    assert b["rejected"] == per["reject"] + per["unavailable"]
    assert b["rejected_by_status"] == {"429": per["reject"], "503": per["unavailable"]}
    assert s["failed"] == per["drop"] + per["error"]
    assert b["errors"] == {"stream_dropped": per["drop"], "http_500": per["error"]}
    assert s["completed"] + s["failed"] + b["rejected"] == n == len(recs)
    for r in recs:                                   # each request ended the way it was told
        want = {"ok": "completed", "reject": "rejected", "unavailable": "rejected"}.get(kind_of[r.index], "failed")
        assert r.outcome == want, r
        if kind_of[r.index] == "drop":
            assert r.reason.startswith("stream_dropped") and r.tokens == 2   # cut after 2 tokens
    # latencies only from completed requests
    assert FIRST <= s["ttft_s"]["p50"] < FIRST + SLACK
    assert s["tokens_generated"] == sum(r.tokens for r in recs)


def test_a_request_that_never_finishes_fails_by_timeout():
    with running(FakeServer(first_token_s=30.0)) as fake:
        t = time.perf_counter()
        s, recs = bench(fake, rps=5, duration=1, timeout=0.5)
        wall = time.perf_counter() - t
    assert s["requests"] == s["failed"] == len(recs) > 0 and s["completed"] == 0
    assert s["bench"]["errors"] == {"timeout": s["requests"]}
    assert wall < 1 + 0.5 + 1.0                    # last arrival + timeout + slack
    assert s["ttft_s"]["p50"] is None and s["throughput_rps"] == 0.0


def test_tokens_are_counted_from_chunks_without_usage():
    with running(FakeServer(send_usage=False)) as fake:
        s, recs = bench(fake, rps=10, duration=1)
    assert s["completed"] == s["requests"] > 0
    assert [r.tokens for r in recs] == [r.max_tokens for r in recs]


def test_summary_has_the_simulators_names(tmp_path):
    from splitserve.sim.run import run_simulation

    sim = run_simulation(duration=5, rps=2)
    with running(FakeServer()) as fake:
        live, _ = bench(fake, tmp_path, rps=20, duration=1)
    # what a client cannot observe: queueing inside the server, KV transfers, the sim's own stats
    assert set(sim) - set(live) == {"queue_s", "kv_transfer", "sim"}
    # the live extras: bench's own counts and vLLM's names (added beside the shared ones, none renamed)
    vllm = {"tpot_s", "total_input_tokens", "total_output_tokens", "input_throughput", "output_throughput",
            "total_token_throughput", "request_goodput", "goodput"}
    vllm |= {f"{s}_{m}_ms" for s in ("mean", "median", "p50", "p90", "p99") for m in ("ttft", "tpot", "itl", "e2el")}
    # prefix_cache: the simulator writes it for workloads that share prefixes only, bench whenever
    # prompt tokens were sent (the server's cache is looked up for every prompt)
    assert set(live) - set(sim) == {"bench", "prefix_cache"} | vllm
    assert live["prefix_cache"]["queries"] == live["total_input_tokens"] and live["prefix_cache"]["hits"] == 0
    for key in ("ttft_s", "tbt_s", "e2e_s", "workload"):
        assert set(live[key]) == set(sim[key]), key
    for key in ("requests", "completed", "failed", "throughput_rps", "offered_rps", "tokens_generated"):
        assert type(live[key]) is type(sim[key]) or {type(live[key]), type(sim[key])} <= {int, float}
    assert live["workload"] == {"name": "coding", "rps": 20.0, "duration_s": 1.0}
    assert {"met"} <= set(live["slo"]) and live["slo"]["met"] is None
    assert {"cost_per_hour", "power_kw"} <= set(live["cluster"])
    assert {"url", "rejected", "errors", "wall_s"} <= set(live["bench"])


def test_a_stream_without_tokens_fails_and_is_still_accounted():
    with running(FakeServer(behaviour=lambda n, body: "ok")) as fake:
        # the double answers 200 and [DONE] with no token chunk in between
        fake_stream = fake._stream

        async def empty(t0, body, what):
            async for line in fake_stream(t0, {**body, "max_tokens": 0}, what):
                yield line
        fake._stream = empty
        s, recs = run_bench(BenchOptions(url=f"http://127.0.0.1:{fake.port}", rps=10, duration=1,
                                         max_tokens_cap=4), return_records=True)
    assert s["requests"] == s["failed"] == len(recs) > 0
    assert s["bench"]["errors"] == {"no_tokens": s["requests"]}

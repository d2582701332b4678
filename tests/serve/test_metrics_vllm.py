"""/metrics in vLLM's names (serve/metrics.py) and the router's stats lines (serve/stats_log.py),
on a real `splitserve serve --model tiny`: exact token sums, counts and labels after known
requests, KV usage while a prefill runs and back at 0, the stats log's numbers."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


from .conftest import Server, complete, start_server, stop_server

PROMPTS = [[(5 * i + 7 * j) % 250 + 3 for j in range(n)] for i, n in enumerate([5, 9, 17, 33, 20])]
MAX_TOKENS = [4, 7, 2, 10, 5]          # ignore_eos: each request makes exactly this many tokens
LINE = re.compile(r"router: (\w+) pool \((\d+)/(\d+) workers up\): Avg prompt throughput: ([\d.]+) tokens/s, "
                  r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs, "
                  r"KV cache usage: ([\d.]+)% \((\d+) prompt tokens, (\d+) generated tokens in ([\d.]+) s\)")


def start_logged(log_path, *args: str, timeout: float = 60.0) -> Server:
    return start_server(*args, timeout=timeout, log_path=log_path)


def samples(srv: Server) -> dict[tuple[str, str], float]:
    """(name, the label text inside {}) -> value, every sample of one scrape."""
    out = {}
    for line in httpx.get(srv.url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            name, _, labels = key.partition("{")
            out[(name, labels.rstrip("}"))] = float(val)
    return out


def run_known(srv: Server) -> None:
    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS)):
                status, toks, body = await complete(client, srv.url, p, m, stream=i % 2 == 0, ignore_eos=True)
                assert status == 200 and len(toks) == m, body
    asyncio.run(go())


@pytest.fixture(scope="module")
def logged_split(tmp_path_factory):
    """1 prompt + 1 token worker, KV layer by layer, a stats line every second, its log in a file."""
    log = tmp_path_factory.mktemp("metrics") / "server.log"
    srv = start_logged(log, "--prompt-workers", "1", "--token-workers", "1", "--layerwise-threshold", "0",
                       "--log-stats-interval", "1")
    run_known(srv)
    srv.wait_settled()
    yield srv, log
    stop_server(srv)


def test_vllm_counters_and_histograms_are_exact_after_known_requests(logged_split):
    srv, _ = logged_split
    n, prompt, gen = len(PROMPTS), sum(map(len, PROMPTS)), sum(MAX_TOKENS)   # 5, 84, 28
    assert (n, prompt, gen) == (5, 84, 28)
    s = samples(srv)
    m = 'model_name="tiny"'
    assert s[("vllm:prompt_tokens_total", m)] == prompt
    assert s[("vllm:generation_tokens_total", m)] == gen
    assert s[("vllm:request_success_total", 'finished_reason="length",' + m)] == n
    assert s[("vllm:request_success_total", 'finished_reason="stop",' + m)] == 0
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_decode_time_seconds",
              "request_prompt_tokens", "request_generation_tokens", "request_params_max_tokens",
              "request_time_per_output_token_seconds"):       # every request made >= 2 tokens
        assert s[(f"vllm:{h}_count", m)] == n, h
        assert s[(f"vllm:{h}_bucket", 'le="+Inf",' + m)] == n, h
    # a request whose first token overtook its step report (kv_in first) has no queue time, unless
    # its worker shares the router's clock (tests/serve/test_step_clock.py); a report read after its
    # request ended (on a busy host: seen in CI with both cores busy) places nothing either: unseen
    unseen = s[("splitserve_requests_schedule_unseen_total", "")]
    for h in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_inference_time_seconds"):
        assert s[(f"vllm:{h}_count", m)] + unseen == n, h
    assert s[("vllm:request_prompt_tokens_sum", m)] == prompt
    assert s[("vllm:request_generation_tokens_sum", m)] == gen
    assert s[("vllm:request_params_max_tokens_sum", m)] == gen
    # every gap between a request's tokens: 28 - 5 of them, under both names and splitserve's
    for h in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert s[(h + "_count", m)] == gen - n
    assert s[("splitserve_tbt_seconds_count", "")] == gen - n
    assert s[("splitserve_e2e_seconds_count", "")] == n and s[("splitserve_ttft_seconds_count", "")] == n
    # the gaps are the decode time, inference = prefill + decode, queue + inference = e2e (to 1 ms)
    sums = {h: s[(f"vllm:request_{h}_time_seconds_sum", m)] for h in ("queue", "prefill", "decode", "inference")}
    assert s[("vllm:inter_token_latency_seconds_sum", m)] == pytest.approx(sums["decode"], abs=1e-9)
    assert sums["inference"] == pytest.approx(sums["prefill"] + sums["decode"], abs=1e-9)
    assert sums["queue"] + sums["inference"] <= s[("vllm:e2e_request_latency_seconds_sum", m)]
    if not unseen:
        assert s[("vllm:e2e_request_latency_seconds_sum", m)] < sums["queue"] + sums["inference"] + n * 1e-3
    # engine steps: the prompt pool prefilled 84 tokens (5 first tokens end prefills, no decode
    # token), the token pool decoded the other 23, one token a step each
    assert s[("vllm:iteration_tokens_total_sum", m)] == prompt + gen - n
    assert s[("splitserve_prompt_tokens_computed_total", 'pool="prompt"')] == prompt
    assert ("splitserve_prompt_tokens_computed_total", 'pool="token"') not in s
    assert s[("splitserve_tokens_generated_total", 'pool="prompt"')] == n
    assert s[("splitserve_tokens_generated_total", 'pool="token"')] == gen - n
    assert s[("splitserve_kv_transfers_total", 'mode="layerwise"')] == n
    assert s[("splitserve_kv_transfer_time_seconds_count", 'mode="layerwise"')] == n
    assert s[("splitserve_kv_transfer_time_seconds_sum", 'mode="layerwise"')] == \
        s[("splitserve_kv_transfer_seconds_total", 'mode="layerwise"')]
    assert s[("vllm:num_preemptions_total", m)] == 0


def test_every_vllm_sample_names_the_model_and_no_created_series(logged_split):
    srv, _ = logged_split
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    assert "_created" not in text
    vllm = [line for line in text.splitlines() if line.startswith("vllm:")]
    assert len(vllm) > 100
    for line in vllm:
        assert re.search(r'[{,]model_name="tiny"[,}]', line), line


def test_kv_usage_and_running_while_a_prefill_runs_then_zero(server_factory):
    """A 33-token prompt whose prefill is held ~1 s per layer (--debug-layer-delay, layer-wise
    transfer): meanwhile it runs on the prompt pool and its token worker has reserved its prompt's
    3 blocks of 64 (heartbeats); after it, every usage gauge is 0 and nothing runs or waits."""
    srv = server_factory("--num-blocks", "64", "--layerwise-threshold", "0", "--debug-layer-delay", "1.0",
                         "--log-stats-interval", "0")
    m = 'model_name="tiny"'

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            task = asyncio.create_task(complete(client, srv.url, PROMPTS[3], 6, stream=False, ignore_eos=True))
            seen = None
            for _ in range(100):
                await asyncio.sleep(0.05)
                s = await asyncio.to_thread(samples, srv)
                if s[("splitserve_kv_blocks_in_use", 'worker="1"')] == 3:
                    seen = s
                    break
            status, toks, _ = await task
            assert status == 200 and len(toks) == 6
            return seen

    s = asyncio.run(go())
    assert s is not None, "the token worker's reservation never showed"
    assert s[("vllm:num_requests_running", m)] == 1 and s[("vllm:num_requests_waiting", m)] == 0
    assert s[("splitserve_requests_running", 'pool="prompt"')] == 1
    assert s[("splitserve_requests_running", 'pool="token"')] == 0
    assert s[("splitserve_kv_cache_usage_perc", 'pool="token"')] == 3 / 64
    assert s[("splitserve_worker_kv_cache_usage_perc", 'worker="1"')] == 3 / 64
    used = s[("splitserve_kv_blocks_in_use", 'worker="0"')] + 3
    assert s[("vllm:kv_cache_usage_perc", m)] == s[("vllm:gpu_cache_usage_perc", m)] == used / 128
    assert 0 < used / 128 <= 1
    srv.wait_settled()
    time.sleep(0.5)  # the workers' next heartbeats
    s = samples(srv)
    for key in [("vllm:kv_cache_usage_perc", m), ("vllm:gpu_cache_usage_perc", m), ("vllm:num_requests_running", m),
                ("vllm:num_requests_waiting", m)] + \
            [(g, f'pool="{p}"') for g in ("splitserve_kv_cache_usage_perc", "splitserve_requests_running",
                                          "splitserve_requests_waiting") for p in ("prompt", "token", "mixed")]:
        assert s[key] == 0, key


def test_stats_log_lines_carry_each_pools_exact_work(logged_split):
    """The router's lines (one a second here) add up to the known requests' work per pool: the
    prompt pool prefilled 84 tokens and made the 5 first tokens, the token pool made the other
    23; each line's throughput is its tokens over its seconds; idle again at the end."""
    srv, log = logged_split

    def parsed():
        got = [LINE.fullmatch(x[x.index("router: "):]) for x in log.read_text().splitlines()
               if "Avg prompt throughput" in x]   # the log record's message (after its time, level, logger)
        assert None not in got, log.read_text()
        return [(g[0], *g.groups()) for g in got]   # x[i]: group i

    def idle(x) -> bool:
        return x[6:8] == ("0", "0") and x[9:11] == ("0", "0") and x[8] == "0.0"

    deadline = time.monotonic() + 10
    while True:
        lines = parsed()
        tot = {p: [sum(int(x[9]) for x in lines if x[1] == p), sum(int(x[10]) for x in lines if x[1] == p)]
               for p in ("prompt", "token")}
        if len(lines) >= 2 and idle(lines[-1]) and idle(lines[-2]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert tot == {"prompt": [84, 5], "token": [0, 23]}
    assert [x[1] for x in lines] == ["prompt", "token"] * (len(lines) // 2)
    for x in lines:
        assert (x[2], x[3]) == ("1", "1")
        secs = float(x[11])
        assert 0.9 <= secs <= 3.0, x[0]   # one interval of 1 s (the event loop may be late)
        assert float(x[4]) == pytest.approx(int(x[9]) / secs, abs=0.06 + int(x[9]) / secs * 0.05)
        assert float(x[5]) == pytest.approx(int(x[10]) / secs, abs=0.06 + int(x[10]) / secs * 0.05)
        assert 0 <= float(x[8]) <= 100
    # an idle interval is logged once, then nothing until there is work (2 more intervals here)
    pairs = [idle(a) and idle(b) for a, b in zip(lines[::2], lines[1::2])]
    assert pairs[-1] and not any(x and y for x, y in zip(pairs, pairs[1:]))
    time.sleep(2.5)
    assert len(parsed()) == len(lines)


def test_no_stats_lines_with_interval_zero_and_a_negative_one_is_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "splitserve.cli", "serve", "--model", "tiny", "--port", "0",
                        "--log-stats-interval", "-1"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == ["error: --log-stats-interval must be >= 0 seconds (0: off), got -1"]
    log = tmp_path / "server.log"
    srv = start_logged(log, "--design", "baseline", "--mixed-workers", "1", "--log-stats-interval", "0")
    try:
        run_known(srv)
        srv.wait_settled()
        s = samples(srv)
        assert s[("splitserve_prompt_tokens_computed_total", 'pool="mixed"')] == 84
        assert s[("splitserve_tokens_generated_total", 'pool="mixed"')] == 28
        # one mixed worker: its steps prefilled 84 tokens and decoded 28 - 5 (first tokens end prefills)
        assert s[("vllm:iteration_tokens_total_sum", 'model_name="tiny"')] == 84 + 23
        time.sleep(1.5)
    finally:
        stop_server(srv)
    assert "Avg prompt throughput" not in log.read_text()


PROMQL_WORDS = {"sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "by",
                "without", "on", "ignoring", "and", "or", "unless", "offset", "bool"}


def promql_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers without the label matchers
    ({...}), the ranges ([...]), the grouping labels (by (...)), numbers and PromQL's words."""
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr)) - PROMQL_WORDS
    return names


def exported_names(text: str) -> set[str]:
    """Every series name /metrics declares (# TYPE: a labelled metric may have no series yet) or
    serves."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            names |= {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
        elif line and not line.startswith("#"):
            names.add(line.split("{")[0].split(" ")[0])
    return names


def test_grafana_dashboard_reads_only_metrics_the_server_exports(logged_split):
    """docs/grafana/splitserve.json: an importable dashboard (a Prometheus datasource variable, every
    panel on it) whose every PromQL expression reads only series a real server exports."""
    srv, _ = logged_split
    dash = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana" / "splitserve.json").read_text())
    var = {v["name"]: v for v in dash["templating"]["list"]}
    assert var["datasource"]["type"] == "datasource" and var["datasource"]["query"] == "prometheus"
    exported = exported_names(httpx.get(srv.url + "/metrics", timeout=10).text)
    used, titles = set(), []
    for panel in dash["panels"]:
        titles.append(panel["title"])
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for t in panel["targets"]:
            names = promql_metrics(t["expr"])
            assert names, t["expr"]
            assert names <= exported, (panel["title"], names - exported)
            used |= names
    assert promql_metrics('histogram_quantile(0.9, sum by (le) (rate(vllm:x_bucket{a="b"}[5m])))') == \
        {"vllm:x_bucket"}
    for must in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                 "vllm:request_prefill_time_seconds_bucket", "vllm:request_decode_time_seconds_bucket",
                 "vllm:request_success_total", "vllm:generation_tokens_total", "splitserve_kv_cache_usage_perc",
                 "splitserve_worker_kv_cache_usage_perc", "splitserve_kv_transfer_time_seconds_bucket",
                 "splitserve_kv_transfer_bytes_total", "splitserve_worker_up", "vllm:num_preemptions_total",
                 "splitserve_instance_flips_total"):
        assert must in used, must
    assert len(titles) == len(set(titles)) == 18


def test_preemptions_counted_from_step_reports_equal_the_engines_own_count(server_factory):
    """test_lossless's case (KV reserved): one mixed worker of 40 blocks, a long request decoding, four
    prompts of 9 blocks each arriving: its engine preempts the long decode (recomputed later). The
    router's count from the step reports equals the engine scheduler's own (its heartbeat), and
    the tokens handed to clients are counted once: 480 + 4 x 8."""
    srv = server_factory("--design", "baseline", "--mixed-workers", "1", "--num-blocks", "40",
                         "--preemption-limit", "3", "--log-stats-interval", "0", "--kv-allocation", "reserve")
    long_prompt = [(7 * i) % 250 + 3 for i in range(20)]
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 259) for _ in range(130)] for _ in range(4)]

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": long_prompt, "max_tokens": 480, "temperature": 0, "stream": True, "ignore_eos": True}
            others, n = None, 0
            async with client.stream("POST", srv.url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    n += sum(len(c["token_ids"]) for c in json.loads(line[6:])["choices"])
                    if n and others is None:
                        others = [asyncio.create_task(complete(client, srv.url, p, 8, stream=False, ignore_eos=True))
                                  for p in prompts]
            res = await asyncio.gather(*others)
            assert n == 480 and all(st == 200 and len(t) == 8 for st, t, _ in res)

    asyncio.run(go())
    st = srv.wait_settled()
    (w,) = st["workers"]
    s = samples(srv)
    m = 'model_name="tiny"'
    assert w["preempted"] > 0
    assert s[("vllm:num_preemptions_total", m)] == w["preempted"]
    assert s[("vllm:generation_tokens_total", m)] == 480 + 32
    assert s[("vllm:prompt_tokens_total", m)] == 20 + 4 * 130
    # each recompute prefills the long prompt and the tokens it had made again
    assert s[("splitserve_prompt_tokens_computed_total", 'pool="mixed"')] > 20 + 4 * 130 + w["preempted"] * 20
    assert s[("splitserve_tokens_generated_total", 'pool="mixed"')] == 480 + 32

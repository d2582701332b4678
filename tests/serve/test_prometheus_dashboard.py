"""The Grafana dashboard's queries (docs/grafana/splitserve.json) evaluated by a real Prometheus
server scraping a real `splitserve serve --model tiny`: every expression is valid PromQL once
Grafana's variables are filled in, the panels that must show data do, and the figures equal what
the server was asked to do (the 5 known requests of test_metrics_vllm: 84 prompt and 28 generated
tokens). A quantile panel may hold a NaN series (a histogram that saw nothing in the window:
Grafana draws a gap), never only NaN where this run made data. Prometheus is not a Python package: this runs where `prometheus` is on PATH (Debian:
`apt-get install prometheus`) and skips elsewhere, saying so."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from .conftest import free_port, start_server, stop_server
from .test_metrics_vllm import MAX_TOKENS, PROMPTS, run_known

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="the Prometheus server is not installed "
                                "(Debian: apt-get install prometheus); it evaluates the dashboard's queries")
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "splitserve.json"
# what Grafana puts in place of its variables: the model picked, a rate window of 4+ scrapes
VARIABLES = {"$model_name": "tiny", "$__rate_interval": "1m"}
# series that exist only once something happened that this run does not do (a rejection, a failed
# or restarted request, a flip); their queries must still be valid PromQL
MAY_BE_EMPTY = ("splitserve_rejected_total", 'outcome!="completed"', "splitserve_instance_flips_total")


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A 1P+1T server (KV layer by layer) that served the 5 known requests, and a Prometheus that
    scraped it every 0.5 s from before the first request to after the last."""
    tmp = tmp_path_factory.mktemp("prometheus")
    srv = start_server("--prompt-workers", "1", "--token-workers", "1", "--layerwise-threshold", "0",
                       "--log-stats-interval", "0")
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 500ms\n  evaluation_interval: 500ms\n"
        "scrape_configs:\n  - job_name: splitserve\n    static_configs:\n"
        f"      - targets: ['{srv.url.removeprefix('http://')}']\n")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "prometheus.log", "wb"))
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 60
        while not up(api):
            assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus never scraped the server"
            time.sleep(0.2)
        time.sleep(1.5)                      # a few scrapes before the requests: rate() has a start
        run_known(srv)
        srv.wait_settled()
        time.sleep(2.5)                      # and a few after the last
        yield api
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        stop_server(srv)


def up(api: str) -> bool:
    try:
        targets = httpx.get(api + "/targets", timeout=2).json()["data"]["activeTargets"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return bool(targets) and all(t["health"] == "up" for t in targets)


def query(api: str, expr: str) -> list[dict]:
    r = httpx.get(api + "/query", params={"query": expr}, timeout=10).json()
    assert r["status"] == "success", (expr, r.get("error"))
    return r["data"]["result"]


def value(api: str, expr: str) -> float:
    (one,) = query(api, expr)
    return float(one["value"][1])


def filled(expr: str) -> str:
    for k, v in VARIABLES.items():
        expr = expr.replace(k, v)
    return expr


def test_every_dashboard_query_is_valid_promql_and_the_panels_show_data(scraped):
    dash = json.loads(DASHBOARD.read_text())
    exprs = [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) == 42
    empty = []
    for title, expr in exprs:
        result = query(scraped, filled(expr))          # the query parses and runs
        values = [float(s["value"][1]) for s in result]
        # a quantile of a histogram that saw nothing in the window is NaN (Grafana draws a gap):
        # here, the serialized KV transfers' (every transfer of this run went layer by layer)
        assert all(v >= 0 for v in values if not math.isnan(v)), (title, expr, result)
        assert all(math.isfinite(v) or "histogram_quantile" in expr for v in values), (title, expr, result)
        if not any(math.isfinite(v) for v in values):
            empty.append(expr)
    print("queries with no data:", empty)
    assert all(any(m in e for m in MAY_BE_EMPTY) for e in empty), empty
    assert len(empty) <= 3


def test_the_dashboards_figures_equal_what_the_server_did(scraped):
    model = '{model_name="tiny"}'
    assert value(scraped, f"vllm:prompt_tokens_total{model}") == sum(map(len, PROMPTS)) == 84
    assert value(scraped, f"vllm:generation_tokens_total{model}") == sum(MAX_TOKENS) == 28
    assert value(scraped, 'vllm:request_success_total{model_name="tiny",finished_reason="length"}') == 5
    assert value(scraped, f"sum(rate(vllm:generation_tokens_total{model}[1m]))") > 0
    assert value(scraped, "sum(splitserve_worker_up)") == 2
    # the dashboard's TTFT P50: a quantile of the 5 requests' first-token times, under the slowest
    ttft = value(scraped, filled(next(t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
                                      if p["title"] == "Time to first token" for t in p["targets"])))
    assert 0 < ttft < 10
    assert value(scraped, "sum(vllm:time_to_first_token_seconds_count)") == 5
    # every prompt went to the token worker layer by layer: one transfer each
    assert value(scraped, 'sum(splitserve_kv_transfers_total{mode="layerwise"})') == 5
    assert value(scraped, "sum(vllm:num_preemptions_total)") == 0

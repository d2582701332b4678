"""`splitserve reproduce ecoserve` end to end at the tiny scale: the report's structure, its numbers
agree with results.json, and the direction of EcoServe against vLLM on Alpaca."""

import json

from splitserve.reproduce.ecoserve import reproduce_ecoserve
from splitserve.reproduce.ecoserve_experiments import TINY, sustained


def test_tiny_report(tmp_path):
    path = reproduce_ecoserve(tmp_path, scale="tiny", log=lambda m: None)
    text = path.read_text()
    for title in ("## Setup", "## Sustained rate at the same latency (Figure 10a-i)", "## Each point",
                  "## SLO satisfaction (Figure 10j-l)", "## Claims", "## Other differences"):
        assert title in text
    for png in ("curves.png", "gains.png"):
        assert (tmp_path / png).stat().st_size > 10_000 and f"]({png})" in text
    res = json.loads((tmp_path / "results.json").read_text())
    (d,) = res["datasets"]
    # 12 GB of OPT-13B KV (0.8192 MB a token) is 14,648 tokens; vLLM allocates it on demand (issue 41)
    # in whole 16-token blocks, 915 of them
    assert res["kv_tokens"] == 14_640
    assert d["rates"] == list(TINY.rates["alpaca"])
    eco, vllm = d["points"]["ecoserve"], d["points"]["vllm"]
    # the table row carries the paper's Alpaca range beside our gain, which matches results.json
    assert f"| {d['ecoserve_gain']['vllm']:.2f} | 1.13-2.14 |" in text
    assert d["ecoserve_gain"]["vllm"] == d["sustained"]["ecoserve"]["rate"] / d["sustained"]["vllm"]["rate"]
    # at the lowest rate both meet every SLO; at the highest EcoServe is faster per token than vLLM
    assert eco[0]["ssr"] == vllm[0]["ssr"] == 1.0
    assert eco[-1]["norm_latency"] < vllm[-1]["norm_latency"]
    assert all(p["preemptions"] == 0 for p in eco)


def test_sustained_rate_interpolates_and_censors():
    assert sustained((1.0, 2.0, 4.0), [0.1, 0.2, 0.6], 0.4) == (3.0, False)
    assert sustained((1.0, 2.0), [0.1, 0.2], 0.4) == (2.0, True)
    assert sustained((1.0, 2.0), [0.8, 0.9], 0.4) == (0.5, False)

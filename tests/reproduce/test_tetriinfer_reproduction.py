"""`splitserve reproduce tetriinfer` end to end at the tiny scale: the report's structure, its numbers
agree with results.json and the paper's data file, resource usage is counted per instance, and the
flip experiment's never-flip run does not flip."""

import json
import math

from splitserve.reproduce.tetriinfer import reproduce_tetriinfer
from splitserve.reproduce.tetriinfer_experiments import paper, simulate, specs


def test_tiny_report(tmp_path):
    path = reproduce_tetriinfer(tmp_path, scale="tiny", log=lambda m: None)
    text = path.read_text()
    for title in ("## Setup", "## TetriInfer against vLLM, five workloads (Figures 11-15)",
                  "## Arrival rate (not in the paper)", "## Instance flip under a load shift (§3.5)",
                  "## Claims", "## Counterfactuals: what moves the gaps"):
        assert title in text
    for png in ("workloads.png", "rates.png"):
        assert (tmp_path / png).stat().st_size > 10_000 and f"]({png})" in text
    res = json.loads((tmp_path / "results.json").read_text())
    pub = paper()
    assert [m["workload"] for m in res["main"]] == ["lpld", "lphd"]
    for m in res["main"]:
        v, t = m["vllm"], m["tetriinfer"]
        assert m["jct_cut"] == 1 - t["jct_s"] / v["jct_s"]
        assert m["perf_per_dollar"] == (v["jct_s"] * v["resource_s"]) / (t["jct_s"] * t["resource_s"])
        assert v["resource_s"] == v["makespan_s"]             # one instance: its runtime
        assert t["makespan_s"] < t["resource_s"] <= 2 * t["makespan_s"]   # two instances, each to its last work
        p = pub["workloads"][m["workload"]]
        # the row carries ours beside the paper's: JCT cut, then perf/$
        assert f"| {100 * m['jct_cut']:+.0f}% | {100 * p['jct']:+.0f}% |" in text
        assert f"| {m['perf_per_dollar']:.2f} | {p['perf_per_dollar']:.2f} |" in text
    never = next(r for r in res["flip"]["runs"] if r["flip_idle_s"] == math.inf)
    assert never["flips"] == []


def test_resource_usage_counts_each_instance():
    """Two requests at t = 0 on TetriInfer's 1 + 1 instances: the prefill instance's time ends at the
    later first token, before the makespan, the decode instance's at the last token (the makespan);
    vLLM's one instance (no preemption) counts its runtime."""
    reqs = specs("lpld", 2, 0, None)
    r = simulate("tetriinfer", reqs)
    assert r["instances"] == 2 and r["flips"] == []
    assert r["makespan_s"] < r["resource_s"] < 2 * r["makespan_s"]
    v = simulate("vllm", reqs)
    assert v["resource_s"] == v["makespan_s"] and v["preemptions"] == 0

"""`simulate --trace-out`: the Chrome trace holds every batch of every machine and every KV
transfer, agrees with the run's own counters, and keeps at most its bound."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_model
from splitserve.cluster.designs import make_cluster
from splitserve.sim.chrome_trace import MACHINES, TRANSFERS, ChromeTrace
from splitserve.sim.simulator import SimConfig, Simulation

from .strategies import request_specs


def test_the_bound_keeps_the_first_events_and_counts_the_rest(tmp_path):
    tr = ChromeTrace(max_events=2)
    tr.name(MACHINES, 0, "m0 prompt dgx-h100")
    tr.batch(0, 0.0, 0.5, 1000, 0, 0, 0)
    tr.batch(0, 0.5, 0.1, 0, 3, 3000, 0)
    tr.batch(0, 0.6, 0.2, 100, 3, 3003, 1)
    doc = json.loads(tr.write(tmp_path / "t.json").read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in events] == [("prompt", 0.0, 500000.0), ("decode", 500000.0, 100000.0)]
    assert doc["otherData"]["dropped_events"] == 1
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names[MACHINES, 0] == "m0 prompt dgx-h100" and names[MACHINES, None] == "machines"


@st.composite
def runs(draw):
    specs = draw(request_specs())
    design = draw(st.sampled_from(["splitwise-hh", "splitwise-ha", "baseline-h100"]))
    counts = dict(prompt_machines=draw(st.integers(1, 2)), token_machines=draw(st.integers(1, 2))) \
        if design.startswith("splitwise") else dict(machines=draw(st.integers(1, 3)))
    return specs, design, counts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_trace_is_the_runs_batches_and_transfers(tmp_path_factory, run):
    specs, design, counts = run
    trace = ChromeTrace()
    sim = Simulation(make_cluster(design, **counts), load_model("llama2-70b"), specs, SimConfig(trace=trace))
    result = sim.run()
    doc = json.loads(trace.write(tmp_path_factory.mktemp("t") / "trace.json").read_text())
    batches = [e for e in doc["traceEvents"] if e.get("cat") == "batch"]
    transfers = [e for e in doc["traceEvents"] if e.get("cat") == "transfer"]
    m = result.metrics
    assert len(transfers) == m.transfers
    assert sum(e["args"]["bytes"] for e in transfers) == m.transfer_bytes
    for mid, st_ in enumerate(m.machines):
        mine = sorted((e for e in batches if e["tid"] == mid), key=lambda e: e["ts"])
        assert len(mine) == st_.iterations
        assert abs(sum(e["dur"] for e in mine) / 1e6 - st_.busy_s) <= 1e-6 * max(1.0, st_.busy_s)
        assert sum(e["args"]["prompt_tokens"] for e in mine) == st_.prompt_tokens
        for a, b in zip(mine, mine[1:]):  # one batch at a time on a machine
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
        for e in mine:
            kinds = {"prompt": (True, False), "decode": (False, True), "mixed": (True, True)}[e["name"]]
            assert kinds == (e["args"]["prompt_tokens"] > 0, e["args"]["decodes"] > 0)
    for e in transfers:  # a transfer leaves its prompt machine for another machine
        assert e["pid"] == TRANSFERS and e["args"]["to"] != e["tid"] and e["dur"] >= 0

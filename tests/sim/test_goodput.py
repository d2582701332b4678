"""DistServe's SLO attainment (report/goodput.py): the rule by hand, and the simulator's count
equal to the rule applied to every recorded request."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_model
from splitserve.cluster.designs import make_cluster
from splitserve.report.goodput import GoodputSLO, attainment_summary
from splitserve.report.summary import simulation_summary
from splitserve.sim.simulator import SimConfig, Simulation

from .strategies import request_specs


def test_the_rule_by_hand():
    slo = GoodputSLO(ttft_s=0.2, tpot_s=0.05)
    assert slo.meets(0.2, 1.0, 1.0 + 9 * 0.05, 10)          # both exactly at their SLO
    assert not slo.meets(0.21, 1.0, 1.1, 10)                # TTFT late
    assert not slo.meets(0.1, 1.0, 1.0 + 9 * 0.051, 10)     # TPOT 51 ms
    assert slo.meets(0.1, 1.0, 1.0, 1)                      # one token: no TPOT
    s = attainment_summary(slo, attained=9, completed=10, requests=10)
    assert s["attainment"] == 0.9 and s["meets_target"]
    assert not attainment_summary(slo, attained=8, completed=9, requests=10)["meets_target"]
    with pytest.raises(ValueError):
        GoodputSLO(0.0, 0.1)


@st.composite
def runs(draw):
    specs = draw(request_specs())
    design = draw(st.sampled_from(["splitwise-hh", "baseline-h100"]))
    counts = dict(prompt_machines=1, token_machines=1) if design.startswith("splitwise") else dict(machines=1)
    slo = GoodputSLO(draw(st.sampled_from([0.1, 0.3, 1.0])), draw(st.sampled_from([0.02, 0.03, 0.05])))
    return specs, design, counts, slo


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_simulators_count_is_the_rule_over_every_request(run):
    specs, design, counts, slo = run
    sim = Simulation(make_cluster(design, **counts), load_model("llama2-70b"), specs,
                     SimConfig(record_requests=True, goodput=slo))
    result = sim.run()
    expect = 0
    for r in result.requests:
        times = r.token_times
        ttft = times[0] - r.arrival
        tpot = (times[-1] - times[0]) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        expect += ttft <= slo.ttft_s and tpot <= slo.tpot_s
    assert result.metrics.attained == expect
    g = simulation_summary(result, type("W", (), {"name": "w", "rps": 1.0, "duration": 1.0})(), goodput=slo)["goodput"]
    assert g["attained"] == expect and g["attainment"] == pytest.approx(expect / len(specs))

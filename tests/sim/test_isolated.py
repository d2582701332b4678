"""An isolated request reproduces the performance model's latencies on every machine kind
(the structure of the Splitwise paper's Table IV: P50 coding and conversation requests alone)."""

import pytest

from splitserve.catalog import load_hardware, load_model
from splitserve.cluster.designs import make_cluster
from splitserve.perf import make_perf_model
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec

# median coding and conversation requests (paper §III-A): 1500 prompt / 13 output, 1020 / 129
REQUESTS = {"coding": (1500, 13), "conversation": (1020, 129)}


@pytest.mark.parametrize("design", ["baseline-a100", "baseline-h100", "baseline-h200"])
@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_isolated_request_matches_perf_model(design, kind):
    prompt, out = REQUESTS[kind]
    model = load_model("llama2-70b")
    cluster = make_cluster(design, machines=1)
    hw = load_hardware(cluster.groups[0][0].hardware)
    perf, _ = make_perf_model(model, hw)
    sim = Simulation(cluster, model, [RequestSpec(0.0, prompt, out)], SimConfig(record_requests=True))
    (r,) = sim.run().requests
    ttft = perf.prompt_time(prompt)
    tbts = [perf.token_time(1, prompt + k) for k in range(1, out)]
    assert r.token_times[0] == pytest.approx(ttft, rel=1e-12)
    gaps = [b - a for a, b in zip(r.token_times, r.token_times[1:])]
    assert gaps == pytest.approx(tbts, rel=1e-9)
    assert r.token_times[-1] == pytest.approx(ttft + sum(tbts), rel=1e-12)


def test_isolated_split_request_adds_only_the_visible_transfer():
    model = load_model("llama2-70b")
    h100 = load_hardware("dgx-h100")
    perf, _ = make_perf_model(model, h100)
    sim = Simulation(make_cluster("splitwise-hh", prompt_machines=1, token_machines=1), model,
                     [RequestSpec(0.0, 1500, 13)], SimConfig(record_requests=True))
    result = sim.run()
    (r,) = result.requests
    visible = result.metrics.transfer_visible.hi
    assert r.token_times[0] == pytest.approx(perf.prompt_time(1500), rel=1e-12)
    # the second token waits for the non-overlapped part of the layer-wise transfer only
    assert r.token_times[1] - r.token_times[0] == pytest.approx(perf.token_time(1, 1501) + visible, rel=1e-9)
    assert 0 < visible < 0.01          # paper §VI-A: ~5 ms visible on H100 pairs

"""Hand-computed schedules: one prompt + one token machine, three requests, every token time
derived step by step from the performance model and the KV transfer model."""

import pytest

from splitserve.catalog import load_hardware, load_model
from splitserve.cluster.designs import make_cluster
from splitserve.perf import make_perf_model
from splitserve.sim.kv_transfer import layerwise_done, link_between, serialized_done
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec


def run(design, specs, **kw):
    cluster = make_cluster(design, **kw)
    sim = Simulation(cluster, load_model("llama2-70b"), specs, SimConfig(record_requests=True))
    result = sim.run()
    return result, {r.id: r for r in result.requests}


def test_splitwise_pair_three_requests():
    model = load_model("llama2-70b")
    h100 = load_hardware("dgx-h100")
    perf, _ = make_perf_model(model, h100)
    link = link_between(h100, h100)
    kvb = model.kv_bytes_per_token
    specs = [RequestSpec(0.0, 1000, 3), RequestSpec(0.001, 300, 2), RequestSpec(5.0, 100, 1)]
    result, rs = run("splitwise-hh", specs, prompt_machines=1, token_machines=1)

    # A: prefill alone on P from t=0; 1000 >= 512 tokens, so its KV streams layer by layer
    pA = perf.prompt_time(1000)
    xA = layerwise_done(link, 1000 * kvb, model.layers, 0.0, pA)
    # B arrived while P was busy: prefill from pA; 300 < 512 tokens: one-shot transfer after it
    eB = pA + perf.prompt_time(300)
    xB = serialized_done(link, 300 * kvb, eB)
    # T: A decodes alone (contexts 1001, 1002); B's KV lands during A's second step, so B joins
    # at the next iteration boundary, when A has finished
    d1, d2 = perf.token_time(1, 1001), perf.token_time(1, 1002)
    assert xA + d1 < xB < xA + d1 + d2, "the numbers no longer give the schedule this test checks"
    aDone = xA + d1 + d2
    bDone = aDone + perf.token_time(1, 301)
    # C: alone, one output token: its first token is its last, nothing moves to T
    cDone = 5.0 + perf.prompt_time(100)

    assert rs[0].token_times == pytest.approx([pA, xA + d1, aDone], rel=1e-12)
    assert rs[1].token_times == pytest.approx([eB, bDone], rel=1e-12)
    assert rs[2].token_times == pytest.approx([cDone], rel=1e-12)
    mt = result.metrics
    assert mt.completed == 3 and mt.transfers == 2 and mt.transfer_layerwise == 1
    # TTFT, TBT and E2E summaries over these three requests (nearest-rank, histogram within 0.05%)
    assert mt.ttft.mean == pytest.approx((pA + (eB - 0.001) + (cDone - 5.0)) / 3)
    gaps = [xA + d1 - pA, aDone - (xA + d1), bDone - eB]
    assert mt.tbt.n == 3 and mt.tbt.mean == pytest.approx(sum(gaps) / 3)
    assert mt.tbt.quantile(1.0) == pytest.approx(max(gaps), rel=5e-4)
    assert mt.e2e.mean == pytest.approx((aDone + (bDone - 0.001) + (cDone - 5.0)) / 3)
    # the visible part of A's layer-wise transfer is what followed the end of its prompt
    assert mt.transfer_visible.lo == pytest.approx(xA - pA)


def test_unsplit_machine_mixes_prompt_and_decodes():
    model = load_model("llama2-70b")
    perf, _ = make_perf_model(model, load_hardware("dgx-a100"))
    specs = [RequestSpec(0.0, 500, 3), RequestSpec(0.01, 200, 2)]
    _, rs = run("baseline-a100", specs, machines=1)
    p1 = perf.prompt_time(500)
    # B waited; it runs in a mixed batch with A's first decode (context 501)
    m1 = p1 + perf.mixed_time(200, 1, 501)
    # then both decode together: contexts 502 (A) + 201 (B)
    m2 = m1 + perf.token_time(2, 502 + 201)
    assert rs[0].token_times == pytest.approx([p1, m1, m2], rel=1e-12)
    assert rs[1].token_times == pytest.approx([m1, m2], rel=1e-12)

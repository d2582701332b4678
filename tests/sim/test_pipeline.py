"""Pipeline-parallel instances: batches go through the stages one after another, several in
flight, and a short batch waits behind a long one in a later stage (the bubble)."""

import pytest

from splitserve.catalog import kv_capacity_tokens, load_hardware, load_model
from splitserve.cluster.designs import Parallelism, make_cluster
from splitserve.perf import make_perf_model
from splitserve.perf.pipeline import HOP_LATENCY_S
from splitserve.policy.config import PolicyConfig
from splitserve.policy.machine import BatchingConfig
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec


def test_two_prompts_in_flight_then_decodes_wait_for_the_slow_stage():
    model, hw = load_model("llama2-70b"), load_hardware("dgx-h100")
    perf, _ = make_perf_model(model, hw, tp=4, pp=2)
    s = perf.stage_time(1000, 0, 0, 1000 ** 2)  # one prompt of 1000 tokens (its attention too), one stage
    h = perf.hop_time(0, 1000)                 # its activations to stage 2 (NVLink, one machine)
    d = perf.stage_time(0, 1, 1001)            # one decode over 1001 tokens of KV, one stage
    hd = perf.hop_time(0, 1)
    assert h == pytest.approx(HOP_LATENCY_S + 1000 * model.hidden * model.dtype_bytes / (4 * hw.nvlink_gbs * 1e9))
    assert d + hd < s                          # decodes are far shorter than the prompts' stages

    cluster = make_cluster("baseline-h100", machines=1, parallel=Parallelism(tp=4, pp=2))
    policy = PolicyConfig(batching=BatchingConfig(prompt_token_cap=1000))   # one prompt per batch
    specs = [RequestSpec(0.0, 1000, 2), RequestSpec(0.0, 1000, 2)]
    sim = Simulation(cluster, model, specs, SimConfig(policy=policy, record_requests=True))
    res = sim.run()
    a, b = sorted(res.requests, key=lambda r: r.id)
    # A: stage 1 [0, s], hop, stage 2 [s+h, 2s+h]: first token at 2s+h.
    # B starts when stage 1 frees at s: stage 1 [s, 2s], stage 2 waits for A: [2s+h, 3s+h].
    # A's decode starts at 2s+h: stage 1 [2s+h, 2s+h+d], then waits for B in stage 2: [3s+h, 3s+h+d].
    # B's decode at 3s+h: stage 1 [3s+h, 3s+h+d], hop hd, stage 2 free since 3s+h+d: ends 3s+h+2d+hd.
    assert a.token_times == pytest.approx([2 * s + h, 3 * s + h + d], rel=1e-9)
    assert b.token_times == pytest.approx([3 * s + h, 3 * s + h + 2 * d + hd], rel=1e-9)
    assert res.metrics.machines[0].busy_s == pytest.approx(2 * s + 2 * d, rel=1e-9)


def test_pipeline_alone_is_stages_plus_hops_and_pays_for_its_gpus():
    model, hw = load_model("opt-175b"), load_hardware("dgx-a100")
    one, _ = make_perf_model(model, hw, tp=4)
    two, _ = make_perf_model(model, hw, tp=4, pp=4)  # 16 GPUs: stages 0-1 on one machine, 2-3 on the next
    t = one.prompt_time(512)
    hops = [two.hop_time(i, 512) for i in range(3)]
    nv = 512 * model.hidden * model.dtype_bytes / (4 * hw.nvlink_gbs * 1e9)
    ib = 512 * model.hidden * model.dtype_bytes / (4 * hw.ib_gbs * 1e9)
    assert hops == pytest.approx([HOP_LATENCY_S + nv, HOP_LATENCY_S + ib, HOP_LATENCY_S + nv])
    assert two.prompt_time(512) == pytest.approx(t + sum(hops))
    # weights and KV spread over 16 GPUs: 4x the HBM, so far more KV than tp 4 alone (which cannot
    # even hold OPT-175B's 350 GB of weights)
    assert kv_capacity_tokens(model, hw, 4, 0.9, pp=4) > 0
    cluster = make_cluster("baseline-a100", machines=3, parallel=Parallelism(tp=4, pp=4))
    (inst, _, n), = cluster.groups
    assert (inst.name, inst.gpus, n) == ("dgx-a100/tp4pp4", 16, 3)


def test_energy_counts_the_instances_gpus_every_stage():
    """A tp 2 x pp 2 instance draws the watts of its 4 GPUs only: busy, each stage for its share of
    the batch; idle, every stage (the machine's other 4 GPUs are other instances')."""
    model, hw = load_model("llama2-13b"), load_hardware("dgx-a100")
    perf, power = make_perf_model(model, hw, tp=2, pp=2)
    assert power.idle_power_w() == pytest.approx(0.2 * hw.gpu_tdp_w * 2)        # 2 GPUs, none of the rest
    cluster = make_cluster("baseline-a100", machines=1, parallel=Parallelism(tp=2, pp=2))
    res = Simulation(cluster, model, [RequestSpec(0.0, 100, 1)], SimConfig()).run()
    stage, hop = perf.stage_time(100, 0, 0, 100 ** 2), perf.hop_time(0, 100)   # with its attention
    end = 2 * stage + hop
    assert res.sim_end == pytest.approx(end)
    busy = power.prompt_power_w(100) * 2 * stage                                # 2 GPUs per stage, 2 stages
    idle = power.idle_power_w() * 2 * (end - stage)                             # each stage idles end - stage
    assert res.metrics.machines[0].energy_j == pytest.approx(busy + idle)

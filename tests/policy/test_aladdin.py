"""Aladdin's cluster scheduler (policy/aladdin.py): a packing, a scaling decision and a correction
computed by hand, and invariants over random workloads in the simulator (oracle and noisy
predictors, workers scaled down and up while requests run)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_model
from splitserve.cluster.designs import Parallelism, make_cluster
from splitserve.policy.aladdin import AladdinScheduler
from splitserve.policy.aladdin_corrections import kv_peak
from splitserve.policy.aladdin_scaling import ACTIVE, DRAINING, OFF
from splitserve.policy.latency import LinearLatency
from splitserve.policy.cluster import RoutingConfig, admit
from splitserve.policy.config import PolicyConfig
from splitserve.policy.machine import BatchingConfig, finish_iteration
from splitserve.policy.schedulers import form_batch
from splitserve.policy.predictor import Prediction
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.report.summary import simulation_summary
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec, make_workload

# t_pre = 1 ms per prompt token; t_d = 1 ms per KV token + 10 ms per request (Eq. 2, Eq. 3)
LAT = LinearLatency(k1=0.001, c1=0.0, k2=0.001, c2=0.01, c3=0.0)


def cluster(n: int, cap: int, ttft: float, atgt: float, predictor: str = "oracle", window: float = 0.0):
    ms = [Machine(i, "x", home=Pool.MIXED, kv_capacity=cap) for i in range(n)]
    cfg = RoutingConfig(cluster_scheduler="aladdin", aladdin_ttft_slo=ttft, aladdin_atgt_slo=atgt,
                        predictor=predictor, scale_window=window)
    return ms, AladdinScheduler(ms, cfg, False, LAT)


def test_kv_peak_by_hand():
    # (remaining iterations, KV now): at k = 0: 30; k = 2: (10 + 2) + (20 + 2) = 34;
    # k = 5: 20 + 5 = 25: the peak is 34
    assert kv_peak([(5, 20), (2, 10)]) == 34
    # k = 60: 40 + 3 * 60 = 220; k = 100: 20 + 2 * 100 = 220; k = 150: 160
    assert kv_peak([(60, 20), (150, 10), (100, 10)]) == 220
    assert kv_peak([]) == 0


def test_packing_by_hand():
    """4 workers of 200 KV tokens, 2 active (2 and 3 scaled down: off); SLOs T_pre 0.15 s, T_dec
    0.25 s; oracle predictions. With LAT the constraints for a worker with the request added are
    (c) prompt tokens not yet prefilled <= 150, (b) sum(l_in + pred / 2) / 0.9 + 10 b <= 250,
    (e) the KV peak <= 200. Workers are tried by capacity_norm = |(b, sum(l_in + pred / 2))|,
    largest first (ties: lower id). Nothing runs, so every prompt stays queued.

    req (in, out)  tried: (c) (b) (e)                                        lands
    0   (40, 20)   0: 40 65.6 60 ok (0 and 1 empty: the lower id)               0
    1   (30, 40)   0 (norm 50): 70 131.1 110 ok                               0
    2   (50, 10)   0 (100): 120 202.2 150 ok                                  0
    3   (20, 60)   0 (155): 140 267.8 180: (b) fails; 1 (0): 20 65.6 80 ok    1
    4   (10, 150)  0 (155): 130 306.7 170: (b); 1 (50): 30 170 160 ok          1
    5   (10, 100)  0 (155): 130 278.9 170: (b); 1 (135): 40 246.7 220: (e)
                   alone (40 + 3 * 60 at iteration 60) -> a new bin: 2 (off) comes back 2
    6   (70, 10)   0: 190 295.6 230; 1: 100 263.3 160: (b); 2 (60): 80 170 110   2
    7   (80, 10)   0: 200 ...; 1 (135.01): 110 274.4 160: (b); 2 (135.01, after 1 by id):
                   160 274.4 190: (c), (b) -> a new bin: 3                      3
    8   (100, 10)  0, 1, 2 fail; 3 (85): 180 231.1 200: (c) alone; no worker left -> the least
                   loaded active one: 3 (norm 85 < 135 < 155)                   3
    """
    ms, s = cluster(4, 200, 0.15, 0.25)
    s.scaling.resize(Pool.MIXED, 2)
    assert [s.scaling.state[i] for i in range(4)] == [ACTIVE, ACTIVE, OFF, OFF]
    want = [0, 0, 0, 1, 1, 2, 2, 3, 3]
    reqs = [(40, 20), (30, 40), (50, 10), (20, 60), (10, 150), (10, 100), (70, 10), (80, 10), (100, 10)]
    got = []
    for i, (p, o) in enumerate(reqs):
        r = Request(i, 0.01 * i, p, o)
        assert admit(s, r)           # placed and queued (unsplit: prompt and token machine alike)
        assert r.prompt_machine == r.token_machine
        got.append(r.token_machine)
    assert got == want
    assert [s.scaling.state[i] for i in range(4)] == [ACTIVE] * 4 and s.scaling.opened == 2
    assert [m.queued_prompt_tokens for m in ms] == [120, 30, 80, 180]


def test_scaling_decision_by_hand():
    """Eq. 7 from the latency model. Mean prompt 50, mean predicted output 40, T_dec 0.25 s:
    B is the largest b with int(b * (50 + 40 / 2) / 0.9) ms + 10 b ms <= 250 ms: b = 2 (155 + 20);
    b = 3: 233 + 30 > 250. Its KV, 2 * (50 + 40 / 2) = 140, fits 2000. t_iter(2) = 2 * 70 ms +
    20 ms = 160 ms; a request takes 40 * 0.16 / 2 = 3.2 worker-seconds of decoding and 50 ms of
    prefill: 3.25 s. At 1.9 requests/s: ceil(6.175) = 7 workers."""
    ms, s = cluster(8, 2000, 10.0, 0.25, window=10.0)
    assert s.scaling.batch_limit(ms[0], 50, 40) == 2
    assert s.scaling.workers_needed(1.9, 50, 40) == {Pool.MIXED: 7}
    # arrivals every 0.5 s from 0.5 to 10.0 (prompt 50, output 40), each served to its end before
    # the next; at 10.5 the window holds those after 0.5: 19 in 10 s, 1.9/s: 7 of 8 workers stay
    # active; the least loaded goes (all are empty: the highest id, 7), idle: off at once
    for k in range(1, 21):
        admit(s, Request(k, 0.5 * k, 50, 40))
        run_to_end(ms, s)
    assert s.watch(10.5) == []
    assert s.scaling.estimate(10.5) == (1.9, 50.0, 40.0)
    assert [s.scaling.state[i] for i in range(8)] == [ACTIVE] * 7 + [OFF]
    r = Request(99, 10.6, 50, 40)      # placements go to active workers only
    admit(s, r)
    assert r.token_machine == 0
    # 6 arrivals from 21.0 to 23.5, kept running: best fit puts them on 0 (with 99), 1, 1, 2, 2, 3;
    # at 23.6 the window holds 6 in 10 s: ceil(0.6 * 3.25) = 2 workers; the 5 least loaded go:
    # 6, 5, 4 (empty: off), 3 (one request), then 2 (two, like 0 and 1: the highest id): draining
    for k in range(6):
        admit(s, Request(100 + k, 21.0 + 0.5 * k, 50, 40))
    s.watch(23.6)
    assert [s.scaling.state[i] for i in range(8)] == [ACTIVE, ACTIVE, DRAINING, DRAINING, OFF, OFF, OFF, OFF]
    for i in (2, 3):                   # a draining worker ends its work, then is off (its settle)
        m = ms[i]
        while m.has_work():
            finish_iteration(m, form_batch(m, BatchingConfig()))
            s.settle(m)
        assert s.scaling.state[i] == OFF
    # the rate rises: 29 arrivals in (30, 40]: ceil(2.9 * 3.25) = 10: all 8 come back (the
    # placements themselves open bins as they fill)
    for k in range(30):
        admit(s, Request(200 + k, 30.0 + k / 3, 50, 40))
    s.watch(40.0)
    assert all(st == ACTIVE for st in s.scaling.state.values())
    act = s.activity(40.0)
    assert act["scale_downs"] == 6 and act["machine_seconds"][0] == 40.0 - 0.5
    assert act["machine_seconds"][7] < 40.0 - 10.5


def run_to_end(ms, s) -> None:
    for m in ms:
        while m.has_work():
            finish_iteration(m, form_batch(m, BatchingConfig()))
            s.settle(m)


class Fixed:
    """A predictor that says 10 tokens for every request (a misprediction for longer ones)."""
    name = "fixed"

    def predict(self, rid: int, prompt_tokens: int, output_tokens: int) -> Prediction:
        return Prediction(10, 10)


def test_correction_after_a_misprediction():
    """2 workers of 1000 KV tokens, T_dec 0.25 s (T_pre 10 s: no TTFT limit in play); every
    request predicted at 10 tokens. A (prompt 100, really 50 tokens) goes to worker 0 (both empty:
    the lower id). After 10 steps (its prefill, then 9 decodes) A has made its 10 predicted tokens
    and goes on: settle predicts it again; no finished request is longer than 10 yet (fewer than
    MIN_HISTORY): twice 10 = 20. B (prompt 95, predicted 10) then reads on worker 0, with (b):
    int((100 + 20 / 2 + 95 + 10 / 2) / 0.9) = 233 ms + 2 * 10 ms = 253 ms > 250 ms: it goes to
    worker 1. Without the correction (A still at 10): int(205 / 0.9) = 227, + 20 = 247 <= 250: B
    would have joined A on worker 0. With a history of 12 finished lengths longer than 10 (six 30s,
    six 60s; five 5s below) a re-prediction at 10 is their mean, 45; at 30, with 6 longer, 60."""
    def start():
        ms, s = cluster(2, 1000, 10.0, 0.25)
        s.demand.predictor = Fixed()
        a = Request(0, 0.0, 100, 50)
        admit(s, a)
        return ms, s, a

    ms, s, a = start()
    assert a.token_machine == 0 and s.demand.pred[0] == 10
    m = ms[0]
    for _ in range(10):
        finish_iteration(m, form_batch(m, BatchingConfig()))
        s.settle(m)
    assert a.generated == 10 and a.phase is Phase.DECODE
    assert s.demand.pred[0] == 20 and s.demand.corrections == 1
    assert s.demand.load[0] == (1, 100 + 0.5 * 20, 100 + 20)
    b = Request(1, 1.0, 95, 10)
    admit(s, b)
    assert b.token_machine == 1

    ms2, s2, a2 = start()        # the same, before A outlives its prediction
    b2 = Request(1, 1.0, 95, 10)
    admit(s2, b2)
    assert b2.token_machine == 0

    for L in [5] * 5 + [30] * 6 + [60] * 6:
        s.demand.finished(Request(-1, 0.0, 1, L, generated=L))
    assert s.demand.repredict(10) == 45 and s.demand.repredict(29) == 45 and s.demand.repredict(30) == 60   # 6 longer: twice


@st.composite
def runs(draw):
    n = draw(st.integers(1, 50))
    t, specs = 0.0, []
    burst = draw(st.floats(0.02, 0.5))                # a heavy stretch, then a light one: scaling
    for i in range(n):
        t += draw(st.floats(0.0, burst if i < n // 2 else 2.0))
        specs.append(RequestSpec(t, draw(st.integers(1, 3000)), draw(st.integers(1, 300))))
    split = draw(st.booleans())
    counts = (dict(prompt_machines=draw(st.integers(1, 2)), token_machines=draw(st.integers(1, 3))) if split
              else dict(machines=draw(st.integers(1, 4))))
    predictor = draw(st.sampled_from(["oracle", "tetriinfer-100", "ecoserve-sharegpt"]))
    window = draw(st.sampled_from([0.0, 2.0, 5.0]))
    util = draw(st.sampled_from([0.225, 0.26, 0.9]))  # little KV memory: requests wait for it
    return specs, split, counts, predictor, window, util


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_random_runs_lose_nothing_and_never_overfill_kv(run):
    specs, split, counts, predictor, window, util = run
    routing = RoutingConfig(cluster_scheduler="aladdin", predictor=predictor, scale_window=window,
                            mixed_pool=not split)
    cfg = SimConfig(record_requests=True, memory_utilization=util, policy=PolicyConfig(routing=routing))
    design = "splitwise-aa" if split else "baseline-a100"
    sim = Simulation(make_cluster(design, **counts), load_model("llama2-70b"), specs, cfg)
    form = sim.form_batch   # (a batch former, not _start: the compiled Simulation's methods are fixed)

    def checked_form(m, cfg):         # memory after every scheduling decision
        batch = form(m, cfg)
        for x in sim.machines:
            assert 0 <= x.kv_used <= x.kv_capacity
            assert x.pending == x.recount_pending() >= 0
        return batch

    sim.form_batch = checked_form
    result = sim.run()                 # raises if any work is left anywhere
    assert result.metrics.completed == len(specs)
    for r, spec in zip(sorted(result.requests, key=lambda r: r.id), specs):
        assert r.phase is Phase.DONE and r.generated == spec.output_tokens == len(r.token_times)
    act = result.scaling
    assert set(act["machine_seconds"]) == {m.id for m in sim.machines}
    assert all(0.0 <= s <= result.sim_end for s in act["machine_seconds"].values())
    assert all(st.peak_kv_used <= st.kv_capacity for st in result.metrics.machines)


def test_a_rate_profile_scales_down_and_up_and_completes_everything():
    """2/s, then 10/s from 60 s, then 2/s from 120 s, on 16 llama2-13b workers (one A100 each):
    Aladdin keeps fewer on than the cluster has, scales down and back up, and completes every
    request; the summary's scaling section counts machine-seconds and cost while on."""
    pol = PolicyConfig(routing=RoutingConfig(cluster_scheduler="aladdin", predictor="tetriinfer-100",
                                             scale_window=30.0))
    wl = make_workload("conversation", rate_profile="0:2,60:10,120:2", duration=180, seed=0)
    n = sum(1 for _ in wl)
    sim = Simulation(make_cluster("baseline-a100", machines=16, parallel=Parallelism(tp=1)),
                     load_model("llama2-13b"), wl, SimConfig(policy=pol))
    result = sim.run()
    assert result.metrics.completed == n > 500
    act = result.scaling
    assert act["scale_downs"] > 0 and act["scale_ups"] > 0
    summ = simulation_summary(result, wl)
    sc = summ["scaling"]
    assert 0.0 < sc["active_fraction"] < 1.0
    assert sc["cost_active"] < summ["cluster"]["cost_per_hour"] * result.sim_end / 3600
    assert sc["gpu_hours_active"] == pytest.approx(sum(act["machine_seconds"].values()) / 3600)  # 1 GPU each


def test_prefill_stall_against_the_decodes_time_saved():
    """Constraint (d), colocated: 2 workers of 1000 KV tokens, T_dec 0.5 s, T_pre 10 s. A (prompt 10,
    output 100) runs on worker 0: its prefill and 4 decodes (generated 5), its first token at 1.0 s
    (the simulator's clock sets it). At 3.25 s it has saved 0.5 * 5 - (3.25 - 1.0) = 0.25 s; a new
    prefill on worker 0 may take 0.9 * 0.25 = 0.225 s: at most 225 prompt tokens (1 ms each). (b)
    allows int((60 + l_in + 1) / 0.9) + 20 <= 500: l_in <= 371. B (prompt 200, output 2) lands on
    0; B' (prompt 250) on 1 (nothing runs there). Without A's first-token time (a clockless
    view) (d) does not count A: B' lands on 0."""
    def start(first_token_at: float):
        ms, s = cluster(2, 1000, 10.0, 0.5)
        a = Request(0, 0.0, 10, 100)
        admit(s, a)
        for _ in range(5):
            finish_iteration(ms[0], form_batch(ms[0], BatchingConfig()))
            s.settle(ms[0])
        a.first_token_at = first_token_at
        assert a.generated == 5 and a in ms[0].running
        return s

    for prompt, first, want in ((200, 1.0, 0), (250, 1.0, 1), (250, -1.0, 0)):
        s = start(first)
        b = Request(1, 3.25, prompt, 2)
        admit(s, b)
        assert b.token_machine == want, (prompt, first)

"""Invariants over random workloads and clusters (property-based)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_model
from splitserve.cluster.designs import make_cluster
from splitserve.policy.state import Phase
from splitserve.report.summary import simulation_summary
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec

DESIGNS = ["splitwise-hh", "splitwise-ha", "splitwise-hhcap", "splitwise-aa", "baseline-h100", "baseline-a100"]


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.floats(0.0, 0.5), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 6000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 300), min_size=n, max_size=n))
    t, specs = 0.0, []
    for g, p, o in zip(gaps, prompts, outputs):
        t += g
        specs.append(RequestSpec(t, p, o))
    design = draw(st.sampled_from(DESIGNS))
    if design.startswith("splitwise"):
        counts = dict(prompt_machines=draw(st.integers(1, 3)), token_machines=draw(st.integers(1, 3)))
    else:
        counts = dict(machines=draw(st.integers(1, 4)))
    # little KV memory (llama2-70b leaves ~14k-80k tokens of KV per machine here) so requests
    # queue for memory and mixed machines preempt
    util = draw(st.sampled_from([0.225, 0.235, 0.26, 0.9]))
    chunk = draw(st.sampled_from([0, 0, 512]))
    return specs, design, counts, util, chunk


def simulate(specs, design, counts, util, chunk):
    from splitserve.policy.config import PolicyConfig
    from splitserve.policy.machine import BatchingConfig

    cfg = SimConfig(record_requests=True, memory_utilization=util,
                    policy=PolicyConfig(batching=BatchingConfig(chunk_size=chunk)))
    sim = Simulation(make_cluster(design, **counts), load_model("llama2-70b"), specs, cfg)
    cap = {m.id: m.kv_capacity for m in sim.machines}
    peak = {}
    form = sim.form_batch   # (a batch former, not _start: the compiled Simulation's methods are fixed)

    def checked_form(m, cfg):              # memory is checked after every scheduling decision
        batch = form(m, cfg)
        for x in sim.machines:
            assert 0 <= x.kv_used <= cap[x.id], (x.id, x.kv_used, cap[x.id])
            assert x.pending == x.recount_pending() >= 0
            peak[x.id] = max(peak.get(x.id, 0), x.kv_used)
        return batch

    sim.form_batch = checked_form
    return sim.run(), peak


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_completes_once_with_all_its_tokens(sc):
    specs, design, counts, util, chunk = sc
    result, _ = simulate(*sc)
    rs = result.requests
    assert len(rs) == len(specs) == result.metrics.completed
    assert sorted(r.id for r in rs) == list(range(len(specs)))
    for r, spec in zip(rs, specs):
        assert r.phase is Phase.DONE
        assert r.generated == spec.output_tokens == len(r.token_times)
        times = r.token_times
        assert times[0] > r.arrival
        assert all(b > a for a, b in zip(times, times[1:])), "token times must strictly increase"
    assert result.metrics.tokens == sum(s.output_tokens for s in specs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_same_input_same_summary(sc):
    class W:
        name, rps, duration = "random", 1.0, 1.0

    a = simulation_summary(simulate(*sc)[0], W)
    b = simulation_summary(simulate(*sc)[0], W)
    for s in (a, b):
        s.pop("sim")
    assert a == b


def _random_specs(n, rate, seed, max_prompt=6000, max_out=400):
    import numpy as np

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    prompts = rng.integers(1, max_prompt, n)
    outputs = rng.integers(1, max_out, n)
    return [RequestSpec(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]


def test_memory_pressure_forces_waits_preemption_and_borrowing():
    """A deterministic overload that must exercise every memory and pool mechanism at once."""
    specs = _random_specs(300, rate=8.0, seed=7)
    base, peak_b = simulate(specs, "baseline-a100", dict(machines=2), 0.225, 0)
    split, peak_s = simulate(specs, "splitwise-hh", dict(prompt_machines=2, token_machines=2), 0.225, 0)
    for result, peak in ((base, peak_b), (split, peak_s)):
        assert result.metrics.completed == 300
        assert all(r.generated == r.output_tokens for r in result.requests)
        assert max(peak[m] / st.kv_capacity for m, st in enumerate(result.metrics.machines)) > 0.9
    assert base.metrics.preemptions > 0
    assert split.borrowed > 0
    assert all(r.preemptions <= 3 for r in base.requests)


def test_overloaded_splitwise_keeps_pace_with_the_unsplit_cluster():
    """Far beyond capacity, a Splitwise cluster moves machines into the mixed pool and serves
    about as much as the same machines unsplit (paper §VI-E), instead of piling onto few."""
    specs = _random_specs(1500, rate=150.0, seed=3, max_prompt=4000, max_out=60)
    split, _ = simulate(specs, "splitwise-hh", dict(prompt_machines=6, token_machines=2), 0.9, 0)
    base, _ = simulate(specs, "baseline-h100", dict(machines=8), 0.9, 0)
    span = lambda r: max(x.token_times[-1] for x in r.requests)   # noqa: E731
    assert split.borrowed > 0
    assert span(split) < 1.25 * span(base)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.booleans(), st.sampled_from([1, 2, 3]))
def test_pull_and_pipelines_lose_nothing_and_stay_within_memory(sc, pull, pp):
    """DistServe's pull (KV held on the prompt machine until the token machine has room) and
    pipelined instances (several batches in flight): every request completes with all its tokens,
    memory never over-committed."""
    from splitserve.cluster.designs import Parallelism
    from splitserve.policy.cluster import RoutingConfig
    from splitserve.policy.config import PolicyConfig
    from splitserve.policy.machine import BatchingConfig

    specs, design, counts, util, chunk = sc
    policy = PolicyConfig(batching=BatchingConfig(chunk_size=chunk),
                          routing=RoutingConfig(mixed_pool=not pull, kv_pull=pull))
    # a pipeline's stages each hold their activations: more memory, or llama2-70b does not fit
    cfg = SimConfig(record_requests=True, memory_utilization=util if pp == 1 else 0.9, policy=policy)
    sim = Simulation(make_cluster(design, **counts, parallel=Parallelism(tp=8 // pp if pp != 3 else 8, pp=pp)),
                     load_model("llama2-70b"), specs, cfg)
    form = sim.form_batch   # (a batch former, not _start: the compiled Simulation's methods are fixed)

    def checked_form(m, cfg):
        batch = form(m, cfg)
        for x in sim.machines:
            assert 0 <= x.kv_used <= x.kv_capacity
            assert x.pending == x.recount_pending() >= 0
        return batch

    sim.form_batch = checked_form
    res = sim.run()
    assert res.metrics.completed == len(specs)
    for r, spec in zip(res.requests, specs):
        assert r.phase is Phase.DONE and r.generated == spec.output_tokens == len(r.token_times)
        assert all(b > a for a, b in zip(r.token_times, r.token_times[1:]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["oracle", "tetriinfer-100", "ecoserve-bookcorpus"]))
def test_tetriinfer_dispatch_loses_nothing_with_any_predictor(sc, predictor):
    """Dispatch by predicted length, right or wrong: every request completes, memory holds."""
    from splitserve.policy.cluster import RoutingConfig
    from splitserve.policy.config import PolicyConfig

    specs, design, counts, util, chunk = sc
    policy = PolicyConfig(routing=RoutingConfig(decode_dispatch="tetriinfer", predictor=predictor))
    sim = Simulation(make_cluster(design, **counts), load_model("llama2-70b"), specs,
                     SimConfig(record_requests=True, memory_utilization=util, policy=policy))
    form = sim.form_batch   # (a batch former, not _start: the compiled Simulation's methods are fixed)

    def checked_form(m, cfg):
        batch = form(m, cfg)
        for x in sim.machines:
            assert 0 <= x.kv_used <= x.kv_capacity
        return batch

    sim.form_batch = checked_form
    res = sim.run()
    assert res.metrics.completed == len(specs)
    assert all(r.phase is Phase.DONE and r.generated == s.output_tokens for r, s in zip(res.requests, specs))

"""TetriInfer's instance flip (policy/instance_flip.py): a flip sequence computed by hand, the drain
before a flip, and invariants over random workloads with a load shift in the simulator."""

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from splitserve.catalog import load_model
from splitserve.cluster.designs import make_cluster
from splitserve.policy.cluster import RoutingConfig, admit
from splitserve.policy.cluster_schedulers import make_cluster_scheduler
from splitserve.policy.config import make_policy
from splitserve.policy.instance_flip import InstanceFlipScheduler, drained
from splitserve.policy.machine import BatchingConfig, finish_iteration
from splitserve.policy.schedulers import form_batch
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.transitions import decode_tokens, kv_landed, start_decodes
from splitserve.sim.simulator import SimConfig, Simulation
from splitserve.workload import RequestSpec

P, T = Pool.PROMPT, Pool.TOKEN


def cluster(flip_idle_s: float):
    ms = [Machine(i, "x", home=h, kv_capacity=100_000) for i, h in enumerate([P, P, T, T])]
    cls = make_cluster_scheduler(ms, RoutingConfig(cluster_scheduler="tetriinfer", flip_idle_s=flip_idle_s,
                                                   predictor="oracle"), True)
    return ms, cls


def prefill(ms, cls, m: Machine) -> list[Request]:
    """Run one prompt batch on `m` (its whole queue here); returns the requests now in HANDOFF."""
    b = form_batch(m, BatchingConfig())
    finish_iteration(m, b)
    cls.settle(m)
    return [r for r in b.prompts if r.phase is Phase.HANDOFF]


def pools(cls) -> tuple[list[int], list[int]]:
    return [m.id for m in cls.pools[P]], [m.id for m in cls.pools[T]]


def test_flips_by_hand():
    """2 prompt (0, 1) + 2 token (2, 3) machines, flip after 1.0 s idle, samples at the times given.

      t    event                                          load > 0 at the sample   flips
      0.0  sample                                         none (every one idle)     none: both roles idle
      0.05 A, B arrive (100 prompt, 300 output each):
           A -> 0 (JSQ), token 2 (heavy share 1 = 1, pending 0 = 0, id 2 < 3);
           B -> 1 (pending 0 < 100), token 3 (share 1 = 1, pending 299 > 0)
      0.1  sample                                         0, 1, 2, 3               none
      0.15 A and B prefilled, their KV lands on 2 and 3
      0.2  sample                                         2, 3 (0, 1 idle from 0.2) none: idle 0 s
      1.1  sample                                         2, 3                      none: idle 0.9 s
      1.2  sample                                         2, 3                      0 -> token (idle 1.0 s,
           the longer-idle of 0 and 1 by id; every token machine loaded; 1 stays, the last prompt)
      1.3  sample                                         2, 3                      none: 0 (token) is idle
           but the prompt role's only machine (1) is idle too
      1.4  load shift: C, D arrive (2000 prompt, 1 output) -> 1 (the only prompt machine)
      1.5  sample                                         1, 2, 3                   none: 0 idle 0.3 s
      1.6  A and B make their 299 tokens: done
      1.7  sample                                         1 (2, 3 idle from 1.7)   none: 0 idle 0.5 s
      2.2  sample                                         1                         0 -> prompt (idle 1.0 s
           since its flip at 1.2; 2 and 3 only 0.5 s)
      2.7  sample                                         1                         none: 2, 3 idle 1.0 s
           but prompt machine 0 is idle (since 2.2)
      2.8  E, F arrive (2000 prompt, 1 output) -> 0, 0 (pending 0, then 2000 < 4000)
      2.9  sample                                         0, 1                      2 -> prompt (2 and 3
           idle since 1.7, 2 by id); 3 stays, the last token machine
      3.0  sample                                         0, 1                      none
    """
    ms, cls = cluster(1.0)
    assert isinstance(cls, InstanceFlipScheduler)
    assert cls.watch(0.0) == []
    a, b = Request(0, 0.05, 100, 300), Request(1, 0.05, 100, 300)
    assert admit(cls, a) and admit(cls, b)
    assert (a.prompt_machine, a.token_machine, b.prompt_machine, b.token_machine) == (0, 2, 1, 3)
    assert cls.watch(0.1) == []
    for p in (ms[0], ms[1]):
        for r in prefill(ms, cls, p):
            kv_landed(p, ms[r.token_machine], r)
    assert cls.watch(0.2) == [] and cls.watch(1.1) == []
    assert cls.watch(1.2) == [ms[0]] and pools(cls) == ([1], [2, 3, 0]) and ms[0].home is T
    assert cls.watch(1.3) == []
    c, d = Request(2, 1.4, 2000, 1), Request(3, 1.4, 2000, 1)
    assert admit(cls, c) and admit(cls, d) and c.prompt_machine == d.prompt_machine == 1
    assert cls.watch(1.5) == []
    for t in (ms[2], ms[3]):
        start_decodes(t)
        assert decode_tokens(t, t.running, 299)
    assert cls.watch(1.7) == []
    assert cls.watch(2.2) == [ms[0]] and pools(cls) == ([1, 0], [2, 3])
    assert cls.watch(2.7) == []
    e, f = Request(4, 2.8, 2000, 1), Request(5, 2.8, 2000, 1)
    assert admit(cls, e) and admit(cls, f) and e.prompt_machine == f.prompt_machine == 0
    assert cls.watch(2.9) == [ms[2]] and pools(cls) == ([1, 0, 2], [3])
    assert cls.watch(3.0) == []
    assert [(f.at, f.machine, f.to) for f in cls.flips] == [(1.2, 0, T), (2.2, 0, P), (2.9, 2, P)]


def test_a_selected_machine_drains_its_prefilled_kv_first():
    """Flip at once when idle (0 s). A prefilled on 0, its KV not yet on 2; B keeps 3 loaded.
    t=1: 0 is idle (pending 0) but holds A's 100 KV tokens: it leaves the prompt pool (nothing is
    routed to it: C goes to 1) and waits; 1 is idle too, but the role keeps one. t=2: A's KV has
    landed: 0 holds nothing and flips to token."""
    ms, cls = cluster(0.0)
    a, b = Request(0, 0.0, 100, 50), Request(1, 0.0, 100, 50)
    assert admit(cls, a) and admit(cls, b)
    assert (a.prompt_machine, a.token_machine, b.prompt_machine, b.token_machine) == (0, 2, 1, 3)
    assert cls.watch(0.5) == []
    (ra,) = prefill(ms, cls, ms[0])
    (rb,) = prefill(ms, cls, ms[1])
    kv_landed(ms[1], ms[3], rb)
    assert ms[0].pending == 0 and ms[0].kv_used == 100 and not drained(ms[0])
    assert cls.watch(1.0) == [] and cls.draining == [ms[0]] and pools(cls) == ([1], [2, 3])
    c = Request(2, 1.5, 100, 50)
    assert admit(cls, c) and c.prompt_machine == 1
    kv_landed(ms[0], ms[2], ra)
    assert cls.watch(2.0) == [ms[0]] and pools(cls) == ([1], [2, 3, 0]) and cls.draining == []
    assert [(f.at, f.machine, f.to, f.selected_at) for f in cls.flips] == [(2.0, 0, T, 1.0)]


# ---- invariants over random workloads, in the simulator -------------------------------------
@st.composite
def shifting_workloads(draw):
    """A load shift: first heavy prompts with light outputs, then light prompts with heavy outputs
    (or the other way round), with idle gaps."""
    specs, t = [], 0.0
    heavy_prompts, heavy_outputs = ((1000, 6000), (1, 20)), ((20, 60), (100, 400))
    shift = draw(st.sampled_from([(heavy_prompts, heavy_outputs), (heavy_outputs, heavy_prompts)]))
    for prompts, outputs in shift:
        for _ in range(draw(st.integers(1, 25))):
            t += draw(st.floats(0.0, 1.5))
            specs.append(RequestSpec(t, draw(st.integers(*prompts)), draw(st.integers(*outputs))))
        t += draw(st.floats(0.0, 5.0))
    counts = dict(prompt_machines=draw(st.integers(1, 3)), token_machines=draw(st.integers(1, 3)))
    util = draw(st.sampled_from([0.225, 0.26, 0.9]))     # little KV memory: requests wait for it
    flip = draw(st.sampled_from([0.0, 0.5, 2.0]))
    predictor = draw(st.sampled_from(["oracle", "tetriinfer-100"]))
    return specs, counts, util, flip, predictor


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shifting_workloads())
def test_flips_lose_nothing(sc):
    specs, counts, util, flip, predictor = sc
    policy = make_policy({"routing.flip_idle_s": flip, "routing.predictor": predictor}, "tetriinfer")
    sim = Simulation(make_cluster("splitwise-hh", **counts), load_model("llama2-70b"), specs,
                     SimConfig(policy=policy, record_requests=True, memory_utilization=util))
    cls = sim.cls
    assert isinstance(cls, InstanceFlipScheduler)
    form, watch = sim.form_batch, cls.watch   # (the batch former: the compiled Simulation's methods are fixed)

    def checked():
        for m in sim.machines:
            assert 0 <= m.kv_used <= m.kv_capacity and m.pending == m.recount_pending() >= 0
        assert cls.pools[P] and cls.pools[T] and not cls.pools[Pool.MIXED]
        assert sorted(m.id for m in [*cls.pools[P], *cls.pools[T], *cls.draining]) == list(range(len(sim.machines)))

    def checked_form(m, cfg):
        batch = form(m, cfg)
        checked()
        return batch

    def checked_watch(now, quiet=None):
        flipped = watch(now, quiet)
        for m in flipped:  # a machine flips holding nothing: no request of its old role left behind
            assert drained(m) and not m.has_work() and not m.busy
            assert m.pool is m.home and m in cls.pools[m.pool]
        checked()
        return flipped

    sim.form_batch = checked_form
    try:        # a compiled (mypyc) scheduler's methods are fixed: its flips are checked after the run
        cls.watch = checked_watch
    except AttributeError:
        pass
    res = sim.run()
    for f in cls.flips:   # each flipped machine serves its new role, as its last flip left it
        m = sim.machines[f.machine]
        assert f.selected_at <= f.at and (m.home is f.to or any(g.machine == f.machine and g.at >= f.at
                                                                for g in cls.flips if g is not f))
    assert res.metrics.completed == len(specs) == len(res.requests)
    for r, spec in zip(res.requests, specs):
        assert r.phase is Phase.DONE and r.generated == spec.output_tokens == len(r.token_times)
    assert all(m.kv_used == 0 for m in sim.machines)
    event(f"flips: {min(len(cls.flips), 3)}")

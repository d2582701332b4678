"""The live router's view of the cluster follows the simulator exactly: random sequences of
arrivals, steps (with preemptions and chunks), step ends and KV landings are driven through the
simulator's path (admit, form_batch, finish_iteration, kv_landed, admit_freed, as Simulation
calls them) and through the router's LiveCluster (fed the reports a worker sends), and every
machine and request is compared after every event. No sockets, no processes."""

from __future__ import annotations

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from splitserve.policy.cluster import RoutingConfig, admit, admit_freed, make_cluster_scheduler
from splitserve.policy.machine import BatchingConfig, finish_iteration, form_batch
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.transitions import DoesNotFit, kv_landed
from splitserve.serve.cluster_state import LiveCluster, NoWorkers


class SimPath:
    """The simulator's calls, without its clock (sim/simulator.py)."""

    def __init__(self, homes, cap, block, split, routing, batching):
        self.ms = [Machine(i, "x", home=h, kv_capacity=cap, kv_block=block) for i, h in enumerate(homes)]
        self.cls = make_cluster_scheduler(self.ms, routing, split)   # splitwise, jsq or tetriinfer (flips)
        self.batching = batching
        self.batches = {}
        self.reqs: dict[int, Request] = {}

    def arrive(self, r: Request) -> bool:
        self.reqs[r.id] = r
        return admit(self.cls, r)

    def step(self, i: int):
        b = form_batch(self.ms[i], self.batching)
        if b is not None:
            self.batches[i] = b
        return b

    def end(self, i: int) -> None:
        m, b = self.ms[i], self.batches.pop(i)
        res = finish_iteration(m, b)
        self.cls.settle(m)
        if res.finished:
            admit_freed(self.cls, m)

    def land(self, r: Request) -> None:
        p, t = self.ms[r.prompt_machine], self.ms[r.token_machine]
        kv_landed(p, t, r)
        admit_freed(self.cls, p)

    def watch(self, now: float) -> list[int]:
        """Simulation._watch: the instance-flip watcher's sample (a flipped machine holds nothing)."""
        return [m.id for m in self.cls.watch(now)] if hasattr(self.cls, "watch") else []


def state(ms: list[Machine], reqs: dict[int, Request]) -> tuple:
    ids = lambda rs: [r.id for r in rs]  # noqa: E731
    machines = [(m.pool, m.kv_used, m.pending, m.queued_prompt_tokens, m.running_prompt_tokens,
                 m.queued_decode_tokens, m.decode_tokens_left, m.inbound_tokens, m.context_tokens, m.isolated,
                 ids(m.prompt_queue), ids(m.running), ids(m.ready), ids(m.admit_queue)) for m in ms]
    requests = {i: (r.phase, r.generated, r.prefilled, r.chunk, r.prompt_machine, r.token_machine,
                    r.kv_on_token_machine, r.preemptions) for i, r in reqs.items()}
    return machines, requests


@st.composite
def scenarios(draw):
    split = draw(st.booleans())
    P, T = Pool.PROMPT, Pool.TOKEN
    homes = draw(st.sampled_from([[P, P, T, T], [P, P, P, T], [P, T, T]])) if split else [Pool.MIXED] * 2
    block = draw(st.sampled_from([1, 16]))
    cap = draw(st.sampled_from([256, 512, 1024]))
    routing = RoutingConfig(prompt_queue_threshold=draw(st.sampled_from([64, 8192])),
                            token_queue_threshold=draw(st.sampled_from([0, 100])),
                            decode_dispatch=draw(st.sampled_from(["jsq", "tetriinfer"])),
                            predictor=draw(st.sampled_from(["oracle", "tetriinfer-100"])),
                            cluster_scheduler=draw(st.sampled_from(["auto", "tetriinfer", "tetriinfer", "aladdin"]))
                            if split else draw(st.sampled_from(["auto", "aladdin"])),
                            scale_window=draw(st.sampled_from([0.0, 3.0])),   # aladdin: workers scaled
                            flip_idle_s=draw(st.sampled_from([0.0, 0.0, 3.0])))
    batching = BatchingConfig(prompt_token_cap=draw(st.sampled_from([64, 2048])),
                              chunk_size=draw(st.sampled_from([0, 0, 48])),
                              preemption_limit=draw(st.integers(0, 3)))
    events = draw(st.lists(st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 200), st.integers(1, 60), st.booleans()),
        st.tuples(st.just("step"), st.integers(0, 3)),
        st.tuples(st.just("end"), st.integers(0, 3)),
        st.tuples(st.just("land"), st.integers(0, 7)),
        st.tuples(st.just("watch"), st.just(0))), min_size=5, max_size=120))
    return split, homes, cap, block, routing, batching, events


@settings(max_examples=300, deadline=None)
@given(scenarios())
@example((True, [Pool.PROMPT, Pool.PROMPT, Pool.TOKEN, Pool.TOKEN], 256, 1,  # found by this test:
          RoutingConfig(prompt_queue_threshold=64, token_queue_threshold=0),  # an isolated decode that
          BatchingConfig(prompt_token_cap=64, chunk_size=0, preemption_limit=0),  # joined in an empty
          [("arrive", 1, 17, False), ("step", 0), ("arrive", 169, 2, True),  # isolated turn went
           ("arrive", 72, 14, False), ("arrive", 28, 60, True)]))  # unreported, then starved
def test_the_router_view_follows_the_simulator_event_by_event(sc):
    split, homes, cap, block, routing, batching, events = sc
    sim = SimPath(homes, cap, block, split, routing, batching)
    live = LiveCluster(homes, [cap] * len(homes), split, routing, kv_block=block)
    live_reqs: dict[int, Request] = {}
    in_transfer: list[int] = []
    flipped: list[int] = []
    n = len(homes)

    def check():
        assert state(live.machines, live_reqs) == state(sim.ms, sim.reqs)
        if routing.cluster_scheduler == "aladdin":  # the same workers take new requests, the same predictions
            assert live.cls.state == sim.cls.state and live.cls.pred == sim.cls.pred
        for m in sim.ms:
            assert m.pending == m.recount_pending() >= 0 and 0 <= m.kv_used <= m.kv_capacity

    def step(i):
        if i in sim.batches:
            return
        b = sim.step(i)
        if b is None:
            return
        rep = lambda rs: [live_reqs[r.id] for r in rs]  # noqa: E731  the worker's report, by id
        live.step_started(i, [(live_reqs[r.id], c) for r, c in zip(b.prompts, b.chunks)], rep(b.preempted),
                          rep(b.joined))

    def end(i):
        if i not in sim.batches:
            return
        b = sim.batches[i]
        done_prefill = [r for r, c in zip(b.prompts, b.chunks) if r.prefilled + c == r.prefill_len]
        outputs = [(live_reqs[r.id], 1, False) for r in [*b.decoding, *done_prefill]]  # the step's tokens
        sim.end(i)
        live.end_step(i, outputs)
        in_transfer.extend(r.id for r in done_prefill if r.phase is Phase.HANDOFF)

    def land(k):
        if in_transfer:
            rid = in_transfer.pop(k % len(in_transfer))
            sim.land(sim.reqs[rid])
            live.kv_landed(live_reqs[rid])

    for i, ev in enumerate(events):
        kind = ev[0]
        if kind == "arrive":
            _, p, o, iso = ev
            a, b = Request(i, float(i), p, o, isolated=iso), Request(i, float(i), p, o, isolated=iso)
            try:
                sim.arrive(a)
            except DoesNotFit:
                del sim.reqs[i]
                try:
                    live.arrive(b)
                except NoWorkers:
                    continue
                raise AssertionError("the live view took a request the simulator refused")
            live_reqs[i] = b
            live.arrive(b)
        elif kind == "step":
            step(ev[1] % n)
        elif kind == "end":
            end(ev[1] % n)
        elif kind == "watch":  # the flip watcher at time i, in both (the same flips)
            flips = sim.watch(float(i))
            assert live.watch(float(i)) == flips
            flipped.extend(flips)
        else:
            land(ev[1])
        check()
    for _ in range(10_000):  # drain: every request completes in both
        if not (in_transfer or sim.batches or any(m.has_work() or m.admit_queue for m in sim.ms)):
            break
        for i in range(n):
            end(i)
            check()
        while in_transfer:
            land(0)
            check()
        for i in range(n):
            step(i)
            check()
    assert all(r.phase is Phase.DONE for r in sim.reqs.values()) and live.idle()
    event(f"instances flipped: {bool(flipped)}")
    if routing.cluster_scheduler == "aladdin":
        event(f"aladdin workers scaled down: {live.cls.scale_downs > 0}")

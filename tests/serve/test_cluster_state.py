"""The live router's view of the cluster follows the simulator exactly: random sequences of
arrivals, steps (with preemptions and chunks), step ends and KV landings are driven through the
simulator's path (admit, form_batch, finish_iteration, kv_landed, admit_freed, as Simulation
calls them) and through the router's LiveCluster (fed the reports a worker sends: the batch as
the engine reports it, the worker's `step` message through the codec and msgpack, read as the
router reads it), and every machine and request is compared after every event. No sockets, no
processes. Under ecoserve (its own tests below) the report also carries the scheduler's own
report, how it sized KV (policy/schedulers/ecoserve/sizing.py Sizing), and the comparison covers
the GT queue, each request's KV held, host and prediction."""

from __future__ import annotations

import random

import msgpack
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from splitserve.policy.cluster import RoutingConfig, admit_freed, arrive, readmit
from splitserve.policy.cluster_schedulers import make_cluster_scheduler
from splitserve.policy.machine import BatchingConfig, BatchReport, finish_iteration
from splitserve.policy.predictor import make_predictor
from splitserve.policy.preemption import sent_back
from splitserve.policy.schedulers import SCHEDULERS, form_batch
from splitserve.policy.schedulers.ecoserve.order import host
from splitserve.policy.state import Machine, Phase, Pool, Request
from splitserve.policy.kv_allocation import DoesNotFit, configure
from splitserve.policy.transitions import kv_landed
from splitserve.serve.cluster_state import LiveCluster, NoWorkers
from splitserve.serve.messages import TO_ROUTER, decode, encode
from splitserve.serve.router_views import idle
from splitserve.serve.worker import step_message


class SimPath:
    """The simulator's calls, without its clock (sim/simulator.py)."""

    def __init__(self, homes, cap, block, split, routing, batching, predictor=None):
        self.ms = [Machine(i, "x", home=h, kv_capacity=cap, kv_block=block) for i, h in enumerate(homes)]
        for m in self.ms:   # reserve or on demand, as the router's view and the engine's are made
            configure(m, batching)
        self.sched = SCHEDULERS[batching.scheduler]
        for m in self.ms:   # as the engine's view of itself: it reports what its scheduler records
            self.sched.record(m)
        self.cls = make_cluster_scheduler(self.ms, routing, split)   # splitwise, jsq or tetriinfer (flips)
        self.batching = batching
        self.predictor = predictor
        self.batches = {}
        self.reqs: dict[int, Request] = {}

    def arrive(self, r: Request) -> bool:
        self.reqs[r.id] = r
        return arrive(self.cls, r, self.predictor)   # Simulation._arrive

    def step(self, i: int):
        b = form_batch(self.ms[i], self.batching)
        if b is not None:
            self.batches[i] = b
            for r in sent_back(self.ms[i], b.preempted):   # Simulation._readmit (--recompute prompt-pool)
                readmit(self.cls, r)
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


def state(ms: list[Machine], reqs: dict[int, Request], order: bool = True) -> tuple:
    """Every counter and queue of every machine, every request's progress and KV. `order` False: the
    prompt and decode queues' members only (ecoserve orders them by deadlines, which the worker
    keys by its admission counter and fixes when it first orders a request; the router's view
    never takes from its queues, so their members and counters are what count)."""
    ids = lambda rs: [r.id for r in rs]  # noqa: E731
    queue = ids if order else lambda rs: sorted(ids(rs))  # noqa: E731
    machines = [(m.pool, m.kv_used, m.pending, m.queued_prompt_tokens, m.running_prompt_tokens,
                 m.queued_decode_tokens, m.decode_tokens_left, m.inbound_tokens, m.context_tokens, m.isolated,
                 queue(m.prompt_queue), ids(m.running), ids(m.ready), ids(m.admit_queue), queue(m.decode_queue))
                for m in ms]
    requests = {i: (r.phase, r.generated, r.prefilled, r.chunk, r.prompt_machine, r.token_machine,
                    r.kv_on_token_machine, r.preemptions, r.kv_held, None if host(r) is None else host(r).id,
                    r.predicted) for i, r in reqs.items()}
    return machines, requests


def reported(m: Machine, b, sched) -> BatchReport:
    """The engine's report of a batch formed on `m` by `sched` (engine/scheduler.py
    Scheduler.schedule), by id."""
    rep = BatchReport()
    rep.sched = sched.report(m, lambda r: str(r.id))
    assert sched.check_report(rep.sched) is None   # what it reports passes its own wire check
    if b is not None:
        rep.chunks = [(str(r.id), c) for r, c in zip(b.prompts, b.chunks)]
        rep.preempted = [str(r.id) for r in b.preempted]
        rep.joined = [str(r.id) for r in b.joined]
        rep.grown = [str(r.id) for r in b.grown]
    return rep


def deliver(live: LiveCluster, i: int, rep: BatchReport, live_reqs: dict[int, Request]) -> None:
    """The worker's `step` message of `rep` (serve/worker.py), through the codec and msgpack, applied
    as the router does (serve/reports.py)."""
    msg = decode(msgpack.unpackb(msgpack.packb(encode(step_message(rep)))), TO_ROUTER)
    get = lambda rid: live_reqs.get(int(rid))  # noqa: E731
    back = live.step_started(i, [(get(rid), n) for rid, n in msg.chunks], [get(rid) for rid in msg.preempted],
                             [get(rid) for rid in msg.joined], msg.sched, get, [get(rid) for rid in msg.grown or ()])
    for r in back:   # the router's Recovery.resume
        live.arrive(r, again=True)


@st.composite
def scenarios(draw, pressure: bool = False):
    """Random clusters, policies and events; `pressure`: KV on demand in a small cache (128-256
    tokens) with longer outputs, so that decodes run out of blocks and preempt one another."""
    split = draw(st.booleans())
    P, T = Pool.PROMPT, Pool.TOKEN
    homes = draw(st.sampled_from([[P, P, T, T], [P, P, P, T], [P, T, T]])) if split else [Pool.MIXED] * 2
    block = draw(st.sampled_from([1, 16]))
    cap = draw(st.sampled_from([128, 192, 256] if pressure else [256, 512, 1024]))
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
                              preemption_limit=draw(st.integers(0, 3)),
                              kv_allocation=draw(st.sampled_from(["on-demand"] if pressure else ["reserve", "on-demand"])),
                              kv_watermark=draw(st.sampled_from([0.0, 0.01, 0.1])),
                              recompute=draw(st.sampled_from(["auto", "in-place", "prompt-pool"])))
    events = draw(st.lists(st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 60 if pressure else 200), st.integers(20 if pressure else 1,
                  120 if pressure else 60), st.booleans()),
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
    stats: dict = {}
    flipped = drive(split, homes, cap, block, routing, batching, events, stats=stats)
    event(f"instances flipped: {bool(flipped)}")
    event(f"{batching.kv_allocation}: preempted {bool(stats.get('preempted'))}, grown {bool(stats.get('grown'))}")


@settings(max_examples=150, deadline=None)
@given(scenarios(pressure=True))
def test_the_router_view_follows_decodes_that_run_out_of_blocks(sc):
    """KV on demand under pressure: every grown block and every preemption for one, followed."""
    split, homes, cap, block, routing, batching, events = sc
    stats: dict = {}
    drive(split, homes, cap, block, routing, batching, events, stats=stats)
    event(f"preempted: {bool(stats.get('preempted'))}")


def drive(split, homes, cap, block, routing, batching, events, predictor: str | None = None,
          stats: dict | None = None) -> list[int]:
    """Drive `events` through both paths, comparing after each; the instances flipped. `predictor`:
    the output-length predictor both make at arrival (ecoserve); `stats`: the simulator's machines'
    scheduler counts, added up."""
    sim = SimPath(homes, cap, block, split, routing, batching,
                  make_predictor(predictor) if predictor is not None else None)
    live = LiveCluster(homes, [cap] * len(homes), split, routing, kv_block=block,
                       predictor=make_predictor(predictor) if predictor is not None else None,
                       batching=batching)
    order = batching.scheduler != "ecoserve"
    live_reqs: dict[int, Request] = {}
    in_transfer: list[int] = []
    flipped: list[int] = []
    n = len(homes)

    def check():
        assert state(live.view.machines, live_reqs, order) == state(sim.ms, sim.reqs, order)
        if routing.cluster_scheduler == "aladdin":  # the same workers take new requests, the same predictions
            assert live.view.cls.scaling.state == sim.cls.scaling.state and live.view.cls.demand.pred == sim.cls.demand.pred
        for m in sim.ms:
            assert m.pending == m.recount_pending() >= 0 and 0 <= m.kv_used <= m.kv_capacity

    def step(i):
        if i in sim.batches:
            return
        b = sim.step(i)
        if stats is not None and b is not None:
            stats["preempted"] = stats.get("preempted", 0) + len(b.preempted)
            stats["grown"] = stats.get("grown", 0) + len(b.grown)
        rep = reported(sim.ms[i], b, sim.sched)
        if rep.told():   # the engine reports a step that changed something (engine/engine.py step)
            deliver(live, i, rep, live_reqs)

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
                raise AssertionError("the live view took a request the simulator refused") from None
            live_reqs[i] = b
            live.arrive(b)
        elif kind == "step":
            step(ev[1] % n)
        elif kind == "end":
            end(ev[1] % n)
        elif kind == "watch":  # the flip watcher at time i, in both (the same flips)
            flips = sim.watch(float(i))
            assert live.view.watch(float(i)) == flips
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
    assert all(r.phase is Phase.DONE for r in sim.reqs.values()) and idle(live.view)
    if routing.cluster_scheduler == "aladdin":
        event(f"aladdin workers scaled down: {live.view.cls.scaling.scale_downs > 0}")
    if stats is not None:
        for m in sim.ms:
            for k, v in (m.counts or {}).items():
                stats[k] = stats.get(k, 0) + v
    return flipped


@st.composite
def ecoserve_scenarios(draw):
    """Unsplit machines under ecoserve, predictions from the oracle or an ecoserve-* padded estimate
    (wrong ones: GTs outlive them, reservations grow, hosts regroup, guests are preempted), caches
    small enough that GTs wait for memory and the last resort ("unstuck") drops waiting ones."""
    homes = [Pool.MIXED] * draw(st.sampled_from([1, 2]))
    block = draw(st.sampled_from([1, 16]))
    cap = draw(st.sampled_from([256, 512, 1024]))
    predictor = draw(st.sampled_from(["oracle", "ecoserve-alpaca", "ecoserve-sharegpt", "ecoserve-bookcorpus"]))
    routing = RoutingConfig(predictor=predictor, cluster_scheduler=draw(st.sampled_from(["auto", "auto", "aladdin"])),
                            scale_window=draw(st.sampled_from([0.0, 3.0])))
    batching = BatchingConfig(scheduler="ecoserve", prompt_token_cap=draw(st.sampled_from([64, 2048])),
                              max_seqs=draw(st.sampled_from([0, 0, 3])), preemption_limit=draw(st.integers(0, 3)))
    # a quarter of them isolated (suspects): an isolated prompt that does not fit beside the KV the
    # waiting GTs hold lets the GTs go on alone until it does
    arrive = st.tuples(st.just("arrive"), st.integers(1, 160), st.integers(1, 30) | st.integers(1, 240),
                       st.sampled_from([False, False, False, True]))
    events = draw(st.lists(st.one_of(
        arrive, arrive,
        st.tuples(st.just("step"), st.integers(0, 3)),
        st.tuples(st.just("end"), st.integers(0, 3)),
        st.tuples(st.just("watch"), st.just(0))), min_size=20, max_size=150))
    return homes, cap, block, predictor, routing, batching, events


@settings(max_examples=300, deadline=None)
@given(ecoserve_scenarios())
def test_the_router_view_follows_ecoserve_event_by_event(sc):
    homes, cap, block, predictor, routing, batching, events = sc
    stats: dict[str, int] = {}
    drive(False, homes, cap, block, routing, batching, events, predictor, stats)
    for what in ("pipelined", "reserve", "preempted", "regrouped", "unstuck"):
        event(f"ecoserve {what}: {stats.get(what, 0) > 0}")


def seeded_stream(seed: int) -> tuple:
    """150 events of a seeded stream (arrivals 40%, steps 30%, step ends 30%) on 2 machines, with its
    predictor, cache and block drawn from the same seed."""
    rnd = random.Random(seed)
    events = []
    for _ in range(150):
        x = rnd.random()
        if x < 0.4:
            events.append(("arrive", rnd.randint(1, 160), rnd.choice([rnd.randint(1, 30), rnd.randint(1, 240)]), False))
        else:
            events.append(("step" if x < 0.7 else "end", rnd.randint(0, 3)))
    predictor = rnd.choice(["oracle", "ecoserve-alpaca", "ecoserve-sharegpt", "ecoserve-bookcorpus"])
    return predictor, rnd.choice([256, 512, 1024]), rnd.choice([1, 16]), events


def test_seeded_ecoserve_streams_report_every_kind_of_sizing():
    """Ten seeded streams under load, between them every kind of ecoserve's KV sizing (random
    streams seldom preempt a guest: 1 in 300 did), the router's view equal to the simulator's
    after each event. Measured: seed 275 preempts a guest; 271, 272, 276, 278, 279 unstick."""
    stats: dict[str, int] = {}
    for seed in range(270, 280):
        predictor, cap, block, events = seeded_stream(seed)
        drive(False, [Pool.MIXED] * 2, cap, block, RoutingConfig(predictor=predictor),
              BatchingConfig(scheduler="ecoserve"), events, predictor, stats)
    assert {"pipelined", "reserve", "preempted", "regrouped", "unstuck"} <= set(stats), stats


def test_other_schedulers_step_messages_are_unchanged():
    """A report without ecoserve's sizing (every other scheduler's) makes the `step` it made before."""
    rep = BatchReport(chunks=[("1.0", 512)], preempted=["2.0"], joined=["3.0"])
    assert encode(step_message(rep)) == {"t": "step", "chunks": [("1.0", 512)], "preempted": ["2.0"],
                                         "joined": ["3.0"]}


def test_an_unsplit_worker_replaced_rejoins_the_view():
    """A mixed worker of the baseline dies and its replacement says hello: the view has a fresh
    machine for it (JSQ's list of machines was the view's own list, so `down` shrank the view's
    and the replacement's `up` raised IndexError: the router could never use it again)."""
    from splitserve.policy.state import Pool
    live = LiveCluster([Pool.MIXED, Pool.MIXED], [1000, 1000], split=False)
    live.view.down(0)
    assert len(live.view.machines) == 2 and [m.id for m in live.view.cls.machines] == [1]
    live.view.up(0, 1000)
    assert live.view.alive == [True, True] and sorted(m.id for m in live.view.cls.machines) == [0, 1]
    assert live.view.machines[0] in live.view.cls.machines

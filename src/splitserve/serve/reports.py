"""How the router answers its workers' reports: a step began or ended, KV was reserved or landed,
a transfer or an engine step failed, a worker said hello or its heartbeat. A part of the Router
(router.py), kept apart because it is the one place where worker messages change requests.

Quarantine: a worker whose engine step raises survives it; it drops that step's requests and
reports them (`step_failed`). Each of them is restarted without penalty, isolated (its engine runs
it in steps of its own, so it cannot take others down with it again); a request that was in a
failed step twice is failed with an error that names it, and never retried.
"""

from __future__ import annotations

import logging
import time

from ..policy.state import Request
from .messages import (Cancel, Err, Heartbeat, Hello, KvFail, KvIn, Message, Out, OutItem, Reserved, Stage, Step,
                       StepFailed)
from .recovery import Recovery
from .request_flow import RequestFlow
from .requests import LiveRequest
from .router_state import RouterState
from .supervisor import WorkerInfo

logger = logging.getLogger(__name__)

QUARANTINE_STRIKES = 2  # failed engine steps a request may be part of; the next retry is refused


class ReportReader:
    """The Router's handlers of worker messages: they change the shared state's requests and policy
    view, and act through `flow` (send, deliver, end) and `recovery` (restart, resume)."""

    def __init__(self, state: RouterState, flow: RequestFlow, recovery: Recovery) -> None:
        self.state, self.flow, self.recovery = state, flow, recovery

    def on_message(self, w: WorkerInfo, msg: Message) -> None:
        """A verified message from worker `w` (the channel's handler)."""
        w.last_seen = time.monotonic()
        get = self.state.reqs.by_wire.get
        if type(msg) is Out:
            self.on_step_end(w, msg.items, msg.lp or {})
        elif type(msg) is Step:
            self.on_step(w, msg)
        elif type(msg) is Reserved:
            self.on_reserved(msg, get(msg.rid))
        elif type(msg) is KvIn:
            self.on_kv_in(msg, get(msg.rid))
        elif type(msg) is KvFail:
            self.state.metrics.splitwise.transfer_failures.inc()
            req = get(msg.rid)
            if req is not None and req.stage in (Stage.RESERVING, Stage.PREFILL, Stage.HANDOFF):
                self.recovery.restart(req, msg.reason)
        elif type(msg) is StepFailed:
            self.on_step_failed(w, msg.rids, msg.error)
        elif type(msg) is Err:
            req = get(msg.rid)
            if req is not None:
                self.flow.fail(req, f"worker {w.id} rejected the request: {msg.msg}", 400)
        elif type(msg) is Hello:
            self.on_hello(w, msg)
        else:  # the one kind of TO_ROUTER left (the channel decodes no other)
            assert type(msg) is Heartbeat
            self.on_heartbeat(w, msg)

    def on_heartbeat(self, w: WorkerInfo, msg: Heartbeat) -> None:
        w.free, w.blocks, w.reserved = msg.free, msg.blocks, msg.reserved
        w.running, w.rejected, w.preempted = msg.running, msg.rejected, msg.preempted

    def on_step(self, w: WorkerInfo, msg: Step) -> None:
        """w's engine formed a step: the policy view's transitions (LiveCluster.step_started)."""
        s = self.state
        get = s.reqs.by_wire.get
        cluster = s.policy_view
        bad = cluster.sched.check_report(msg.sched)   # the machine scheduler's own report
        if bad is not None:
            s.chan.malformed += 1
            logger.warning("router: worker %d sent a malformed message: step: %s", w.id, bad)
            return

        def live(rids: list[str]) -> list[Request]:  # the policy requests of those tracked, with a try
            return [q.pr for q in map(get, rids) if q is not None and q.pr is not None]

        chunks = [(q, n) for q, n in ((get(rid), n) for rid, n in msg.chunks) if q is not None]
        self._scheduled(w, msg, [q for q, _ in chunks])
        self._cached(w, msg)
        s.metrics.step(w.id, w.home, sum(n for _, n in msg.chunks), len(msg.preempted))
        back = cluster.step_started(w.id, [(q.pr, n) for q, n in chunks if q.pr is not None],
                                    live(msg.preempted), live(msg.joined), msg.sched,
                                    lambda rid: q.pr if (q := get(rid)) is not None else None,
                                    live(msg.grown or []))
        if msg.preempted:
            recomputes = s.metrics.splitwise.recomputes
            recomputes.labels("in_place").inc(len(msg.preempted) - len(back))
            recomputes.labels("prompt_pool").inc(len(back))
        for r in back:  # preempted, to recompute through the prompt pool (--recompute prompt-pool)
            self.recovery.resume(s.reqs.by_policy[r.id])

    def _scheduled(self, w: WorkerInfo, msg: Step, started: list[LiveRequest]) -> None:
        """A request's first engine step (of any try) ends its queue time: when the worker formed
        it, where the two share a clock; else when this report is read, unless its first token
        overtook the report (kv_in) and that moment has passed."""
        now = time.perf_counter()
        at = min(msg.at, now) if w.same_clock and msg.at is not None else None
        for q in started:
            if not q.scheduled_at and (at is not None or not q.first_at):
                q.scheduled_at = at if at is not None else now

    def _cached(self, w: WorkerInfo, msg: Step) -> None:
        """The prompts that start in the step, and what the worker's prefix cache gave them."""
        if not msg.cached:
            return
        s = self.state
        sizes = dict(msg.chunks)
        for rid, k in msg.cached:
            s.metrics.prefix_hit(k)
            if (q := s.reqs.by_wire.get(rid)) is not None:
                q.cached_tokens = k
                s.policy_view.prefixes.reported(w.id, q.routed, sizes.get(rid, 0), k)  # the view corrected

    def on_reserved(self, msg: Reserved, req: LiveRequest | None) -> None:
        """The token worker answered `expect`: the prompt worker's `gen` goes, or the request waits."""
        if req is None or req.stage is not Stage.RESERVING:
            return
        cluster = self.state.policy_view
        if msg.ok:
            cluster.prefixes.reserved(req.routed, msg.skip)
            self.flow.send_prefill(req, msg.blocks, msg.skip)
        elif msg.full:  # on demand: no room there now after all; it waits, no try lost
            cluster.wait_for_room(req.routed)
            req.stage = Stage.WAITING
        else:
            self.recovery.restart(req, f"token worker could not reserve KV: {msg.msg}")

    def on_hello(self, w: WorkerInfo, msg: Hello) -> None:
        s = self.state
        if not s.supervisor.hello(w, msg.pid, time.monotonic()):
            return  # not the process we started
        w.kv_addr, w.blocks, w.block_size, w.kv_region = msg.kv_addr, msg.blocks, msg.block_size, msg.region
        w.same_clock = msg.boot is not None and msg.boot == s.boot
        w.free = w.start_free = msg.free
        w.max_len = msg.max_len
        if s.cluster is not None:
            s.cluster.view.up(w.id, w.kv_tokens)
            parked, s.reqs.parked = s.reqs.parked, []
            for req in parked:
                self.flow.begin(req)

    def on_kv_in(self, msg: KvIn, req: LiveRequest | None) -> None:
        s = self.state
        s.metrics.transfer(msg.mode, msg.nbytes, msg.seconds, msg.exposed, msg.skipped or 0)
        if req is None:
            return
        if req.stage is Stage.PREFILL:  # the token worker may report before the prompt worker's word
            s.policy_view.first_from_token_worker(req.routed)
            req.stage = Stage.HANDOFF
            self.flow.deliver(req, [msg.first_token], msg.lp)
        if req.stage is Stage.HANDOFF:
            self.flow.dispatch_all(s.policy_view.kv_landed(req.routed))
            req.stage = Stage.DECODE

    def on_step_end(self, w: WorkerInfo, items: list[OutItem], lps: dict) -> None:
        """A step of w's ended with these tokens: the view's transitions for the whole step first
        (as the simulator's iteration end), then each request's tokens go to its client."""
        s = self.state
        cluster = s.policy_view
        mine: list[tuple[LiveRequest, list[int], bool, str | None]] = []
        made, prefills = 0, 0
        for rid, toks, finished, reason in items:
            req = s.reqs.by_wire.get(rid)
            made += len(toks)
            if reason == "prefill" or req is not None and cluster.awaiting_first(req.routed):
                prefills += 1  # the token that ends a prefill (metrics: not a decode token)
            if req is None or (reason == "prefill" and req.stage is not Stage.PREFILL):
                continue  # gone, or its first token came with its KV already (kv_in)
            mine.append((req, toks, finished, reason))
        s.metrics.step_out(w.id, w.home, made, prefills)
        admitted = cluster.end_step(w.id, [(req.routed, len(toks), finished) for req, toks, finished, _ in mine])
        for req, toks, finished, reason in mine:
            if reason == "prefill":
                req.stage = Stage.HANDOFF
            elif req.stage is Stage.PREFILL:
                if req.split and finished:  # it ended at its first token: the token worker's blocks go
                    s.chan.send(s.workers[req.routed.token_machine], Cancel(rid=req.wire))
                req.stage = Stage.DECODE
            if self.flow.deliver(req, toks, lps.get(req.wire)) and finished:
                cluster.prefixes.finished(req.routed, req.prompt_ids, req.delivered)  # its worker's cache holds them
                self.flow.complete(req, reason or "stop")
        self.flow.dispatch_all(admitted)

    def on_step_failed(self, w: WorkerInfo, rids: list[str], error: str) -> None:
        """A step of w's engine raised; it dropped the step's requests and lives on."""
        s = self.state
        names = ", ".join(s.reqs.by_wire[r].name for r in rids if r in s.reqs.by_wire) or "none left"
        logger.warning("router: worker %d: an engine step failed (%s); its requests: %s", w.id, error, names)
        for rid in rids:
            req = s.reqs.by_wire.get(rid)
            if req is None:
                continue
            req.strikes += 1
            if req.strikes >= QUARANTINE_STRIKES:
                s.metrics.splitwise.requests.labels("quarantined").inc()
                self.flow.fail(req, f"request {req.name} was in {req.strikes} failed engine steps and is quarantined: "
                                    f"it is not retried (last error: {error})", 500, "request_quarantined")
            else:
                req.isolated = True
                self.recovery.restart(req, f"worker {w.id}'s engine step failed: {error}", penalty=False)

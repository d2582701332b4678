"""How the router answers its workers' reports: a step began or ended, KV was reserved or landed,
a transfer or an engine step failed, a worker said hello or its heartbeat. A part of the Router
(router.py), kept apart because it is the one place where worker messages change requests.

Quarantine: a worker whose engine step raises survives it; it drops that step's requests and
reports them (`step_failed`). Each of them is restarted without penalty, isolated (its engine runs
it in steps of its own, so it cannot take others down with it again); a request that was in a
failed step twice is failed with an error that names it, and never retried.
"""

from __future__ import annotations

import sys
import time

from .messages import Cancel, Err, Hello, KvFail, KvIn, Message, Out, Reserved, Stage, Step, StepFailed
from .requests import LiveRequest
from .supervisor import WorkerInfo

QUARANTINE_STRIKES = 2  # failed engine steps a request may be part of; the next retry is refused


class WorkerReports:
    """The Router's handlers of worker messages (it provides reqs, cluster, chan, sup, metrics, boot and
    the request operations they call: _restart, _fail, _deliver, _complete, _begin,
    _send_prefill, _dispatch_all)."""

    def _on_message(self, w: WorkerInfo, msg: Message) -> None:
        w.last_seen = time.monotonic()
        get = self.reqs.by_wire.get
        if type(msg) is Out:
            self._on_step_end(w, msg.items, msg.lp or {})
        elif type(msg) is Step:
            bad = self.cluster.sched.check_report(msg.sched)   # the machine scheduler's own report
            if bad is not None:
                self.chan.malformed += 1
                print(f"router: worker {w.id} sent a malformed message: step: {bad}", file=sys.stderr)
                return
            live = lambda rids: [q.pr for q in map(get, rids) if q is not None]  # noqa: E731
            chunks = [(q, n) for q, n in ((get(rid), n) for rid, n in msg.chunks) if q is not None]
            now = time.perf_counter()
            # a request's first engine step (of any try) ends its queue time: when the worker formed
            # it, where the two share a clock; else when this report is read, unless its first token
            # overtook the report (kv_in) and that moment has passed
            at = min(msg.at, now) if w.same_clock and msg.at is not None else None
            for q, _ in chunks:
                if not q.scheduled_at and (at is not None or not q.first_at):
                    q.scheduled_at = at if at is not None else now
            chunks = [(q.pr, n) for q, n in chunks]
            sizes = dict(msg.chunks) if msg.cached else None
            for rid, k in msg.cached or ():  # prompts that start here, and what the worker's prefix cache gave them
                self.metrics.prefix_hit(k)
                if (q := get(rid)) is not None:
                    q.cached_tokens = k
                    self.cluster.prefix_reported(w.id, q.pr, sizes.get(rid, 0), k)  # the view corrected
            self.metrics.step(w.id, w.home, sum(n for _, n in msg.chunks), len(msg.preempted))
            back = self.cluster.step_started(w.id, chunks, live(msg.preempted), live(msg.joined), msg.sched,
                                             lambda rid: q.pr if (q := get(rid)) is not None else None,
                                             live(msg.grown or ()))
            if msg.preempted:
                self.metrics.recomputes.labels("in_place").inc(len(msg.preempted) - len(back))
                self.metrics.recomputes.labels("prompt_pool").inc(len(back))
            for r in back:  # preempted, to recompute through the prompt pool (--recompute prompt-pool)
                self._resume(self.reqs.by_policy[r.id])
        elif type(msg) is Reserved:
            req = get(msg.rid)
            if req is not None and req.stage is Stage.RESERVING:
                if msg.ok:
                    self.cluster.prefix_reserved(req.pr, msg.skip)
                    self._send_prefill(req, msg.blocks, msg.skip)
                elif msg.full:  # on demand: no room there now after all; it waits, no try lost
                    self.cluster.wait_for_room(req.pr)
                    req.stage = Stage.WAITING
                else:
                    self._restart(req, f"token worker could not reserve KV: {msg.msg}")
        elif type(msg) is KvIn:
            self._on_kv_in(msg, get(msg.rid))
        elif type(msg) is KvFail:
            self.metrics.transfer_failures.inc()
            req = get(msg.rid)
            if req is not None and req.stage in (Stage.RESERVING, Stage.PREFILL, Stage.HANDOFF):
                self._restart(req, msg.reason)
        elif type(msg) is StepFailed:
            self._on_step_failed(w, msg.rids, msg.error)
        elif type(msg) is Err:
            req = get(msg.rid)
            if req is not None:
                self._fail(req, f"worker {w.id} rejected the request: {msg.msg}", 400)
        elif type(msg) is Hello:
            self._on_hello(w, msg)
        else:  # Heartbeat
            w.free, w.blocks, w.reserved = msg.free, msg.blocks, msg.reserved
            w.running, w.rejected, w.preempted = msg.running, msg.rejected, msg.preempted

    def _on_hello(self, w: WorkerInfo, msg: Hello) -> None:
        if not self.sup.hello(w, msg.pid, time.monotonic()):
            return  # not the process we started
        w.kv_addr, w.blocks, w.block_size, w.kv_region = msg.kv_addr, msg.blocks, msg.block_size, msg.region
        w.same_clock = msg.boot is not None and msg.boot == self.boot
        w.free = w.start_free = msg.free
        w.max_len = msg.max_len
        if self.cluster is not None:
            self.cluster.up(w.id, w.kv_tokens)
            parked, self.reqs.parked = self.reqs.parked, []
            for req in parked:
                self._begin(req)

    def _on_kv_in(self, msg: KvIn, req: LiveRequest | None) -> None:
        self.metrics.transfer(msg.mode, msg.nbytes, msg.seconds, msg.exposed, msg.skipped or 0)
        if req is None:
            return
        if req.stage is Stage.PREFILL:  # the token worker may report before the prompt worker's word
            self.cluster.first_from_token_worker(req.pr)
            req.stage = Stage.HANDOFF
            self._deliver(req, [msg.first_token], msg.lp)
        if req.stage is Stage.HANDOFF:
            self._dispatch_all(self.cluster.kv_landed(req.pr))
            req.stage = Stage.DECODE

    def _on_step_end(self, w: WorkerInfo, items: list, lps: dict) -> None:
        """A step of w's ended with these tokens: the view's transitions for the whole step first
        (as the simulator's iteration end), then each request's tokens go to its client."""
        mine, made, prefills = [], 0, 0
        for rid, toks, finished, reason in items:
            req = self.reqs.by_wire.get(rid)
            made += len(toks)
            if reason == "prefill" or req is not None and self.cluster.awaiting_first(req.pr):
                prefills += 1  # the token that ends a prefill (metrics: not a decode token)
            if req is None or (reason == "prefill" and req.stage is not Stage.PREFILL):
                continue  # gone, or its first token came with its KV already (kv_in)
            mine.append((req, toks, finished, reason))
        self.metrics.step_out(w.id, w.home, made, prefills)
        admitted = self.cluster.end_step(w.id, [(req.pr, len(toks), finished) for req, toks, finished, _ in mine])
        for req, toks, finished, reason in mine:
            if reason == "prefill":
                req.stage = Stage.HANDOFF
            elif req.stage is Stage.PREFILL:
                if req.split and finished:  # it ended at its first token: the token worker's blocks go
                    self.chan.send(self.workers[req.pr.token_machine], Cancel(rid=req.wire))
                req.stage = Stage.DECODE
            if self._deliver(req, toks, lps.get(req.wire)) and finished:
                self.cluster.prefix_finished(req.pr, req.prompt_ids, req.delivered)  # its worker's cache holds them
                self._complete(req, reason or "stop")
        self._dispatch_all(admitted)

    def _on_step_failed(self, w: WorkerInfo, rids: list[str], error: str) -> None:
        """A step of w's engine raised; it dropped the step's requests and lives on."""
        names = ", ".join(self.reqs.by_wire[r].name for r in rids if r in self.reqs.by_wire) or "none left"
        print(f"router: worker {w.id}: an engine step failed ({error}); its requests: {names}",
              file=sys.stderr, flush=True)
        for rid in rids:
            req = self.reqs.by_wire.get(rid)
            if req is None:
                continue
            req.strikes += 1
            if req.strikes >= QUARANTINE_STRIKES:
                self.metrics.requests.labels("quarantined").inc()
                self._fail(req, f"request {req.name} was in {req.strikes} failed engine steps and is quarantined: "
                                f"it is not retried (last error: {error})", 500, "request_quarantined")
            else:
                req.isolated = True
                self._restart(req, f"worker {w.id}'s engine step failed: {error}", penalty=False)

"""A request's way through the workers, as the router sends it (docs/architecture.md: a request's
life): route one try with the policy view, send the work, hand the client its tokens, end it.

    unsplit (mixed worker, baseline, or one output token):  gen(kind=full) -> worker
    split:  expect -> token worker (reserve KV) ... reserved -> gen(kind=prefill) -> prompt worker;
            its first token streams to the client at once; kv_in from the token worker when the
            KV landed; then decode tokens

A request that finds no live worker parks (up to `park_timeout_s`; the monitor routes it again,
recovery.py). A restarted try makes its tokens again: those the client has are checked, not sent
twice (`deliver`).
"""

from __future__ import annotations

import time

from ..policy.cluster import moves_kv
from ..policy.state import Request
from .cluster_state import NoWorkers
from .messages import Abort, Expect, Gen, Stage
from .requests import LiveRequest
from .router_state import RouterState


class RequestFlow:
    """The request operations every part of the router calls, over the shared `RouterState`."""

    def __init__(self, state: RouterState) -> None:
        self.state = state

    # ---- routing and sending ------------------------------------------------------------------
    def begin(self, req: LiveRequest) -> None:
        """Route one try of `req` and send it on its way (or park it / let it wait for memory)."""
        s = self.state
        r = s.reqs.new_try(req, time.perf_counter(), s.policy_view.view.prefix)
        try:
            go = s.policy_view.arrive(r)
        except NoWorkers as e:
            self.park(req, str(e))
            return
        s.reqs.track(req)
        if go:
            self.dispatch(req)
        else:
            req.stage = Stage.WAITING

    def park(self, req: LiveRequest, why: str) -> None:
        """No worker can take `req` now: it waits (the monitor routes it again), or fails once it
        has waited `park_timeout_s`."""
        if not req.parked_at:
            req.parked_at = time.monotonic()
        req.stage = Stage.PARKED
        if time.monotonic() - req.parked_at > self.state.cfg.park_timeout_s:
            self.fail(req, f"no worker could take the request: {why}", 503)
        else:
            self.state.reqs.parked.append(req)

    def dispatch(self, req: LiveRequest) -> None:
        s = self.state
        r = req.routed
        p, t = s.workers[r.prompt_machine], s.workers[r.token_machine]
        req.split = moves_kv(r)
        ids, params, resumed = req.work()
        if req.split:
            req.stage = Stage.RESERVING
            s.chan.send(t, Expect(rid=req.wire, prompt_ids=ids, params=params, src=p.id, isolated=req.isolated,
                                  resumed=resumed))
        else:
            req.stage = Stage.PREFILL
            self.queried(req)
            s.chan.send(p, Gen(rid=req.wire, prompt_ids=ids, params=params, kind="full", isolated=req.isolated,
                               predicted=r.predicted or None, resumed=resumed))

    def queried(self, req: LiveRequest) -> None:
        """Its prompt goes to a worker that looks it up in its prefix cache (a scored prompt is not)."""
        cluster = self.state.policy_view
        if cluster.view.prefix is not None and req.params.prompt_logprobs is None:
            self.state.metrics.prefix_queried(len(req.prompt_ids))
            cluster.prefixes.sent(req.routed)   # what the router's view expects the worker's cache to give

    def send_prefill(self, req: LiveRequest, blocks: list[int] | None = None, skip: int | None = None) -> None:
        """The prompt worker's `gen` (kind prefill): the KV to the token worker (`blocks`: one-sided; `skip`: held)."""
        s = self.state
        r = req.routed
        t = s.workers[r.token_machine]
        req.stage = Stage.PREFILL
        self.queried(req)
        one_sided = t.kv_region is not None  # the prompt worker writes into these blocks
        ids, params, resumed = req.work()
        s.chan.send(s.workers[r.prompt_machine], Gen(
            rid=req.wire, prompt_ids=ids, params=params, kind="prefill", isolated=req.isolated,
            dest=t.id, dest_ident=t.ident.decode(), dest_addr=t.kv_addr, threshold=s.cfg.policy.layerwise_threshold,
            region=t.kv_region if one_sided else None, blocks=blocks if one_sided else None, skip=skip,
            resumed=resumed))

    def dispatch_all(self, admitted: list[Request]) -> None:
        """Send the requests the policy view admitted (they waited for KV memory)."""
        for r in admitted:
            req = self.state.reqs.by_policy.get(r.id)
            if req is not None and req.stage is Stage.WAITING:
                self.dispatch(req)

    # ---- the client's side -------------------------------------------------------------------
    def deliver(self, req: LiveRequest, toks: list[int], lp: list | None = None) -> bool:
        """Send the client `toks`, those of them it does not have yet (a restarted try makes them
        again), with their logprob records where it asked (`lp`: [records of `toks`, the prompt's
        records or None], messages/kinds.py Out.lp). False: the request failed (a new try's tokens
        differ from those sent)."""
        fresh = []
        for tok in toks:
            i = req.produced
            req.produced += 1
            if i < len(req.delivered):
                if req.delivered[i] != tok:
                    self.fail(req, "the request was restarted after a worker failure and the new "
                                   "try's tokens differ from those already sent (sampling "
                                   "without a seed); it cannot be resumed", 500)
                    return False
            else:
                fresh.append(tok)
        if fresh:
            self._hand_out(req, fresh, lp)
        return True

    def _hand_out(self, req: LiveRequest, fresh: list[int], lp: list | None) -> None:
        """`fresh` tokens to the client's queue, timed for the metrics."""
        now = time.perf_counter()
        metrics = self.state.metrics
        if not req.delivered:
            req.first_at = now
            req.routed.first_token_at = now   # the policy view's token time: Aladdin's (d) reads it
            metrics.first_token(now - req.created, len(req.prompt_ids), len(fresh))
        else:
            metrics.tokens(now - req.last_at, len(fresh))
        req.last_at = now
        req.delivered.extend(fresh)
        recs = None
        if lp is not None:
            if req.prompt_logprobs is None:
                req.prompt_logprobs = lp[1]
            recs = lp[0][len(lp[0]) - len(fresh):] if lp[0] is not None else None
        req.queue.put_nowait(("tokens", fresh, recs))

    # ---- ending ------------------------------------------------------------------------------
    def complete(self, req: LiveRequest, reason: str) -> None:
        self.state.reqs.end(req)
        req.finish_reason = reason
        self.state.metrics.completed(req, reason, time.perf_counter())
        req.queue.put_nowait(("done", reason))

    def release(self, req: LiveRequest) -> None:
        """Undo the current try everywhere: policy view and the workers holding it."""
        s = self.state
        r = req.pr
        if r is None or req.wire not in s.reqs.by_wire:
            return
        admitted = s.policy_view.release(r, req.prompt_ids + req.delivered[:req.produced])
        for wid in {r.prompt_machine, r.token_machine}:
            if 0 <= wid < len(s.workers) and s.workers[wid].up:
                # prefill_sent: the prompt worker may have written (one-sided) into the token worker's blocks
                s.chan.send(s.workers[wid], Abort(
                    rid=req.wire, prefill_sent=req.stage in (Stage.PREFILL, Stage.HANDOFF, Stage.DECODE)))
        s.reqs.untrack(req)
        self.dispatch_all(admitted)

    def fail(self, req: LiveRequest, message: str, status: int, code: str | None = None) -> None:
        """End `req` with an error for its client (HTTP `status`, OpenAI error `code`)."""
        if req.stage is Stage.DONE:
            return
        self.release(req)
        self.state.reqs.end(req)
        self.state.metrics.splitwise.requests.labels("failed").inc()
        req.queue.put_nowait(("error", message, status, code))

    def cancel(self, req: LiveRequest) -> None:
        """The client went away: stop the work."""
        if req.stage is Stage.DONE:
            return
        self.release(req)
        self.state.reqs.end(req)
        self.state.metrics.splitwise.requests.labels("cancelled").inc()

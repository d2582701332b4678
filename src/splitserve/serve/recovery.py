"""How the router recovers: a worker goes down, a request restarts, and the monitor that notices.
A part of the Router (router.py), kept apart as the one place where failures turn into retries.

A request restarts from the start on the live workers (tokens the client already has are checked
against the new ones, request_flow.py `deliver`), at most `max_attempts` times. A request that
finds no live worker parks for up to `park_timeout_s` (request_flow.py `park`), and the monitor
routes it again on each tick.

Before judging a worker silent, the monitor reads every message already queued, and time during
which the router's own loop stood still (a long callback, a stopped process) does not count as a
worker's silence (supervisor.py `Supervisor.paused`).
"""

from __future__ import annotations

import asyncio
import time

from .cluster_state import NoWorkers
from .messages import PeerDown, Ping, Stage
from .request_flow import RequestFlow
from .requests import LiveRequest
from .router_state import RouterState
from .router_watch import RouterWatch
from .supervisor import WorkerInfo

PING_S = 1.0
MONITOR_S = 0.05
PAUSE_S = 0.5  # a monitor tick this late means the router itself stood still


class Recovery:
    """The Router's failure handling: restarts and resumes through `flow`, the liveness monitor
    (which also ticks the cluster scheduler's `watch`), a worker taken out."""

    def __init__(self, state: RouterState, flow: RequestFlow, watch: RouterWatch) -> None:
        self.state, self.flow, self.watch = state, flow, watch

    def restart(self, req: LiveRequest, why: str, penalty: bool = True) -> None:
        """Try `req` again from the start; `penalty`: this counts against its `max_attempts`."""
        if req.stage is Stage.DONE:
            return
        self.flow.release(req)
        if penalty:
            req.attempt += 1
            if req.attempt >= self.state.cfg.max_attempts:
                self.flow.fail(req, f"the request failed {req.attempt} times; last: {why}", 503)
                return
        self.state.metrics.splitwise.restarts.inc()
        self.flow.begin(req)

    def resume(self, req: LiveRequest) -> None:
        """`req`'s token worker preempted it to recompute through the prompt pool (`--recompute
        prompt-pool`): it is routed again as at its arrival, its prompt and the tokens it made
        prefilled anew (LiveRequest.work), under a new wire id; no worker for it: it starts again
        from the start."""
        self.state.reqs.rewire(req)
        try:
            go = self.state.policy_view.arrive(req.routed, again=True)
        except NoWorkers as e:
            self.restart(req, str(e), penalty=False)
            return
        if go:
            self.flow.dispatch(req)
        else:
            req.stage = Stage.WAITING

    # ---- liveness ----------------------------------------------------------------------------
    async def monitor_loop(self) -> None:
        s = self.state
        next_ping = 0.0
        tick = time.monotonic()
        while True:
            await asyncio.sleep(MONITOR_S)
            s.chan.drain_all()  # read what is queued before judging anyone silent
            now = time.monotonic()
            if now - tick > MONITOR_S + PAUSE_S:  # this loop stood still: a pause of ours is no one's silence
                s.supervisor.paused(now - tick - MONITOR_S)
            tick = now
            s.supervisor.check(now)
            self.watch.tick(now)
            if now >= next_ping:
                next_ping = now + PING_S
                for w in s.workers:
                    if w.up:
                        s.chan.send(w, Ping())
            self.retry_parked()

    def retry_parked(self) -> None:
        """Route each parked request again (one that finds no worker parks anew)."""
        reqs = self.state.reqs
        if reqs.parked:
            parked, reqs.parked = reqs.parked, []
            for req in parked:
                if req.stage is Stage.PARKED:
                    self.flow.begin(req)

    def worker_down(self, w: WorkerInfo, why: str) -> None:
        """The supervisor took w out (dead or hung): restart what it held, tell its peers."""
        s = self.state
        s.policy_view.view.down(w.id)
        for req in s.reqs.on_worker(w.id):
            self.restart(req, f"worker {w.id} failed ({why})")
        for other in s.workers:
            if other.up:
                s.chan.send(other, PeerDown(peer=w.id))

"""How the router recovers: a worker goes down, a request restarts or parks, and the monitor
that notices. A part of the Router (router.py), kept apart as the one place where failures turn
into retries.

A request restarts from the start on the live workers (tokens the client already has are checked
against the new ones, router.py `_deliver`), at most `max_attempts` times. A request that finds no
live worker parks for up to `park_timeout_s`, and the monitor routes it again on each tick.

Before judging a worker silent, the monitor reads every message already queued, and time during
which the router's own loop stood still (a long callback, a stopped process) does not count as a
worker's silence (supervisor.py `Supervisor.paused`).
"""

from __future__ import annotations

import asyncio
import time

from .cluster_state import NoWorkers
from .messages import PeerDown, Ping, Stage
from .requests import LiveRequest
from .supervisor import WorkerInfo

PING_S = 1.0
MONITOR_S = 0.05
PAUSE_S = 0.5  # a monitor tick this late means the router itself stood still


class Recovery:
    """The Router's failure handling (it provides cfg, reqs, cluster, chan, sup, workers, metrics
    and the request operations _release, _fail, _begin and _dispatch)."""

    def _park(self, req: LiveRequest, why: str) -> None:
        if not req.parked_at:
            req.parked_at = time.monotonic()
        req.stage = Stage.PARKED
        if time.monotonic() - req.parked_at > self.cfg.park_timeout_s:
            self._fail(req, f"no worker could take the request: {why}", 503)
        else:
            self.reqs.parked.append(req)

    def _restart(self, req: LiveRequest, why: str, penalty: bool = True) -> None:
        """Try `req` again from the start; `penalty`: this counts against its `max_attempts`."""
        if req.stage is Stage.DONE:
            return
        self._release(req)
        if penalty:
            req.attempt += 1
            if req.attempt >= self.cfg.max_attempts:
                self._fail(req, f"the request failed {req.attempt} times; last: {why}", 503)
                return
        self.metrics.restarts.inc()
        self._begin(req)

    def _resume(self, req: LiveRequest) -> None:
        """`req`'s token worker preempted it to recompute through the prompt pool (`--recompute
        prompt-pool`): it is routed again as at its arrival, its prompt and the tokens it made
        prefilled anew (LiveRequest.work); no worker for it: it starts again from the start."""
        try:
            go = self.cluster.arrive(req.pr, again=True)
        except NoWorkers as e:
            self._restart(req, str(e), penalty=False)
            return
        if go:
            self._dispatch(req)
        else:
            req.stage = Stage.WAITING

    # ---- liveness ----------------------------------------------------------------------------
    async def _monitor_loop(self) -> None:
        next_ping = 0.0
        tick = time.monotonic()
        while True:
            await asyncio.sleep(MONITOR_S)
            self.chan.drain_all()  # read what is queued before judging anyone silent
            now = time.monotonic()
            if now - tick > MONITOR_S + PAUSE_S:  # this loop stood still: a pause of ours is no one's silence
                self.sup.paused(now - tick - MONITOR_S)
            tick = now
            self.sup.check(now)
            self._watch(now)
            if now >= next_ping:
                next_ping = now + PING_S
                for w in self.workers:
                    if w.up:
                        self.chan.send(w, Ping())
            if self.reqs.parked:
                parked, self.reqs.parked = self.reqs.parked, []
                for req in parked:
                    if req.stage is Stage.PARKED:
                        self._begin(req)

    def _worker_down(self, w: WorkerInfo, why: str) -> None:
        """The supervisor took w out (dead or hung): restart what it held, tell its peers."""
        self.cluster.down(w.id)
        for req in self.reqs.on_worker(w.id):
            self._restart(req, f"worker {w.id} failed ({why})")
        for other in self.workers:
            if other.up:
                self.chan.send(other, PeerDown(peer=w.id))

"""The cluster scheduler's watcher, live: TetriInfer's instance flips (policy/instance_flip.py) and
Aladdin's heartbeat (policy/aladdin_scaling.py), every `watch_interval` seconds of the router's
monitor loop (recovery.py). A part of the Router (router.py)."""

from __future__ import annotations

from ..policy.state import Machine
from .router_state import RouterState


class RouterWatch:
    """The Router's watcher. Its own state: when it runs next, and the flips so far (in order)."""

    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.next_at = 0.0
        self.flips: list[dict] = []       # instance flips (--cluster-scheduler tetriinfer), in order

    def tick(self, now: float) -> None:
        """The cluster scheduler's watcher (TetriInfer's instance flip, policy/instance_flip.py), every
        `watch_interval` seconds from the monitor loop. A worker flips only when the policy view
        holds nothing of it and its own last heartbeat says it runs and reserves nothing; it needs
        no message: a worker runs whatever it is sent (worker.py), its role is the router's."""
        s = self.state
        view = s.policy_view.view
        interval = view.cls.watch_interval
        if not interval or now < self.next_at:
            return
        self.next_at = now + interval
        for wid in view.watch(now, self.quiet):
            w = s.workers[wid]
            w.home = view.machines[wid].pool.name.lower()
            self.flips.append({"at": now, "worker": wid, "to": w.home, "in_flight": len(s.reqs)})
            s.metrics.splitwise.flips.labels(w.home).inc()

    def quiet(self, m: Machine) -> bool:
        """Worker `m.id`'s last heartbeat says it runs and reserves nothing."""
        w = self.state.workers[m.id]
        return w.up and w.running == 0 and w.reserved == 0

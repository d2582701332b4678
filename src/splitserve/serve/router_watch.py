"""The cluster scheduler's watcher, live: TetriInfer's instance flips (policy/instance_flip.py) and
Aladdin's heartbeat (policy/aladdin_scaling.py), every `watch_interval` seconds of the router's
monitor loop (recovery.py). A part of the Router (router.py)."""

from __future__ import annotations

from ..policy.state import Machine


class RouterWatch:
    """The Router's watcher (its state is the router's: `_next_watch`, `flips`)."""

    def _watch(self, now: float) -> None:
        """The cluster scheduler's watcher (TetriInfer's instance flip, policy/instance_flip.py), every
        `watch_interval` seconds from the monitor loop. A worker flips only when the policy view
        holds nothing of it and its own last heartbeat says it runs and reserves nothing; it needs
        no message: a worker runs whatever it is sent (worker.py), its role is the router's."""
        interval = self.cluster.cls.watch_interval
        if not interval or now < self._next_watch:
            return
        self._next_watch = now + interval
        for wid in self.cluster.watch(now, self._quiet):
            w = self.workers[wid]
            w.home = self.cluster.machines[wid].pool.name.lower()
            self.flips.append({"at": now, "worker": wid, "to": w.home, "in_flight": len(self.reqs)})
            self.metrics.flips.labels(w.home).inc()

    def _quiet(self, m: Machine) -> bool:
        w = self.workers[m.id]
        return w.up and w.running == 0 and w.reserved == 0

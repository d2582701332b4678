"""What the router shows of itself: its health (/health), the policy view's machines and the
debug state (/debug/state). A part of the Router (router.py)."""

from __future__ import annotations

from .cluster_view import ClusterView
from .router_state import RouterState
from .router_watch import RouterWatch


def snapshot(view: ClusterView) -> list[dict]:
    """Each machine of the router's policy view (serve/cluster_view.py), as /debug/state shows it."""
    return [{"id": m.id, "alive": a, "home": m.home.name.lower(), "pool": m.pool.name.lower(),
             "pending": m.pending, "kv_used": m.kv_used, "kv_capacity": m.kv_capacity,
             "prompt_queue": len(m.prompt_queue), "prefill_tokens_running": m.running_prompt_tokens,
             "admit_queue": len(m.admit_queue), "running": len(m.running), "accepting": view.accepting(m)}
            for m, a in zip(view.machines, view.alive)]


def idle(view: ClusterView) -> bool:
    """Every live machine of the view holds nothing, its counters back at zero."""
    return all(m.pending == 0 and m.kv_used == 0 and m.recount_pending() == 0
               and not (m.prompt_queue or m.running or m.ready or m.admit_queue or m.decode_queue)
               for m, a in zip(view.machines, view.alive) if a)


class RouterViews:
    """The Router's read-only views of the shared state and of the watcher's flips."""

    def __init__(self, state: RouterState, watch: RouterWatch) -> None:
        self.state, self.watch = state, watch

    def health(self) -> tuple[bool, dict]:
        s = self.state
        if s.sup is None or not s.ready:
            return False, {"status": "starting"}
        ok, body = s.sup.health(s.cfg.split)
        if s.draining or s.closing:
            ok, body["status"], body["reason"] = False, "draining", "the server is shutting down"
        return ok, body

    def cluster_snapshot(self) -> list[dict]:
        cluster = self.state.cluster
        return snapshot(cluster.view) if cluster is not None else []

    def borrowed(self) -> int:
        """Machines the cluster scheduler has moved into the mixed pool so far."""
        cluster = self.state.cluster
        return cluster.view.cls.borrowed if cluster is not None else 0

    def debug_state(self) -> dict:
        s = self.state
        chan = s.chan
        return {
            "workers": [{"id": w.id, "home": w.home, "up": w.up, "state": w.state.value, "pid": w.pid,
                         "blocks": w.blocks, "free": w.free, "start_free": w.start_free, "reserved": w.reserved,
                         "running": w.running, "preempted": w.preempted, "rejected_messages": w.rejected,
                         "restarts": w.restarts, "failures": w.failures, "last_failure": w.last_failure,
                         "kv_addr": w.kv_addr} for w in s.workers],
            "machines": self.cluster_snapshot(),
            "policy_idle": idle(s.cluster.view) if s.cluster is not None else True,
            "flips": self.watch.flips,
            "in_flight": len(s.reqs),
            "parked": len(s.reqs.parked),
            "router_address": chan.address,
            "kv_encryption": chan.curve is not None,
            "rejected_messages": chan.rejected,
            "rejected_by": {**chan.codec.rejected_by, "stranger": chan.strangers,
                            "malformed": chan.malformed},
        }

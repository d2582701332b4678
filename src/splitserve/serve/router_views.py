"""What the router shows of itself: its health (/health), the policy view's machines and the
debug state (/debug/state). A part of the Router (router.py)."""

from __future__ import annotations


def snapshot(cluster) -> list[dict]:
    """Each machine of the router's policy view (serve/cluster_state.py LiveCluster), as /debug/state shows it."""
    return [{"id": m.id, "alive": a, "home": m.home.name.lower(), "pool": m.pool.name.lower(),
             "pending": m.pending, "kv_used": m.kv_used, "kv_capacity": m.kv_capacity,
             "prompt_queue": len(m.prompt_queue), "prefill_tokens_running": m.running_prompt_tokens,
             "admit_queue": len(m.admit_queue), "running": len(m.running), "accepting": cluster.accepting(m)}
            for m, a in zip(cluster.machines, cluster.alive)]


def idle(cluster) -> bool:
    """Every live machine of the view holds nothing, its counters back at zero."""
    return all(m.pending == 0 and m.kv_used == 0 and m.recount_pending() == 0
               and not (m.prompt_queue or m.running or m.ready or m.admit_queue or m.decode_queue)
               for m, a in zip(cluster.machines, cluster.alive) if a)


class RouterViews:
    """The Router's read-only views (its state is the router's)."""

    def health(self) -> tuple[bool, dict]:
        if self.sup is None or not self.ready:
            return False, {"status": "starting"}
        ok, body = self.sup.health(self.cfg.split)
        if self.draining or self.closing:
            ok, body["status"], body["reason"] = False, "draining", "the server is shutting down"
        return ok, body

    def cluster_snapshot(self) -> list[dict]:
        return snapshot(self.cluster) if self.cluster is not None else []

    def borrowed(self) -> int:
        """Machines the cluster scheduler has moved into the mixed pool so far."""
        return self.cluster.cls.borrowed if self.cluster is not None else 0

    def debug_state(self) -> dict:
        return {
            "workers": [{"id": w.id, "home": w.home, "up": w.up, "state": w.state.value, "pid": w.pid,
                         "blocks": w.blocks, "free": w.free, "start_free": w.start_free, "reserved": w.reserved,
                         "running": w.running, "preempted": w.preempted, "rejected_messages": w.rejected,
                         "restarts": w.restarts, "failures": w.failures, "last_failure": w.last_failure,
                         "kv_addr": w.kv_addr} for w in self.workers],
            "machines": self.cluster_snapshot(),
            "policy_idle": idle(self.cluster) if self.cluster is not None else True,
            "flips": self.flips,
            "in_flight": len(self.reqs),
            "parked": len(self.reqs.parked),
            "router_address": self.address,
            "kv_encryption": self.curve is not None,
            "rejected_messages": self.chan.rejected,
            "rejected_by": {**self.chan.codec.rejected_by, "stranger": self.chan.strangers,
                            "malformed": self.chan.malformed},
        }

"""What the router shows of itself: its health (/health), the policy view's machines and the
debug state (/debug/state). A part of the Router (router.py)."""

from __future__ import annotations


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
        return self.cluster.snapshot() if self.cluster is not None else []

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
            "policy_idle": self.cluster.idle() if self.cluster is not None else True,
            "flips": self.flips,
            "in_flight": len(self.reqs),
            "parked": len(self.reqs.parked),
            "router_address": self.address,
            "kv_encryption": self.curve is not None,
            "rejected_messages": self.chan.rejected,
            "rejected_by": {**self.chan.codec.rejected_by, "stranger": self.chan.strangers,
                            "malformed": self.chan.malformed},
        }

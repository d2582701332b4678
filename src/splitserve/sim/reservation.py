"""A split request's prompt waits for its token machine's reservation, answered between steps.

In `serve` the router asks the token worker to reserve a split request's KV (`expect`) before it
sends the prompt to the prompt worker, and a worker reads its messages between two engine steps:
while the token worker runs a step, the prompt of a request that arrives waits for that step's
end, even on an idle prompt worker (benchmarks/twin/README.md: 2-10 points of the live runs'
TTFT P50). A simulation of a measured machine (`Hosts.reserves_between_steps`) does the same: an
idle prompt machine starts such a prompt when its token machine's step in flight ends. The
catalog's machines reserve at once. A part of `Simulation` (sim/simulator.py)."""

from __future__ import annotations

from mypy_extensions import trait

from ..policy.cluster import moves_kv
from ..policy.state import Machine, Request


@trait
class StepReservations:
    """Simulation's prompt machines waiting for a token machine's step to end (by its id)."""

    machines: list[Machine]
    batches: list[tuple | None]
    awaiting: dict[int, list[Machine]]

    def _start(self, m: Machine, now: float) -> None: ...

    def _reserving(self, r: Request, p: Machine) -> bool:
        """Whether idle prompt machine `p` waits for `r`'s token machine to answer between steps."""
        t = r.token_machine
        if p.busy or not moves_kv(r) or self.batches[t] is None:
            return False
        self.awaiting.setdefault(t, []).append(p)
        return True

    def _reserved(self, t: Machine, now: float) -> None:
        """Token machine `t` is between steps: the prompt machines waiting on it may start."""
        waiting = self.awaiting.pop(t.id, None)
        if waiting is not None:
            for p in waiting:
                if not p.busy:
                    self._start(p, now)

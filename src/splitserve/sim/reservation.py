"""A split request's prompt waits for its token machine's reservation, answered between steps.

In `serve` the router asks the token worker to reserve a split request's KV (`expect`) before it
sends the prompt to the prompt worker, and a worker reads its messages between two engine steps:
while the token worker runs a step, the prompt of a request that arrives reaches the prompt
worker only at that step's end: an idle prompt worker waits for it, and a busy one that ends its
step first starts its next without it. A simulation of a measured machine
(`Hosts.reserves_between_steps`) does the same: such a prompt joins its prompt machine's queue
when its token machine's step in flight ends. The catalog's machines reserve at once."""

from __future__ import annotations

from ..policy.cluster import moves_kv
from ..policy.state import Machine, Request
from .state import SimState


class StepReservations:
    """The split requests waiting for their token machine's step to end (by its id), each with its
    prompt machine, out of that machine's prompt queue meanwhile."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.awaiting: dict[int, list[tuple[Request, Machine]]] = {}

    def holds(self, r: Request, p: Machine) -> bool:
        """Whether `r`, just queued on prompt machine `p`, waits for its token machine to answer
        between steps: then it leaves `p`'s prompt queue (its counters keep it: the router counts
        it queued) until that machine's step in flight ends, and no batch of `p` takes it. Asked
        whether `p` is busy or not (before the simulation tries to start `p`)."""
        t = r.token_machine
        if (not moves_kv(r) or self.state.running[t] is None or not p.prompt_queue
                or p.prompt_queue[-1] is not r):
            return False
        p.prompt_queue.pop()
        self.awaiting.setdefault(t, []).append((r, p))
        return True

    def answered(self, t: Machine) -> list[tuple[Request, Machine]] | None:
        """Token machine `t` is between steps: the prompts waiting on it join their prompt
        machines' queues, in the order they arrived (their prompts reach the worker in that
        order). Returns them with their prompt machines (the idle ones start), or None."""
        waiting = self.awaiting.pop(t.id, None)
        if waiting is not None:
            for r, p in waiting:
                p.prompt_queue.append(r)
        return waiting

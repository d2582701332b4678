"""Aladdin's corrections of predicted lengths (policy/aladdin.py).

Corrections (§4.3, Algorithm 2). When a worker's settle finds a request that has generated its
predicted length and goes on (underestimated), its length is predicted again: the mean of the last
HISTORY finished outputs longer than what it has generated (the paper's conditional average, not
conditioned on the input length: ASSUMED), or twice what it has generated with fewer than
MIN_HISTORY such outputs (ASSUMED). A request that ends early (overestimated) leaves its worker's
demand at once. splitserve dispatches a request to its worker at arrival, so nothing placed can
move without restarting it (and Aladdin itself never migrates, §5.3): the corrected demand steers
the placements that follow, which is Algorithm 2's effect (new requests go to the workers whose
estimated load is lower) without its re-assignment of requests placed in the same heartbeat.
"""

from __future__ import annotations

import bisect

from .aladdin_scaling import ACTIVE, DRAINING, idle
from .latency import GAMMA
from .state import Machine, Phase, Request

HISTORY = 1000         # ASSUMED: finished outputs kept for re-prediction
MIN_HISTORY = 10       # ASSUMED: fewer longer outputs than this: double instead


class Corrections:
    """AladdinScheduler's settle: finished requests leave their worker's demand, underestimated
    ones are predicted again (its state is the scheduler's: policy/aladdin.py)."""

    def settle(self, m: Machine) -> None:
        """After `m`'s step: finished requests leave its demand (their lengths join the history);
        one that has generated its predicted length and goes on is predicted again. A step gives
        each request at most one token, so the scan waits until one may have ended or reached its
        prediction (the countdown), or a running decode left (ended early, live)."""
        mid = m.id
        placed = self.placed.get(mid)
        if not placed:                  # a prompt machine of a split design, or an empty one
            if self.state.get(mid) == DRAINING and idle(m):
                self._off(m)
            return
        c = self.countdown[mid] - 1
        n = len(m.running)
        if c > 0 and n >= self.nrun[mid] and self.state[mid] == ACTIVE:
            self.countdown[mid] = c
            self.nrun[mid] = n
            return
        self._scan(m)
        if self.state.get(mid) == DRAINING and idle(m):
            self._off(m)

    def _scan(self, m: Machine) -> None:
        mid = m.id
        keep = []
        ctx = 0.0
        fin = 0
        due = 1 << 30
        preds = self.pred
        for q in self.placed[mid]:
            if q.phase is Phase.DONE:
                self._finished(q)
                continue
            p = preds[q.id]
            if q.generated >= p:
                p = preds[q.id] = self.repredict(q.generated)
                self.corrections += 1
            keep.append(q)
            ctx += q.prompt_tokens + GAMMA * p
            fin += q.prompt_tokens + p
            s = steps(q, p)
            if s < due:
                due = s
        self.placed[mid] = keep
        self.load[mid] = (len(keep), ctx, fin)
        self.countdown[mid] = due
        self.nrun[mid] = len(m.running)

    def repredict(self, generated: int) -> int:
        """A new predicted length for a request that has generated `generated` tokens and goes on."""
        h = self.hist
        i = bisect.bisect_right(h, generated)
        if len(h) - i >= MIN_HISTORY:
            return max(generated + 1, -(-sum(h[i:]) // (len(h) - i)))
        return 2 * generated

    def _finished(self, q: Request) -> None:
        self.pred.pop(q.id, None)
        if q.generated > 0:
            bisect.insort(self.hist, q.generated)
            self.hist_order.append(q.generated)
            if len(self.hist_order) > HISTORY:
                old = self.hist_order.popleft()
                del self.hist[bisect.bisect_left(self.hist, old)]


def steps(q: Request, pred: int) -> int:
    """Steps of its machine before `q` may end or pass `pred` (its first token may come from
    another machine, its prompt machine)."""
    return min(pred, q.output_tokens) - q.generated - (q.generated == 0)

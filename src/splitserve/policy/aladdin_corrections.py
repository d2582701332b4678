"""Aladdin's view of the demand placed on each worker (policy/aladdin.py), by predicted output
lengths, and its corrections of those predictions.

Each request placed on a worker counts by its prediction until it finishes: (requests,
sum(l_in + GAMMA * pred), sum(l_in + pred)) for the ATGT constraint (b) and capacity_norm, and its
KV growing one token per iteration from prompt + generated to prompt + pred (`kv_peak`) for (e).

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
import math
from collections import deque

from .latency import GAMMA
from .predictor import LengthPredictor
from .state import Machine, Phase, Request

HISTORY = 1000         # ASSUMED: finished outputs kept for re-prediction
MIN_HISTORY = 10       # ASSUMED: fewer longer outputs than this: double instead


def kv_peak(items: list[tuple[int, int]]) -> int:
    """The highest KV demand of requests (`rem` more iterations each, now holding `cur` tokens),
    each growing one token per iteration and freeing all at its end: max over k of
    sum over rem >= k of (cur + k); the maximum is at k = 0 or at some request's last iteration."""
    if not items:
        return 0
    items.sort()
    n = len(items)
    peak = suffix = 0
    for i in range(n - 1, -1, -1):
        rem, cur = items[i]
        suffix += cur
        if i == 0 or items[i - 1][0] != rem:
            v = suffix + (n - i) * rem
            if v > peak:
                peak = v
    return peak


class Corrections:
    """The predictions (`pred`, by request id) and the demand placed on each worker (`placed`,
    `load`, by machine id), kept as of the worker's last settle, and the finished lengths
    re-predictions read (`hist`)."""

    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor
        self.pred: dict[int, int] = {}
        self.placed: dict[int, list[Request]] = {}
        self.load: dict[int, tuple[int, float, int]] = {}   # (requests, sum(l_in + GAMMA pred),
                                                            # sum(l_in + pred)) of those placed there
        self.countdown: dict[int, int] = {}     # settles before a placed request may end or outlive
                                                # its prediction (no scan before)
        self.nrun: dict[int, int] = {}          # its running decodes at the last settle
        self.hist: list[int] = []               # finished output lengths, sorted
        self.hist_order: deque[int] = deque()
        self.corrections = 0

    def add(self, mid: int) -> None:
        """Machine `mid` joins, holding nothing."""
        self.placed[mid] = []
        self.load[mid] = (0, 0.0, 0)
        self.countdown[mid] = self.nrun[mid] = 0

    def remove(self, mid: int) -> None:
        """Machine `mid` is gone: what was placed there leaves the demand."""
        for r in self.placed.get(mid, ()):
            self.pred.pop(r.id, None)
        self.placed[mid] = []
        self.load[mid] = (0, 0.0, 0)

    def predicted(self, r: Request) -> int:
        """`r`'s predicted output length: the midpoint of its predicted range, or its correction."""
        p = self.pred.get(r.id)
        if p is None:
            lo, hi = self.predictor.predict(r.id, r.prompt_tokens, r.output_tokens)
            p = self.pred[r.id] = max(1, (lo + hi) // 2)
        return p

    def place(self, mid: int, r: Request, pred: int) -> None:
        """`r`, predicted to make `pred` tokens, joins machine `mid`'s demand."""
        self.placed[mid].append(r)
        self.countdown[mid] = min(self.countdown[mid], steps(r, pred))
        n, ctx, fin = self.load[mid]
        self.load[mid] = (n + 1, ctx + r.prompt_tokens + GAMMA * pred, fin + r.prompt_tokens + pred)

    def rank(self, m: Machine) -> tuple[float, int]:
        """Best fit's order: capacity_norm, |(requests, sum(l_in + GAMMA pred))|, then the lower id."""
        n, ctx, _ = self.load[m.id]
        return math.hypot(n, ctx), -m.id

    def kv_fits(self, m: Machine, r: Request, pred: int) -> bool:
        """(e): `m`'s predicted KV demand with `r` (predicted `pred`) never passes its capacity."""
        if self.load[m.id][2] + r.prompt_tokens + pred <= m.kv_capacity:   # every one at its end at once
            return True
        items = [(pred, r.prompt_tokens)]
        preds = self.pred
        for q in self.placed[m.id]:
            if q.phase is not Phase.DONE:
                items.append((max(preds[q.id] - q.generated, 0), q.prompt_tokens + q.generated))
        return kv_peak(items) <= m.kv_capacity

    def refresh(self, m: Machine) -> None:
        """Before a placement reads `m`'s demand: a request that left early, live, from a worker now
        holding nothing queued or running leaves it (nothing ends between two settles otherwise)."""
        if self.placed[m.id] and not (m.running or m.ready or m.prompt_queue):
            self.scan(m)

    def settle(self, m: Machine, active: bool) -> None:
        """After `m`'s step: finished requests leave its demand (their lengths join the history);
        one that has generated its predicted length and goes on is predicted again. A step gives
        each request at most one token, so the scan waits until one may have ended or reached its
        prediction (the countdown), or a running decode left (ended early, live), or `m` stopped
        taking new requests (`active` False: it may be idle now)."""
        mid = m.id
        if not self.placed.get(mid):    # a prompt machine of a split design, or an empty one
            return
        c = self.countdown[mid] - 1
        n = len(m.running)
        if c > 0 and n >= self.nrun[mid] and active:
            self.countdown[mid] = c
            self.nrun[mid] = n
            return
        self.scan(m)

    def scan(self, m: Machine) -> None:
        """`m`'s demand counted again from the requests placed there."""
        mid = m.id
        keep = []
        ctx = 0.0
        fin = 0
        due = 1 << 30
        preds = self.pred
        for q in self.placed[mid]:
            if q.phase is Phase.DONE:
                self.finished(q)
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

    def finished(self, q: Request) -> None:
        """`q` is done: its prediction goes, its length joins the history (the last HISTORY)."""
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

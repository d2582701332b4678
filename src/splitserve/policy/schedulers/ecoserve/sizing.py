"""How EcoServe sized KV in a step, recorded for a view of the machine kept elsewhere (the router's),
and the calls that size it.

A machine whose `sched` is a `Sizing` (the engine's view of itself: EcoServe.record) records in it
what form_batch did to KV beyond the batch's chunks, preemptions and joins; `encode` makes it the
step report (the `step` message's `sched`: [rehosted, parked, grown, resumed, planned], requests by
id), and the router's view applies it with the same calls (view.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...state import Machine, Request
from ...sized_kv import grow_kv, note, park_decode, resume_decode
from .order import gen, gt_key, repredict, set_host


@dataclass(slots=True)
class Sizing:
    """How form_batch sized KV on a machine, in the order it did it. Preemptions (of guests, and of
    waiting GTs: "unstuck") are the batch's `preempted`, reported as every scheduler's."""

    rehosted: list[tuple[Request, Request]] = field(default_factory=list)  # (guest, its new host)
    parked: list[Request] = field(default_factory=list)       # left the batch for the GT queue
    grown: list[tuple[Request, int]] = field(default_factory=list)   # (host, KV tokens more)
    resumed: list[tuple[Request, int, Request]] = field(default_factory=list)   # (GT, KV held, host)
    planned: list[Request] = field(default_factory=list)      # prompts that reserve their prefill only

    def encode(self, rid: Callable[[Request], str]) -> list[list[Any]] | None:
        """What was recorded, each request by its id `rid(r)` ([rehosted, parked, grown, resumed,
        planned]; None when nothing was), and forget it."""
        if not (self.rehosted or self.parked or self.grown or self.resumed or self.planned):
            return None
        out: list[list[Any]] = [[[rid(g), rid(h)] for g, h in self.rehosted], [rid(r) for r in self.parked],
               [[rid(h), n] for h, n in self.grown], [[rid(r), held, rid(h)] for r, held, h in self.resumed],
               [rid(r) for r in self.planned]]
        for part in (self.rehosted, self.parked, self.grown, self.resumed, self.planned):
            part.clear()
        return out


def park(m: Machine, r: Request) -> None:
    """Running `r` leaves the batch for the GT queue, keeping its KV (a GT whose prefill just
    ended, or a host regrouped): it is hosted by nobody, predicted again if it reached its
    prediction, and waits in `gt_key` order."""
    m.running.remove(r)
    set_host(r, None)
    repredict(r)
    park_decode(m, r, gt_key)
    if m.sched is not None:
        m.sched.parked.append(r)


def resume(m: Machine, r: Request, held: int, host: Request | None) -> None:
    """Waiting `r` decodes from now on, holding `held` KV tokens, in `host`'s reservation (itself: its
    own; None: a view's, whose host it no longer has: schedulers/ecoserve/view.py)."""
    resume_decode(m, r, held)
    gen(r).host = host
    if m.sched is not None:
        m.sched.resumed.append((r, held, host))


def grow(m: Machine, h: Request, n: int) -> None:
    grow_kv(m, h, n)
    note(m, "reserve")
    if m.sched is not None:
        m.sched.grown.append((h, n))


def rehost(m: Machine, guests: list[Request], h: Request) -> None:
    """`guests` (their host ended) decode in the reservation of `h` (the oldest of them) now."""
    for x in guests:
        gen(x).host = h
    if m.sched is not None:
        m.sched.rehosted += [(x, h) for x in guests]

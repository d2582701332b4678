"""EcoServe's families (a host and the guests in its reservation) and their KV before each step
(schedulers/ecoserve/: 5, 6): re-hosting when a host ended, growing a reservation, preempting
guests, regrouping a host."""

from __future__ import annotations

from ...machine import Batch
from ...state import Machine, Phase, Request
from ...sized_kv import note
from ...transitions import preempt
from .order import left, written
from .sizing import grow, park, rehost


def families(m: Machine) -> tuple[dict[Request, list[Request]], list[Request]]:
    """The families (host first, then its guests) whose writes of the next step may pass what they
    hold, re-hosting a family whose host has left; and the fresh GTs (prefill just done) to park."""
    fresh: list[Request] = []
    over: list[Request] = []
    guests: dict[Request, list[Request]] | None = None
    for r in m.running:
        s = r.sched
        h = None if s is None else s.host
        if h is r:
            if r.prompt_tokens + r.generated > r.kv_held:   # held is whole blocks: it needs another
                over.append(r)
        elif h is None:
            if r.kv_held and not r.in_flight:
                fresh.append(r)
        elif guests is None:
            guests = {h: [r]}
        elif h in guests:
            guests[h].append(r)
        else:
            guests[h] = [r]
    fams: dict[Request, list[Request]] = {}
    if guests:
        for h, gs in guests.items():
            if h.phase is Phase.DECODE:
                fams[h] = [h, *gs]
                continue
            gs.sort(key=lambda x: (x.arrival, x.id))   # the host ended: the oldest guest hosts
            rehost(m, gs, gs[0])
            fams[gs[0]] = gs
    for h in over:
        if h not in fams:
            fams[h] = [h]
    return fams, fresh


def settle(m: Machine, fams: dict[Request, list[Request]], batch: Batch) -> set[Request]:
    """Cover every family's writes of the next step (6); returns the decodes held back this
    iteration (only on a pipelined machine, while a member is still in a batch in flight)."""
    held_back: set[Request] = set()
    for h, fam in fams.items():
        short = 0
        for x in fam:
            short += written(m, x) - x.kv_held
        if short <= 0:
            continue
        if m.kv_free >= short:
            grow(m, h, short)
            continue
        guests = sorted((x for x in fam if x is not h and not x.in_flight),
                        key=lambda x: (left(x) > 0, -x.arrival, -x.id))
        for g in guests:
            short -= written(m, g) - g.kv_held
            preempt(m, g)
            g.sched.host = None   # it holds no KV: hosted by nobody
            fam.remove(g)
            batch.preempted.append(g)
            note(m, "preempted")
            if short <= 0 or m.kv_free >= short:
                break
        if short <= 0:
            continue
        if m.kv_free >= short:
            grow(m, h, short)
        elif len(fam) == 1 and not h.in_flight:
            park(m, h)
            note(m, "regrouped")
        else:
            held_back.update(x for x in fam if not x.in_flight)
    return held_back

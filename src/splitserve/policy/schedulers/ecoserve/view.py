"""The router's view of a worker applying EcoServe's report of a step (sizing.py `Sizing.encode`)
with the calls the worker's form_batch made, in its order (serve/cluster_state.py step_started):
re-hosted guests, GTs parked, reservations grown (`before` the batch's preemptions), a preempted
decode hosted by nobody, then GTs resumed (`after`), and prompts planned as they start. A report
may name a request the view has released already, on its own: it is skipped.

Under ecoserve a worker's scheduler sizes KV itself: prompts hold their prefill's KV only,
generation tasks wait in the machine's decode queue holding theirs, start with a reservation for
their predicted output or inside a host's, and grow; the report says each, and the view applies it
with the same calls (`park`, `grow_kv`, `drop_waiting`, `resume`, `plan_kv`), so kv_used, pending,
the queues and each request's kv_held and host follow the worker's. The decode queue is ordered by
`gt_key` with the router's arrival times (the worker keys deadlines by its admission counter), and
the prompt queue stays first come first served (the worker reorders its own by deadline)."""

from __future__ import annotations

from typing import Any, Callable

from ...state import Machine, Phase, Request
from ...sized_kv import grow_kv
from ..base import Applying
from .order import set_host
from .sizing import park, resume


class SizingView(Applying):
    __slots__ = ("m", "rehosted", "parked", "grown", "resumed", "planned_")

    def __init__(self, m: Machine, rep: Any, get: Callable[[str], Request | None]) -> None:
        """`rep`: [rehosted, parked, grown, resumed, planned] by request id, or None (nothing
        sized); `get`: id -> the view's request (None: it has none now; a host it no longer has is
        None until the worker re-hosts its guests too and reports it)."""
        self.m = m
        rehosted, parked, grown, resumed, planned = rep if rep is not None else ((), (), (), (), ())
        self.rehosted = [(r, get(h)) for rid, h in rehosted if (r := get(rid)) is not None]
        self.parked = [r for r in map(get, parked) if r is not None]
        self.grown = [(r, n) for rid, n in grown if (r := get(rid)) is not None]
        self.resumed = [(r, held, get(h)) for rid, held, h in resumed if (r := get(rid)) is not None]
        self.planned_ = {r for r in map(get, planned) if r is not None}

    def before(self) -> None:
        m = self.m
        for r, h in self.rehosted:
            if r.phase is Phase.DECODE and r in m.running:
                set_host(r, h)
        for r in self.parked:
            if r.phase is Phase.DECODE and r in m.running:
                park(m, r)
        for r, n in self.grown:
            if r.phase is Phase.DECODE and r in m.running:
                grow_kv(m, r, n)

    def preempted(self, r: Request) -> None:
        set_host(r, None)

    def after(self) -> None:
        m = self.m
        for r, held, h in self.resumed:
            if r.phase is Phase.WAITING and r in m.decode_queue:
                resume(m, r, held, h)

    def planned(self, r: Request) -> bool:
        return r in self.planned_


_ID = (str,)
_N = (int,)
# each part of a report (Sizing.encode): what its records hold, in order
_PARTS = (("rehosted", (_ID, _ID)), ("parked", None), ("grown", (_ID, _N)), ("resumed", (_ID, _N, _ID)),
          ("planned", None))


def check_sizing(rep: Any) -> str | None:
    """Why `rep` is not a report `Sizing.encode` makes (None: it is, or it is None): five lists, of
    request ids (parked, planned) or of records [id, host id] (rehosted), [id, tokens >= 1] (grown),
    [id, tokens >= 1, host id] (resumed)."""
    if rep is None:
        return None
    if not isinstance(rep, list) or len(rep) != len(_PARTS):
        return f"sched: expected a list of {len(_PARTS)} lists"
    for (name, fields), part in zip(_PARTS, rep):
        if not isinstance(part, list):
            return f"sched.{name}: expected a list"
        for i, item in enumerate(part):
            if fields is None:
                if not isinstance(item, str):
                    return f"sched.{name}: item {i} is not a request id"
            elif (not isinstance(item, list) or len(item) != len(fields)
                  or any(type(v) not in t or (t is _N and v < 1) for v, t in zip(item, fields))):
                return f"sched.{name}: item {i} is not a record of {len(fields)} fields as it should be"
    return None

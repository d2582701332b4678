"""A request's early end: it is aborted, fails, or stops before its last token, and gives back
whatever it holds on its machines. Part of the one set of state transitions (policy/transitions.py:
the life of a request)."""

from __future__ import annotations

from .sized_kv import drop_waiting
from .state import Machine, Phase, Request
from .kv_allocation import decode_reservation, prefill_reservation
from .transitions import end_decode, inbound, release_prompt_kv


def release(r: Request, p: Machine | None, t: Machine | None) -> None:
    """`r` ends before its last token (aborted, failed, or stopped early): undo whatever it holds on
    its prompt machine `p` and its token machine `t` (either may be None: not in this view; the
    same machine for an unsplit request, or in an engine's view of itself)."""
    if r.phase is Phase.DONE:
        return
    if r.phase is Phase.DECODE:
        m = t if t is not None else p
        assert m is not None, "a decode's machine is in the view"
        m.running.remove(r)
        end_decode(m, r)
        return
    if r.phase is Phase.WAITING:
        m = t if t is not None else p
        assert m is not None, "a waiting decode's machine is in the view"
        drop_waiting(m, r)
        r.preemptions -= 1
        r.phase = Phase.DONE
        return
    if r.phase is Phase.READY:
        assert t is not None, "a ready request's token machine is in the view"
        t.ready.remove(r)
        if r.isolated:
            t.isolated -= 1
        _drop_reservation(t, r)
    elif t is not None:
        if r in t.admit_queue:
            t.admit_queue.remove(r)
            t.queued_decode_tokens -= r.output_tokens - r.generated
            t.pending -= r.output_tokens - r.generated
        elif r.kv_on_token_machine:
            _drop_reservation(t, r)
    if p is not None:
        if r.phase is Phase.HANDOFF:
            release_prompt_kv(p, r)
        elif r.phase in (Phase.QUEUED, Phase.PREFILL):
            _leave_prefill(p, r)
    r.phase = Phase.DONE


def _drop_reservation(t: Machine, r: Request) -> None:
    t.kv_used -= decode_reservation(t, r)
    if t.kv_on_demand:
        r.kv_held = 0
    left = inbound(r)
    t.inbound_tokens -= left
    t.pending -= left
    r.kv_on_token_machine = False


def _leave_prefill(p: Machine, r: Request) -> None:
    """`r` leaves `p`'s prompt queue or its running chunk, with the KV its prefill reserved."""
    if r.chunk:
        p.running_prompt_tokens -= r.chunk
        p.pending -= r.chunk
        r.prefilled += r.chunk
        r.chunk = 0
    elif r in p.prompt_queue:
        p.prompt_queue.remove(r)
    else:
        return  # not on `p` (it waited for memory on its token machine)
    rest = r.prefill_len - r.prefilled
    p.queued_prompt_tokens -= rest
    p.pending -= rest
    if r.phase is Phase.PREFILL:
        p.kv_used -= prefill_reservation(p, r)
        if p.kv_on_demand and r.token_machine == p.id:
            r.kv_held = 0
    if r.isolated:
        p.isolated -= 1


def unreserve(r: Request, p: Machine, t: Machine) -> None:
    """Token machine `t` could not reserve for `r` after all (on demand, a live worker's own view
    had less room than the router's view of it: its reports lag): undo its reservation there and
    its prompt queued on `p` (not sent yet); it waits first in `t`'s admit queue, as if it had not
    been admitted (policy/cluster.py admit_freed takes it when memory frees)."""
    _drop_reservation(t, r)
    _leave_prefill(p, r)
    r.phase = Phase.QUEUED
    t.admit_queue.appendleft(r)
    left = r.output_tokens - r.generated
    t.queued_decode_tokens += left
    t.pending += left

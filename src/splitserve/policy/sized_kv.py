"""Transitions of a request whose KV its machine scheduler sizes (ecoserve, policy/schedulers/
ecoserve/): a prompt that holds its prefill's KV only, a decode queue of prefilled requests that
hold their KV while they wait, reservations started, grown and dropped; and a scheduler's event
counts. Part of the one set of state transitions (policy/transitions.py: the life of a request).
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

from .state import Machine, Phase, Request
from .transitions import run_decode


def plan_kv(m: Machine, r: Request) -> None:
    """Before `r`'s prefill starts on `m`, where it decodes too: it will hold its prefill's KV only
    (whole blocks), not its prompt + output (start_chunk reserves it)."""
    if r.phase is Phase.QUEUED:
        r.kv_held = m.kv_round(r.prefill_len)


def park_decode(m: Machine, r: Request, key: Callable[[Request], Any] | None = None) -> None:
    """Running decode `r` leaves the batch for `m`'s decode queue (at its end, or in the order of
    `key`, which the queue keeps), keeping the KV it holds (the caller takes it out of
    `m.running`); its tokens still to make wait there."""
    left = r.output_tokens - r.generated
    r.phase = Phase.WAITING
    if key is None:
        m.decode_queue.append(r)
    else:
        bisect.insort(m.decode_queue, r, key=key)
    m.context_tokens -= r.prompt_tokens + r.generated
    m.decode_tokens_left -= left
    m.queued_decode_tokens += left


def resume_decode(m: Machine, r: Request, held: int) -> None:
    """Waiting `r` enters `m`'s decode batch holding `held` KV tokens from now on (more: a new
    reservation; the same: it decodes into KV reserved by another)."""
    m.decode_queue.remove(r)
    left = r.output_tokens - r.generated
    m.queued_decode_tokens -= left
    m.pending -= left
    m.kv_used += held - r.kv_held
    r.kv_held = held
    run_decode(m, r)


def grow_kv(m: Machine, r: Request, n: int) -> None:
    """`r` (running or waiting, its KV sized by the scheduler) holds `n` more KV tokens."""
    m.kv_used += n
    r.kv_held += n


def drop_waiting(m: Machine, r: Request) -> None:
    """Waiting `r` loses its KV to make room (offload-free preemption): it recomputes later
    (requeue_preempted, as a preempted decode)."""
    m.decode_queue.remove(r)
    left = r.output_tokens - r.generated
    m.queued_decode_tokens -= left
    m.pending -= left
    m.kv_used -= r.kv_held
    r.kv_held = 0
    r.preemptions += 1
    r.kv_on_token_machine = False


def note(m: Machine, what: str, n: int = 1) -> None:
    """Count a scheduler's event on `m` (m.counts)."""
    if m.counts is None:
        m.counts = {}
    m.counts[what] = m.counts.get(what, 0) + n

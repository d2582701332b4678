"""What EcoServe starts in an iteration (schedulers/ecoserve/: 2-5, 7): waiting generation tasks
with their reservations and the guests lent a host's, then prompts, and the last-resort start."""

from __future__ import annotations

from bisect import bisect_right
from operator import attrgetter

from ...machine import Batch, BatchingConfig
from ...state import Machine, Request
from ...sized_kv import drop_waiting, note, plan_kv
from ...kv_allocation import prefill_reservation
from ...transitions import start_chunk
from .order import BUFFER, gt_key, left, predicted, prompt_key, reserve, written
from .sizing import resume

_PKEY = attrgetter("sched.pkey")   # a request's kept prompt_key


def start_gts(m: Machine, cfg: BatchingConfig, seats: float) -> tuple[float, bool]:
    """Start waiting GTs in queue order while their reservations fit (2, 3), then lend their
    reservations to shorter ones (5). Returns the seats left and whether a GT waits for memory."""
    q = m.decode_queue
    room = m.kv_free - reserve(m)
    hosts: list[Request] = []
    blocked = False
    for r in list(q):
        held = max(m.kv_round(r.prompt_tokens + predicted(r)), r.kv_held)
        if seats < 1 or held - r.kv_held > room:
            blocked = True
            break
        room -= held - r.kv_held
        resume(m, r, held, r)
        hosts.append(r)
        seats -= 1
    if not hosts or not q or seats < 1:
        return seats, blocked
    cands = sorted(q, key=lambda x: (left(x), x.arrival, x.id))
    lens = [left(x) for x in cands]
    for h in hosts:
        n = left(h)
        b = BUFFER * n
        spare = h.kv_held - written(m, h)
        level = 1
        while seats >= 1 and cands:
            bound = n / (1 << level) - b
            if bound < 1:
                break
            for _ in range(1 << (level - 1)):
                j = bisect_right(lens, bound) - 1
                while j >= 0 and written(m, cands[j]) - cands[j].kv_held > spare:
                    j -= 1   # its first token would not fit the host's unwritten blocks
                if j < 0 or seats < 1:
                    break
                g = cands.pop(j)
                lens.pop(j)
                spare -= written(m, g) - g.kv_held
                resume(m, g, g.kv_held, h)
                note(m, "pipelined")
                seats -= 1
            level += 1
    return seats, blocked


def start_prompts(m: Machine, cfg: BatchingConfig, batch: Batch, seats: float, room: int) -> None:
    """Whole prompts in queue order up to the token budget, the seats and `room` KV tokens."""
    q = m.prompt_queue
    if len(q) > 1:
        for r in q:   # keys up to date (prompt_key), then sorted by the kept ones
            s = r.sched
            if s is None or s.pkey_len != r.prefill_len:
                prompt_key(r)
        order = sorted(q, key=_PKEY)
        q.clear()
        q.extend(order)
    budget = cfg.prompt_token_cap
    while q and seats >= 1:
        head = q[0]
        n = head.prefill_len - head.prefilled
        if batch.prompts and n > budget:
            break
        mine = head.token_machine == m.id and not head.isolated
        kv = m.kv_round(head.prefill_len) if mine else prefill_reservation(m, head)
        if head.prefilled == 0:
            if kv > room:
                break
            room -= kv
            if mine:
                plan_kv(m, head)
                if m.sched is not None:
                    m.sched.planned.append(head)
        start_chunk(m, head, n)
        batch.prompts.append(head)
        batch.chunks.append(n)
        batch.prompt_tokens += n
        budget -= n
        seats -= 1


def prompt_room(m: Machine) -> int:
    """KV prompts may take while a GT waits for memory: what the reserve leaves beside the prompts'
    KV the waiting GTs already hold (ASSUMED: so the reserve, not the free KV, bounds the prompts
    waiting as GTs, and their KV cannot crowd out the reservations of the GTs before them)."""
    room = min(m.kv_free, reserve(m))
    for r in m.decode_queue:
        room -= r.kv_held
        if room <= 0:
            return 0
    return room


def unstick(m: Machine, batch: Batch) -> None:
    """Nothing runs and nothing could start: the first waiting GT starts with what is free,
    preempting the last waiting ones if it must (7)."""
    q = m.decode_queue
    q.sort(key=gt_key)
    h = q[0]
    need = written(m, h) - h.kv_held
    want = max(m.kv_round(h.prompt_tokens + predicted(h)) - h.kv_held, need)
    while m.kv_free < want and len(q) > 1:   # room for its prediction, not only its next token
        v = q[-1]
        drop_waiting(m, v)
        batch.preempted.append(v)
        note(m, "unstuck")
    if m.kv_free < need:
        raise AssertionError(f"request {h.id} cannot decode alone ({need} KV tokens, {m.kv_free} free)")
    resume(m, h, h.kv_held + min(want, m.kv_free), h)

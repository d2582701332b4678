"""Who is preempted, and where the preempted recompute.

- Reserve (policy/kv_allocation.py): only a prompt that lacks KV preempts, the youngest decodes
  first, none more than `preemption_limit` times (`preemption_victims`, `make_room`); if all of
  those together free too little, nobody is preempted and the prompt waits.
- On demand: a prompt waits for its blocks and preempts nobody; a step's decodes take the blocks
  their next tokens need (`grow_decodes`) by vLLM v1's rule (its scheduler's running loop): they
  grow in the order they joined the batch, and one that finds no free block preempts the decode
  that joined last among those not yet grown (the last of them under the preemption limit, if any
  is), until it has its block or is itself the one preempted. The oldest decode therefore always
  runs, so a machine never stalls, and the limit decides who goes first without stopping progress.
- A preempted decode recomputes on the machine that preempted it, ahead of younger prompts
  (`requeue`); under `recompute` prompt-pool one whose prompt ran elsewhere goes back through the
  prompt pool instead (policy/cluster.py readmit).
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, TypeVar

from .kv_allocation import decode_reservation, fits
from .state import Machine, Request
from .transitions import grow_decode, leave_preempted, preempt, requeue_preempted

R = TypeVar("R", bound="Preemptible")


class Preemptible(Protocol):
    arrival: float
    preemptions: int


def preemption_victims(running: Iterable[R], shortfall: int, held: Callable[[R], int],
                       limit: int) -> list[R] | None:
    """Running decodes to preempt so that a prompt gets `shortfall` more KV: the youngest first, none
    preempted more than `limit` times; `held(r)` is what preempting `r` frees. None when all that
    may be preempted together free too little (the prompt waits and nobody is preempted)."""
    if shortfall <= 0:
        return []
    eligible = [r for r in running if r.preemptions < limit]
    if sum(map(held, eligible)) < shortfall:
        return None
    eligible.sort(key=lambda r: r.arrival, reverse=True)
    out: list[R] = []
    for r in eligible:
        if shortfall <= 0:
            break
        out.append(r)
        shortfall -= held(r)
    return out


def make_room(m: Machine, need: int, limit: int, preempted: list[Request], decoding: list[Request]) -> bool:
    """A prompt needs `need` KV tokens on `m`: under reserve, free them, preempting decodes of
    `decoding` (preemption_victims; appended to `preempted`) if needed; False (nobody preempted)
    when that cannot free enough. On demand, whether they and the watermark are free: a prompt
    waits for blocks and preempts nobody."""
    if m.kv_on_demand:
        return fits(m, need)
    if need <= m.kv_free:
        return True
    victims = preemption_victims(decoding, need - m.kv_free, lambda r: decode_reservation(m, r), limit)
    if victims is None:
        return False
    for v in victims:
        preempt(m, v)
        preempted.append(v)
        if decoding is not m.running:
            decoding.remove(v)
    return True


def requeue(m: Machine, preempted: list[Request]) -> None:
    """The decodes a step preempted on `m` recompute here (requeue_preempted), but under
    `recompute` prompt-pool those whose prompt ran elsewhere: they leave for the cluster to admit
    again (policy/cluster.py readmit; `sent_back` names them)."""
    for v in preempted:
        if m.recompute_here or v.prompt_machine == m.id:
            requeue_preempted(m, v)
        else:
            leave_preempted(v)


def sent_back(m: Machine, preempted: list[Request]) -> list[Request]:
    """Of the decodes a step `preempted` on `m`, those that recompute through the prompt pool
    (`requeue` left them)."""
    return [v for v in preempted if v.prompt_machine != m.id]


def grow_decodes(m: Machine, decoding: list[Request], preempted: list[Request], limit: int,
                 grown: list[Request]) -> None:
    """On demand: every decode of `decoding` (the step's, in the order they joined `m.running`)
    takes its next block, preempting as the rule says; the preempted leave `decoding` and
    `m.running` and are appended to `preempted` (the caller requeues them), those that took KV to
    `grown`. Nothing under reserve."""
    if not m.kv_on_demand:
        return
    # Fast pass, the simulator's hot path on demand (every decode of every step): while no decode
    # needs more than is free nobody is preempted, so `decoding` stays as it is; the first that
    # would preempt hands over to the rule's loop below, at its index, nothing else changed. With
    # blocks of a power of two tokens (the engine's 16) whole blocks are a mask, not a division.
    b = m.kv_block
    i = 0
    if b > 0 and b & (b - 1) == 0:
        up, mask = b - 1, -b
        free = m.kv_free
        for r in decoding:
            need = ((r.prompt_tokens + r.generated + up) & mask) - r.kv_held   # m.kv_round(...) - r.kv_held
            if need > free:
                break
            if need > 0:
                grow_decode(m, r)
                grown.append(r)
                free = m.kv_free
            i += 1
        else:
            return
    while i < len(decoding):
        r = decoding[i]
        need = m.kv_round(r.prompt_tokens + r.generated) - r.kv_held
        while need > m.kv_free:
            v = _victim(decoding, i, limit)
            preempt(m, v)
            preempted.append(v)
            if decoding is not m.running:
                decoding.remove(v)
            if v is r:
                break
        else:
            if need > 0:
                grow_decode(m, r)
                grown.append(r)
            i += 1


def _victim(decoding: list[Request], i: int, limit: int) -> Request:
    """The last of `decoding[i:]` still under the preemption limit, else the last of them."""
    for j in range(len(decoding) - 1, i - 1, -1):
        if decoding[j].preemptions < limit:
            return decoding[j]
    return decoding[-1]

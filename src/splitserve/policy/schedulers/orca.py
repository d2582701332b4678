"""Orca (Yu et al., OSDI'22): iteration-level scheduling with selective batching, and admission
that reserves the maximum length. Every iteration runs every running decode and, beside them,
FCFS prompts (Orca's Algorithm 1: the request pool in arrival order, up to `max_seqs`); a new
request is admitted only if the KV slots of the requests holding KV here plus its own fit the
machine's capacity: each reserves `max_len` tokens ((holders + 1) * max_len <= capacity), or with
`max_len` 0 (the default) its own prompt + output (kv_need). The first prompt that does not fit
stops admission. No preemption: a request holds what it may ever need.

Where it differs from Orca, and why:
- the max_len slots are counted on top of the reservations policy/transitions.py keeps (each
  request's kv_need; the rest up to max_len is added here for the requests the machine lists);
  KV held for requests it does not list counts at its real size. A slot is at most the capacity,
  so a request alone always starts.
- a batch's prefill tokens are also capped by `prompt_token_cap` (set --prompt-cap high for Orca's
  behaviour).
- on a token machine of a split design decodes arrive reserved by the cluster (policy/cluster.py):
  max_len applies only to prompts admitted here.
"""

from __future__ import annotations

from ..machine import Batch, BatchingConfig, admit_prompt, close_batch, form_isolated, free_decodes
from ..state import Machine, Phase, Request
from ..kv_allocation import RESERVE, decode_reservation, prefill_reservation
from ..transitions import start_decodes
from .base import MachineScheduler


def slot(m: Machine, cfg: BatchingConfig, held: int) -> int:
    """KV tokens Orca reserves for a request that holds `held` here: max_len, at most the whole
    capacity, or `held` if that is more (with max_len 0: `held`)."""
    return max(held, min(m.kv_capacity, cfg.max_len))


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    batch = Batch()
    if m.ready:
        batch.joined = start_decodes(m)
    if m.isolated:  # rare: a suspect request is here (policy/machine.py: isolated requests)
        return form_isolated(m, cfg, batch)
    queue, running = m.prompt_queue, free_decodes(m)
    # KV reserved by Orca beyond what the holders hold (0 with max_len 0)
    extra = 0
    if cfg.max_len:
        for r in m.running:
            held = decode_reservation(m, r)
            extra += slot(m, cfg, held) - held
        for r in queue:
            if r.phase is Phase.PREFILL:
                held = prefill_reservation(m, r)
                extra += slot(m, cfg, held) - held

    def fits(r: Request) -> bool:
        nonlocal extra
        held = prefill_reservation(m, r)
        s = slot(m, cfg, held)
        if m.kv_used + extra + s > m.kv_capacity:
            return False
        extra += s - held
        return True

    budget = cfg.prompt_token_cap
    while queue:
        n = admit_prompt(m, cfg, queue[0], budget, batch, running, fits)
        if not n:
            break
        budget -= n
    return close_batch(m, batch, running)


SCHEDULER = MachineScheduler("orca", form_batch,
                             "Orca: prompts and decodes together, admission reserves max_len per request", allocation=RESERVE)

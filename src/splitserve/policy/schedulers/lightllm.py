"""LightLLM's router (ModelTC/lightllm, router/req_queue.py `_can_add_new_req`; Vidur's
LightLLMReplicaScheduler models it): continuous batching, prefill first (as vllm.py), KV allocated
on demand, and a new request admitted, FCFS, only while LightLLM's estimate of the peak KV of the
running requests and the new ones fits the machine's KV capacity. Each request counts as (used,
left): KV tokens it holds now and tokens it may still generate; sorted by `left`, longest first,
requests 0..i all still run when request i ends, so the peak is max over i of
(used_0 + ... + used_i) + left_i * (i + 1) (peak_kv). `max_seqs` is LightLLM's
running_max_req_size and `prompt_token_cap` its batch_max_tokens. It allocates on demand by its
own rule (`allocation`): under reservations the estimate would refuse nothing.

Where it differs from LightLLM, and why:
- KV comes in blocks of the machine's block size (LightLLM: one token), the prompt's blocks and
  the watermark must be free too (policy/kv_allocation.py), and a decode that finds no block
  preempts (policy/preemption.py), which the estimate makes rare.
- `left` is output_tokens - generated (LightLLM: max_new_tokens - generated - 1).
- admission is tried before every iteration, as in vllm.py (LightLLM: every max_wait_tokens steps).
- requests this machine does not list (prefills being handed off, KV in transfer) are not in the
  estimate; they hold their blocks. The cluster's token-side admission does not use it.
"""

from __future__ import annotations

from typing import Iterable

from ..machine import Batch, BatchingConfig
from ..state import Machine, Request
from ..kv_allocation import ON_DEMAND, fits as kv_fits, prefill_reservation
from .base import MachineScheduler
from .vllm import prefill_first


def peak_kv(requests: Iterable[tuple[int, int]]) -> int:
    """LightLLM's estimate of the most KV tokens requests (used, left) will hold at once, each
    growing one token a step for `left` steps."""
    peak = cum = 0
    for i, (used, left) in enumerate(sorted(requests, key=lambda e: -e[1]), 1):
        cum += used
        peak = max(peak, cum + left * i)
    return peak


def usage(m: Machine, r: Request) -> tuple[int, int]:
    """(used, left) of `r` on `m`: a prompt that decodes elsewhere holds its prompt and no more."""
    if r.token_machine != m.id:
        return r.prompt_tokens, 0
    return r.prompt_tokens + r.generated, r.output_tokens - r.generated


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    held: list[tuple[int, int]] = []   # the running decodes' (ready ones have joined by the first call)

    def fits(r: Request) -> bool:
        if not held:
            held.extend(usage(m, d) for d in m.running)
        u = usage(m, r)
        if not kv_fits(m, prefill_reservation(m, r)) or peak_kv([*held, u]) > m.kv_capacity:
            return False
        held.append(u)
        return True

    return prefill_first(m, cfg, fits)


SCHEDULER = MachineScheduler("lightllm", form_batch, "LightLLM: prefill-first, KV on demand, admission by the "
                             "estimated peak KV", allocation=ON_DEMAND)

"""LightLLM's router (ModelTC/lightllm, router/req_queue.py `_can_add_new_req`): continuous
batching, prefill first (as vllm.py: an iteration of prefills only, or of decodes only), admitting
a new request, FCFS, only while LightLLM's estimate of the peak KV of the running requests and the
new ones fits the machine's KV capacity. Each request counts as (used, left): KV tokens it holds
now (prompt + tokens generated) and tokens it may still generate; its KV grows one token a step
until it is done. Sorted by `left`, longest first, the requests 0..i all still run when request i
ends, so the peak is max over i of (used_0 + ... + used_i) + left_i * (i + 1) (peak_kv). No
preemption (the estimate leaves room for everyone's growth). `max_seqs` is LightLLM's
running_max_req_size and `prompt_token_cap` its batch_max_tokens.

Where it differs from LightLLM, and why:
- LightLLM allocates KV token by token (TokenAttention) and the estimate is its only admission
  test. Under `--kv-allocation on-demand` (policy/kv_allocation.py) KV is allocated in blocks as
  sequences grow, as there, and the estimate decides admission (with the prompt's blocks and the
  watermark free); a decode that finds no block still preempts (policy/preemption.py), which the
  estimate makes rare. Under reserve a request must also find its whole prompt + output free, and
  since the estimate is never more than the sum of those reservations it refuses nothing the
  reservation admits: admission there is exactly the reservation's (vllm.py without preemption).
  The cluster's token-side admission does not use the estimate.
- `left` is output_tokens - generated, so a request's estimated final KV equals its
  reservation; LightLLM counts max_new_tokens - generated - 1.
- LightLLM runs a few decode steps (max_wait_tokens) before it tries to admit again while a
  batch runs; here admission is tried before every iteration, as in vllm.py.
- Requests this machine does not list (a prompt machine's prefills being handed off, a token
  machine's reservations for KV in transfer) are not in the estimate; they hold their reservation.
"""

from __future__ import annotations

from typing import Iterable

from ..machine import Batch, BatchingConfig
from ..state import Machine, Request
from ..kv_allocation import fits as kv_fits, prefill_reservation
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


SCHEDULER = MachineScheduler("lightllm", form_batch, "LightLLM: prefill-first, admission by the estimated peak KV")

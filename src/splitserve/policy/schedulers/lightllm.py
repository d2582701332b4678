"""LightLLM's router (ModelTC/lightllm, router/req_queue.py `_can_add_new_req`; Vidur's
LightLLMReplicaScheduler models it): continuous batching, prefill first (as vllm.py: an iteration
of prefills only, or of decodes only), KV allocated on demand as tokens are made, and a new request
admitted, FCFS, only while LightLLM's estimate of the peak KV of the running requests and the new
ones fits the machine's KV capacity. Each request counts as (used, left): KV tokens it holds now
(prompt + tokens generated) and tokens it may still generate; its KV grows one token a step until
it is done. Sorted by `left`, longest first, the requests 0..i all still run when request i ends,
so the peak is max over i of (used_0 + ... + used_i) + left_i * (i + 1) (peak_kv). The estimate
can refuse what a prompt-block admission (vllm.py) would take, and take what whole reservations
(prompt + output each) would refuse, since requests end at different times. `max_seqs` is
LightLLM's running_max_req_size and `prompt_token_cap` its batch_max_tokens.

It allocates on demand by its own rule (`allocation`; policy/config.py refuses `--kv-allocation
reserve` with it and defaults to on-demand): under a reservation the estimate, never more than the
sum of the reservations, would refuse nothing.

Where it differs from LightLLM, and why:
- KV comes in blocks of the machine's block size (LightLLM's TokenAttention: one token); the
  prompt's blocks and the watermark must also be free (policy/kv_allocation.py fits), and a decode
  that finds no block preempts (policy/preemption.py), which the estimate makes rare.
- `left` is output_tokens - generated, so a request's estimated final KV is its prompt + output;
  LightLLM counts max_new_tokens - generated - 1.
- LightLLM runs a few decode steps (max_wait_tokens) before it tries to admit again while a
  batch runs; here admission is tried before every iteration, as in vllm.py.
- Requests this machine does not list (a prompt machine's prefills being handed off, a token
  machine's KV in transfer) are not in the estimate; they hold their blocks.
- The cluster's token-side admission does not use the estimate.
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

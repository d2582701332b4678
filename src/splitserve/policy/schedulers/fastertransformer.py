"""FasterTransformer-style static batching (request-level batching, as in NVIDIA FasterTransformer
and the baseline of the Orca paper): a batch of up to `max_seqs` requests (0: as many as KV memory
holds) is formed only when the machine runs nothing; then no request joins until every request of
the batch has finished. The batch's prompts prefill together in its first iteration (FCFS, whole,
up to `prompt_token_cap` prefill tokens, the first prompt alone however long), and its decodes run
until the last one finishes. Decodes whose KV came from a prompt machine (READY) join only when a
new batch forms, as its first members. No preemption.

Where it differs from FasterTransformer, and why:
- FasterTransformer pads the batch to its longest prompt and decodes every member to the longest
  output (finished ones keep their slot); here a finished request leaves the batch (its KV is
  freed and it costs nothing in later iterations), though nobody takes its place. The simulator's
  step time is thus slightly lower than a padded batch's.
- A batch is capped by KV memory at admission (each request's whole prompt + output reserved),
  not by a fixed batch size alone.
- On a prompt machine of a split design every request leaves after its prefill (its KV moves on),
  so each iteration is a new batch of prompts.
"""

from __future__ import annotations

from ..machine import Batch, BatchingConfig, admit_prompt, close_batch, form_isolated, free_decodes
from ..state import Machine, Request
from ..kv_allocation import RESERVE, prefill_reservation
from ..transitions import start_decode, start_decodes
from .base import MachineScheduler


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    batch = Batch()
    if m.isolated:  # rare: a suspect request is here (policy/machine.py: isolated requests)
        if m.ready:
            batch.joined = start_decodes(m)
        return form_isolated(m, cfg, batch)
    if m.running or m.running_prompt_tokens:  # a batch runs (on a pipelined machine: may be in flight)
        return close_batch(m, batch, free_decodes(m))
    # a new batch: decodes ready here first, then prompts that start now
    joined = m.ready[:cfg.max_seqs] if cfg.max_seqs else list(m.ready)
    for r in joined:
        start_decode(m, r)
    batch.joined = joined

    def fits(r: Request) -> bool:
        return prefill_reservation(m, r) <= m.kv_free

    queue, budget = m.prompt_queue, cfg.prompt_token_cap
    while queue:
        n = admit_prompt(m, cfg, queue[0], budget, batch, joined, fits)
        if not n:
            break
        budget -= n
    return close_batch(m, batch, free_decodes(m))


SCHEDULER = MachineScheduler("fastertransformer", form_batch,
                             "static batches: nobody joins until the whole batch has finished", allocation=RESERVE)

"""vLLM v0's default scheduler (Kwon et al., SOSP'23; vllm/core/scheduler.py `_schedule_default`):
prefill first. An iteration runs either prefills only, or decodes only:
- if the head of the FCFS queue can start, the iteration takes as many waiting prompts, FCFS, as
  fit `prompt_token_cap` (vLLM's max_num_batched_tokens; the first prompt of an iteration runs
  alone however long it is), `max_seqs` (max_num_seqs, counting the running decodes) and KV
  memory, and no decode runs;
- else every running decode runs, and no prompt.
KV memory (policy/kv_allocation.py): on demand, vLLM's own rule and `--policy vllm`'s default, a
prompt starts when its blocks and the watermark are free, and a decode step's decodes take their
next blocks, preempting the last joined when there are none (policy/preemption.py grow_decodes;
recomputed later). Under `--kv-allocation reserve` a request holds its whole prompt + output from
its prefill, and a prompt that lacks KV preempts the youngest running decodes instead (at most
`preemption_limit` times each), as in the splitwise scheduler.

Where it differs from vLLM v0, and why:
- vLLM refuses a prompt longer than max_num_batched_tokens (unless chunked prefill is on); here
  it runs alone, as under the splitwise rules, so that every request of a trace completes.
- Swapping preempted KV to CPU memory is not modelled: a preempted decode recomputes.
"""

from __future__ import annotations

from typing import Callable

from ..machine import Batch, BatchingConfig, admit_prompt, close_batch, form_isolated, free_decodes
from ..preemption import grow_decodes
from ..state import Machine, Request
from ..transitions import start_decodes
from .base import MachineScheduler


def prefill_first(m: Machine, cfg: BatchingConfig,
                  fits: Callable[[Request], bool] | None = None) -> Batch | None:
    """An iteration of the prompts that can start (FCFS, up to the token cap, a seat and KV each;
    `fits`: the scheduler's own admission test instead of preempting decodes), or when none can,
    of every running decode."""
    batch = Batch()
    if m.ready:
        batch.joined = start_decodes(m)
    if m.isolated:  # rare: a suspect request is here (policy/machine.py: isolated requests)
        return form_isolated(m, cfg, batch)
    queue, running = m.prompt_queue, free_decodes(m)
    budget = cfg.prompt_token_cap
    while queue:
        n = admit_prompt(m, cfg, queue[0], budget, batch, running, fits)
        if not n:
            break
        budget -= n
    if batch.prompts:
        return close_batch(m, batch, [])
    grow_decodes(m, running, batch.preempted, cfg.preemption_limit, batch.grown)  # on demand: their next blocks
    return close_batch(m, batch, running)


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    return prefill_first(m, cfg)


SCHEDULER = MachineScheduler("vllm", form_batch, "vLLM v0: an iteration of prefills only, or of decodes only")

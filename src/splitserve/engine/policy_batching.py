"""The machine-level policy (policy/machine.py, the simulator's rules) as the engine's batch
selection, for serving workers.

    engine = LLMEngine("tiny", select=machine_policy(BatchingConfig()))

The rules are the policy's own functions (`prompt_budget`, `prompt_take`, `preemption_victims`);
this module only maps the engine's paged cache onto them:
- a sequence that decodes here reserves the KV of its prompt and of every token it may generate
  (`decode_reservation`), a prefill-only sequence (prompt worker) that of its prompt
  (`prefill_reservation`), in whole blocks. Blocks are still allocated as tokens arrive; what is
  reserved but not yet allocated counts as taken, so running decodes never run out of blocks.
- prompts (new ones, and prefills cut into chunks) are admitted FCFS under the policy's prompt
  budget, which does not count decode tokens; a prompt whose reservation does not fit preempts
  running decodes, youngest first, each at most `preemption_limit` times, else it waits.
- every running decode is in every batch (no decode token budget).
The engine's `max_num_seqs` still bounds how many sequences hold KV at once. Its token budget and
chunk size (`BatchLimits`) are not used: the policy's `BatchingConfig` says them.

If blocks run short anyway (a caller reserved blocks behind the policy's back), the youngest
running decodes are preempted so the batch can run; `PolicySelect.forced` counts those.
"""

from __future__ import annotations

from ..policy.machine import BatchingConfig, preemption_victims, prompt_budget, prompt_take
from .scheduler import BatchLimits, BlockView, Selection
from .sequence import Sequence, Status


def reservation(seq: Sequence) -> int:
    """KV positions `seq` holds here at most: its prompt only if it leaves after its prefill,
    else its prompt and every token it may generate (capped by the sequence's length limit)."""
    if seq.prefill_only:
        return len(seq.prompt_ids)
    return min(len(seq.prompt_ids) + seq.params.max_tokens, seq.max_len)


class PolicySelect:
    """A `Select` (see scheduler.py) applying the machine-level policy under `cfg`."""

    def __init__(self, cfg: BatchingConfig = BatchingConfig()) -> None:
        self.cfg = cfg
        self.forced = 0  # decodes preempted because blocks ran out, outside the policy's rules

    def __call__(self, running: list[Sequence], waiting: list[Sequence], limits: BatchLimits,
                 blocks: BlockView) -> Selection:
        cfg, sel = self.cfg, Selection()
        decodes = [s for s in running if s.num_remaining == 1]
        prefilling = [s for s in running if s.num_remaining > 1]   # chunked prefills in progress
        growth = {s.request_id: blocks.blocks_needed(s.request_id, max(reservation(s), s.num_tokens))
                  for s in running}
        free = blocks.num_free - sum(growth.values())              # blocks not reserved by anyone
        if free < 0:
            free = self._force(decodes, -free, growth, blocks, sel)

        def held(s: Sequence) -> int:
            return blocks.blocks_released_by(s.request_id) + growth[s.request_id]

        budget = prompt_budget(cfg, len(decodes))
        seqs = len(running)
        prompts: list[tuple[Sequence, int]] = []
        for head in prefilling + waiting:
            n = prompt_take(cfg, head.num_remaining, budget, first=not prompts)
            if n == 0:
                break
            if head.status is Status.WAITING:                      # first chunk: reserve its KV
                if seqs >= limits.max_num_seqs:
                    break
                need = blocks.blocks_needed(head.request_id, reservation(head))
                victims = preemption_victims(decodes, need - free, held, cfg.preemption_limit)
                if victims is None:
                    break
                for v in victims:
                    decodes.remove(v)
                    free += held(v)
                    seqs -= 1
                sel.preempt += victims
                free -= need
                seqs += 1
            prompts.append((head, n))
            budget -= n
        sel.scheduled = [(s, 1) for s in decodes] + prompts
        return sel

    def _force(self, decodes: list[Sequence], short: int, growth: dict, blocks: BlockView,
               sel: Selection) -> int:
        """Reservations exceed the cache: preempt the youngest decodes until they fit."""
        free = -short
        for v in sorted(decodes, key=lambda s: s.arrival, reverse=True):
            if free >= 0:
                break
            decodes.remove(v)
            sel.preempt.append(v)
            free += blocks.blocks_released_by(v.request_id) + growth[v.request_id]
            self.forced += 1
        return free


def machine_policy(cfg: BatchingConfig = BatchingConfig()) -> PolicySelect:
    return PolicySelect(cfg)

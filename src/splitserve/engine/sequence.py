"""A request as the engine tracks it: tokens so far, how many have KV in the cache, status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .sampler import SamplingParams

if TYPE_CHECKING:
    from ..policy.state import Request
    from .structured import Matcher


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: int  # admission order; older requests are served first and preempted last
    max_len: int  # prompt + output never exceed this (model context, KV capacity)
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens whose K/V is in the cache
    status: Status = Status.WAITING
    finish_reason: str | None = None
    prefill_only: bool = False  # prompt worker: stop after the first token and export the KV
    export_kv: bool = True      # prefill_only: copy the prompt's KV out at the end (False: it was streamed)
    text: str | None = None
    logits: list = field(default_factory=list)
    preemptions: int = 0  # times preempted (KV dropped, recomputed later)
    isolated: bool = False  # suspect: never shares a step with another request (see Scheduler)
    shadow: Request | None = None  # its policy Request in the scheduler's view of the engine
    block_hashes: list[int] = field(default_factory=list)  # names of its full blocks (policy/prefix_cache.py)
    registered: int = 0     # its leading blocks that are in the prefix cache
    num_cached: int = 0     # prompt tokens its latest prefill took from the prefix cache
    logprobs: list = field(default_factory=list)         # its generated tokens' records (logprobs.py)
    prompt_logprobs: list = field(default_factory=list)  # its prompt positions 1.. records
    matcher: Matcher | None = None  # params.grammar's matcher, at its tokens so far (structured.py)
    resumed: int = 0        # outputs it came with (made before a preemption elsewhere)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefix_len(self) -> int:
        """Tokens before the first one it makes here: its prompt and the outputs it came with (what
        a prefill-only sequence's KV hand-over moves, what a reservation receives)."""
        return len(self.prompt_ids) + self.resumed

    @property
    def num_remaining(self) -> int:
        """Tokens still to run through the model before the next one can be sampled."""
        return self.num_tokens - self.num_computed

    def token_slice(self, start: int, end: int) -> list[int]:
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p:end - p]
        return self.prompt_ids[start:] + self.output_ids[:end - p]

"""What the bench sends: the workload's requests, optionally capped, with token-id prompts.

Prompts are lists of token ids drawn from a seeded generator in a small range (1..255 by default,
valid for any vocabulary including the byte-level `tiny` preset), so a server needs no tokenizer
and the prompt length is exact. `max_tokens` is the workload's output length. The caps
(`max_prompt_tokens`, `max_tokens_cap`) CHANGE the workload: they exist so that a tiny CPU model
can be driven with the production size distribution's arrivals; a capped run is not comparable
to an uncapped simulation of the same seed (arrival times stay the same, sizes do not).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..workload import Workload

PROMPT_SEED_SALT = 0x5B1E   # prompt ids use their own stream: the workload's stays untouched


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    arrival: float           # seconds after the start of the run
    prompt_tokens: int
    max_tokens: int
    prompt: list[int] | str | None = None    # sent as is when given (text, or a dataset's ids)


@dataclass(frozen=True, slots=True)
class Caps:
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None


def capped(p: int, o: int, caps: Caps, max_context: int | None = None) -> tuple[int, int]:
    """Sizes after the caps, then clipped to `max_context` as workload/ clips (the output to
    context - 1, the prompt to what is left)."""
    if caps.max_prompt_tokens is not None:
        p = min(p, caps.max_prompt_tokens)
    if caps.max_tokens is not None:
        o = min(o, caps.max_tokens)
    if max_context is not None:
        o = min(o, max_context - 1)
        p = min(p, max_context - o)
    return p, o


def plan_requests(workload: Workload, caps: Caps = Caps()) -> Iterator[PlannedRequest]:
    """The workload's requests in arrival order, with the caps applied (lazily)."""
    for i, r in enumerate(workload):
        yield PlannedRequest(i, r.arrival, *capped(r.prompt_tokens, r.output_tokens, caps))


class PromptMaker:
    """Token-id prompts from a seeded generator; called in arrival order, so reproducible."""

    def __init__(self, seed: int, lo: int = 1, hi: int = 255) -> None:
        self.rng = np.random.default_rng([seed, PROMPT_SEED_SALT])
        self.lo, self.hi = lo, hi

    def __call__(self, n: int) -> list[int]:
        return self.rng.integers(self.lo, self.hi + 1, n).tolist()

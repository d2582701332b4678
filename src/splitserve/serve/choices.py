"""The choices of one API request: `n` (and `best_of`) fan out into that many requests to the
router, as vLLM v1 does with a parent request's children. Each child runs on its own (routed,
batched, restarted like any request). The prompt's KV is shared through the workers' prefix
caches: with them on (`serve --prefix-caching`, the default), the first child goes alone and the
others follow its first token (as SGLang's parallel sampling caches the prefix first), so that
those routed to the worker that ran its prompt take its full blocks from the cache (all of them
with one prompt worker; with several, the cluster's routing decides). Child i samples with
`seed + i` when a seed is given (ASSUMED: the OpenAI API does not say; the same seed for all would
give n equal choices).

Their events reach the handler through one queue, tagged with the child's index (`Tagged`), so
that a response is built from whichever child speaks next. `best_of` > n: every child is scored
(its tokens' logprobs kept), and the n with the highest cumulative logprob are answered, best
first, as vLLM did; `usage` counts the tokens of all of them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from .detokenize import Detokenizer
from .messages import WireParams


class Tagged:
    """A child's event queue as the router sees it (`put_nowait`): into the shared queue, as (index, event)."""

    __slots__ = ("q", "i")

    def __init__(self, q: asyncio.Queue, i: int) -> None:
        self.q, self.i = q, i

    def put_nowait(self, ev: tuple) -> None:
        self.q.put_nowait((self.i, ev))


def child_params(p: WireParams, i: int, scored: bool) -> WireParams:
    """Child i's parameters: seed + i; `scored` (best_of > n): its tokens' logprobs are kept."""
    seed = p.seed + i if p.seed is not None else None
    return replace(p, seed=seed, logprobs=p.logprobs if p.logprobs is not None or not scored else 0)


@dataclass
class Choice:
    """What one child has produced so far."""

    detok: Detokenizer
    tokens: list[int] = field(default_factory=list)
    recs: list = field(default_factory=list)
    reason: str | None = None

    @property
    def score(self) -> float:
        return sum(r[1] for r in self.recs)


def best(choices: list[Choice], n: int) -> list[Choice]:
    """The n choices of highest cumulative logprob, best first (all of them, in order, when n
    covers them)."""
    if n >= len(choices):
        return choices
    return sorted(choices, key=lambda c: c.score, reverse=True)[:n]


async def collect(router, reqs: list, q: asyncio.Queue, choices: list[Choice], first: tuple) -> None:
    """Every child's events, from `first` on, into `choices` until all are done; `Failed` at a
    child's error event."""
    left = len(reqs)
    i, ev = first
    while True:
        c = choices[i]
        if c.reason is None:
            if ev[0] == "tokens":
                c.tokens += ev[1]
                if ev[2] is not None:
                    c.recs += ev[2]
                if c.detok.stop:  # else the text is decoded once, at the end
                    c.detok.push(ev[1])
                if c.detok.stopped:
                    router.cancel(reqs[i])
                    c.reason = "stop"
            elif ev[0] == "done":
                c.reason = ev[1]
            else:
                raise Failed(ev)
            if c.reason is not None:
                left -= 1
                if not left:
                    return
        i, ev = await q.get()


class Failed(Exception):
    """A child's ("error", ...) event."""

    def __init__(self, ev: tuple) -> None:
        super().__init__(ev[1])
        self.ev = ev

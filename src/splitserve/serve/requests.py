"""The router's requests: each one as the router tracks it across its tries, and the table that
finds it by its id, its current try's wire id and its policy request."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..policy.state import Request
from .messages import Stage, WireParams

if TYPE_CHECKING:
    from .prefix_view import PrefixView


@dataclass(eq=False)
class LiveRequest:
    id: int
    name: str                  # the id the client sees (cmpl-...): errors and logs name it
    prompt_ids: list[int]
    params: WireParams
    created: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)   # events for the HTTP handler (put_nowait)
    delivered: list[int] = field(default_factory=list)
    produced: int = 0          # tokens seen from the current try
    tries: int = 0             # wire ids so far: each try, and each resumed placement, has its own <id>.<n>
    attempt: int = 0           # failed tries that count against max_attempts
    wire: str = ""
    pr: Request | None = None  # the current try in the policy's view
    stage: Stage = Stage.NEW
    split: bool = False
    strikes: int = 0           # failed engine steps it was in
    isolated: bool = False     # run in engine steps of its own (it was in a failed step)
    scheduled_at: float = 0.0  # the first step report holding its prompt (any try): metrics' queue time
    first_at: float = 0.0
    last_at: float = 0.0
    parked_at: float = 0.0
    finish_reason: str | None = None
    cached_tokens: int = 0     # prompt tokens its latest try's prefill took from a prefix cache
    prompt_logprobs: list | None = None  # its prompt's logprob records, where it asked (with its first token)
    blocks: list[int] | None = None  # its prompt's full blocks' names (serve/prefix_view.py), for every try
    cache_key: int = -1        # its prompt cache key's hash (policy/prefix_routing.py), -1: none

    @property
    def routed(self) -> Request:
        """`pr`, for the router's parts that act on a routed try (a request in `RequestTable.by_wire`,
        or one handed to them after `RequestTable.new_try`)."""
        pr = self.pr
        assert pr is not None, f"request {self.name} has no try yet"
        return pr

    def work(self) -> tuple[list[int], WireParams, int | None]:
        """What a worker runs of it: its prompt, or after a preemption that sent it back through the
        prompt pool (`--recompute prompt-pool`) its prompt and the `resumed` tokens its try made
        (its prompt scored already): (ids, params, resumed or None)."""
        g = self.pr.generated if self.pr is not None else 0
        if not g:
            return self.prompt_ids, self.params, None
        return self.prompt_ids + self.delivered[:g], dataclasses.replace(self.params, prompt_logprobs=None), g


class RequestTable:
    """Requests in flight (admitted, not ended), by id, by wire id and by policy request id."""

    def __init__(self) -> None:
        self.active: dict[int, LiveRequest] = {}
        self.by_wire: dict[str, LiveRequest] = {}
        self.by_policy: dict[int, LiveRequest] = {}
        self.parked: list[LiveRequest] = []
        self._ids = itertools.count()
        self._pids = itertools.count()

    def __len__(self) -> int:
        return len(self.active)

    def new(self, name: str, prompt_ids: list[int], params: WireParams, now: float,
            queue: asyncio.Queue | None = None) -> LiveRequest:
        req = LiveRequest(next(self._ids), name, list(prompt_ids), params, now)
        if queue is not None:
            req.queue = queue
        self.active[req.id] = req
        return req

    def new_try(self, req: LiveRequest, now: float, prefix: PrefixView | None = None) -> Request:
        """A policy request for the next try of `req`, with its own wire id; `prefix`: the router's
        PrefixView (serve/prefix_view.py), which names its prompt's blocks (once), or None."""
        r = Request(next(self._pids), now, len(req.prompt_ids), req.params.max_tokens, isolated=req.isolated)
        if prefix is not None:
            if req.blocks is None:
                req.blocks = prefix.names(req.prompt_ids)
            r.blocks = req.blocks
            r.cache_key = req.cache_key  # a routing hint only where caches are
        req.pr = r
        req.wire = f"{req.id}.{req.tries}"
        req.tries += 1
        req.produced = 0
        return r

    def rewire(self, req: LiveRequest) -> None:
        """`req` goes on under a new wire id (the same policy request, the tokens it made kept): a
        placement's late messages, such as its prompt worker's first token overtaken by the token
        worker's word, are then ignored, not read as the next placement's."""
        self.by_wire.pop(req.wire, None)
        req.wire = f"{req.id}.{req.tries}"
        req.tries += 1
        self.by_wire[req.wire] = req

    def track(self, req: LiveRequest) -> None:
        """Its current try is routed: messages about it can find it."""
        self.by_wire[req.wire] = req
        self.by_policy[req.routed.id] = req

    def untrack(self, req: LiveRequest) -> None:
        """Its current try is over: what it still says is ignored."""
        self.by_wire.pop(req.wire, None)
        if req.pr is not None:
            self.by_policy.pop(req.pr.id, None)

    def end(self, req: LiveRequest) -> None:
        req.stage = Stage.DONE
        self.active.pop(req.id, None)
        self.untrack(req)
        if req in self.parked:
            self.parked.remove(req)

    def on_worker(self, wid: int) -> list[LiveRequest]:
        """Requests whose current try runs (or waits) on worker `wid`."""
        return [q for q in self.by_wire.values() if q.pr is not None and wid in (q.pr.prompt_machine, q.pr.token_machine)]

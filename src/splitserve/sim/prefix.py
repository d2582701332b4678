"""The simulator's prefix caches: each machine's KV blocks by name (policy/prefix_cache.py
BlockCache, the engine's hashing and least-recently-freed order), on a workload whose requests
carry their prompts' tokens (workload/conversations.py). A part of `Simulation`.

As the engine: a prompt's first chunk attaches its longest cached prefix in whole blocks below
the chunk's end, and only the rest is computed (`Batch.cached`, which the step-time models take
off the batch's prompt tokens); a machine names a prompt's blocks when its prefill ends and when
its KV lands there, and a finished request frees its prompt's and its output's blocks last to
first on the machine that decoded it; the hand-over skips what the token machine's cache holds
(sim/handoff.py `_transfer_skip`). Caches are only names: the KV counters of the policy still count every request's
whole prompt, as the engine's own policy view does. A conversation's next turn arrives the think
time after the client sees its reply (the path overhead after its last token), its prompt carrying a
stand-in reply of the same length (`Conversations.stand_in`). Hit rate counts tokens, as vLLM's
prefix-cache metrics: every prefill's prompt tokens queried, the cached ones hit.
"""

from __future__ import annotations

from typing import Any

from mypy_extensions import trait

from ..policy.machine import Batch
from ..policy.prefix_cache import BlockCache, cached_tokens, extend_hashes
from ..policy.state import Machine, Request
from ..workload.conversations import Conversations
from .events import TURN
from .metrics import Metrics


@trait
class PrefixCaching:
    """Simulation's prefix caches and conversations (its state is the simulation's)."""
    machines: list[Machine]
    metrics: Metrics
    path_s: float
    prefix: bool                  # caches modelled: the workload carries prompts and caching is on
    block: int                    # tokens per KV block
    conversations: Any            # the workload, when it is conversations (next turns), else None
    turns: dict[int, Any]         # request id -> its turn (until it completes)

    def _push(self, t: float, kind: int, obj: object) -> None: ...

    def _prefix_init(self, workload: object, caching: bool, block: int) -> None:
        self.conversations = workload if isinstance(workload, Conversations) else None
        self.prefix = caching and self.conversations is not None
        self.block = block
        self.turns = {}
        if self.prefix:
            for m in self.machines:
                m.cache = BlockCache(m.kv_capacity // block)

    def _prefix_arrive(self, r: Request, turn: Any) -> None:
        if self.prefix:
            r.blocks = extend_hashes([], turn.prompt, self.block)
        self.turns[r.id] = turn

    def _prefix_start(self, m: Machine, batch: Batch) -> None:
        """Prompts starting their first chunk on `m` attach their cached prefixes."""
        mt, bs = self.metrics, self.block
        for r, n in zip(batch.prompts, batch.chunks):
            if r.prefilled == 0 and r.blocks is not None:
                r.cached = cached_tokens(m.cache, r.blocks, n, bs)
                batch.cached += r.cached
                mt.prefix_queries += r.prompt_tokens
                mt.prefix_hits += r.cached

    def _prefix_named(self, m: Machine, r: Request) -> None:
        """`m` holds `r`'s prompt's blocks (its prefill ended there, or its KV landed there)."""
        if r.blocks is not None:
            m.cache.free(r.blocks)

    def _prefix_complete(self, r: Request, now: float) -> None:
        """`r` finished: its decode machine frees its blocks; its conversation's next turn is due."""
        turn = self.turns.pop(r.id, None)
        if turn is None:
            return
        reply = self.conversations.stand_in(turn)
        if self.prefix:
            names = extend_hashes(list(r.blocks or ()), turn.prompt + reply[:-1], self.block)
            self.machines[r.token_machine].cache.free(names)
        nxt = self.conversations.follow(turn, reply, now + self.path_s)
        if nxt is not None:
            self._push(nxt.arrival, TURN, nxt)

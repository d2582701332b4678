"""The simulator's prefix caches: each machine's KV blocks by name (policy/prefix_cache.py
BlockCache, the engine's hashing and least-recently-freed order), on a workload whose requests
carry their prompts' tokens (workload/conversations.py), and the conversations' next turns.

As the engine: a prompt's first chunk attaches its longest cached prefix in whole blocks below
the chunk's end, and only the rest is computed (`Batch.cached`, which the step-time models take
off the batch's prompt tokens); a machine names a prompt's blocks when its prefill ends and when
its KV lands there, and a finished request frees its prompt's and its output's blocks last to
first on the machine that decoded it; the hand-over skips what the token machine's cache holds
(sim/handoff.py `KVHandoff.skipped`). Caches are only names: the KV counters of the policy still
count every request's whole prompt, as the engine's own policy view does. A conversation's next
turn arrives the think time after the client sees its reply (the path overhead after its last
token), its prompt carrying a stand-in reply of the same length (`Conversations.stand_in`). Hit
rate counts tokens, as vLLM's prefix-cache metrics: every prefill's prompt tokens queried, the
cached ones hit.
"""

from __future__ import annotations

from typing import Any

from ..policy.machine import Batch
from ..policy.prefix_cache import BlockCache, cached_tokens, extend_hashes
from ..policy.state import Machine, Request
from ..workload.conversations import Conversations
from .events import TURN
from .state import SimState


class PrefixCaches:
    """A conversations workload's caches (`caching`: modelled, else only the next turns) and the
    turn of each request in flight, until it completes."""

    def __init__(self, state: SimState, conversations: Conversations, caching: bool, block: int,
                 path_s: float) -> None:
        self.state = state
        self.conversations = conversations
        self.caching = caching
        self.block = block            # tokens per KV block
        self.path_s = path_s          # the serving path's seconds to the client
        self.turns: dict[int, Any] = {}
        if caching:
            for m in state.machines:
                m.cache = BlockCache(m.kv_capacity // block)

    def arrive(self, r: Request, turn: Any) -> None:
        """`r` is `turn` of its conversation: its prompt's block names, where caches are modelled."""
        if self.caching:
            r.blocks = extend_hashes([], turn.prompt, self.block)
        self.turns[r.id] = turn

    def start(self, m: Machine, batch: Batch) -> None:
        """Prompts starting their first chunk on `m` attach their cached prefixes."""
        if not self.caching:
            return
        mt, bs = self.state.metrics, self.block
        for r, n in zip(batch.prompts, batch.chunks):
            if r.prefilled == 0 and r.blocks is not None:
                r.cached = cached_tokens(m.cache, r.blocks, n, bs)
                batch.cached += r.cached
                mt.prefix_queries += r.prompt_tokens
                mt.prefix_hits += r.cached

    def named(self, m: Machine, r: Request) -> None:
        """`m` holds `r`'s prompt's blocks (its prefill ended there, or its KV landed there)."""
        if r.blocks is not None:
            m.cache.free(r.blocks)

    def complete(self, r: Request, now: float) -> None:
        """`r` finished: its decode machine frees its blocks; its conversation's next turn is due."""
        turn = self.turns.pop(r.id, None)
        if turn is None:
            return
        reply = self.conversations.stand_in(turn)
        if self.caching:
            names = extend_hashes(list(r.blocks or ()), turn.prompt + reply[:-1], self.block)
            self.state.machines[r.token_machine].cache.free(names)
        nxt = self.conversations.follow(turn, reply, now + self.path_s)
        if nxt is not None:
            self.state.push(nxt.arrival, TURN, nxt)

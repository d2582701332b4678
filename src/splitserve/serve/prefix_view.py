"""The router's view of what each worker's prefix cache holds, for prefix-aware routing
(policy/prefix_routing.py `pick`, the simulator's rule): each policy `Machine` of the router's view
(serve/cluster_state.py) gets a `BlockCache` of the worker's KV blocks (policy/prefix_cache.py),
each request's policy `Request` its prompt's full-block names before it is routed. No I/O.

It follows what happens as the simulator's model does (sim/prefix.py):

    router learns                               the view
    a prompt's prefill ended (its first token)  its prompt worker holds the prompt's blocks
    its KV landed on its token worker (kv_in)   so does the token worker
    a request finished                          its decoding worker holds prompt + output[:-1]
    a request left early while decoding         likewise, with the tokens the router has seen
    a worker died (or was replaced)             its view is emptied

and is corrected by the workers' reports: a prompt worker's `step` says how many tokens its cache
gave each prompt starting there (`cached`), a token worker's `reserved` how many of a prompt it held
(`skip`). Fewer than the view predicted (the worker evicted blocks the view still names; its cache
is least recently freed first, as the view's, but the view cannot see its allocations): the view
drops the names from the reported block on. A prompt worker's prediction is made when its prompt
is sent (`sent`, kept in the policy request's `cached` until the report replaces it with what the
worker found); a token worker's when its `reserved` is read (messages from one worker arrive in
order, so the view then holds nothing that worker learnt after it reserved).
"""

from __future__ import annotations

from ..policy.prefix_cache import BlockCache, attachable, cached_tokens, extend_hashes
from ..policy.state import Machine, Phase, Request


class PrefixView:
    """The cache views of one router's machines, for workers whose KV blocks hold `block` tokens."""

    __slots__ = ("block",)

    def __init__(self, block: int) -> None:
        self.block = block

    def names(self, prompt_ids: list[int]) -> list[int]:
        """A prompt's full blocks' names (the engine's hashing: one pass over the prompt)."""
        return extend_hashes([], prompt_ids, self.block)

    def fresh(self, m: Machine) -> None:
        """`m` is a new (or replacement) worker: it holds nothing yet."""
        m.cache = BlockCache(m.kv_capacity // self.block)

    def holds(self, m: Machine, r: Request) -> None:
        """`m` holds `r`'s prompt's blocks (its prefill ended there, or its KV landed there)."""
        if r.blocks:
            m.cache.free(r.blocks)

    def sent(self, m: Machine, r: Request) -> None:
        """`r`'s prompt goes to `m`: the tokens its cache should give it (whole blocks below the
        prompt's last token), kept in `r.cached` until the worker's report."""
        r.cached = cached_tokens(m.cache, r.blocks, r.prompt_tokens, self.block) if r.blocks else 0

    def reported(self, m: Machine, r: Request, chunk: int, cached: int) -> None:
        """Prompt worker `m` started `r` with a first chunk of `chunk` tokens, `cached` of them from
        its cache (a recompute after a preemption, `r.generated` > 0, was predicted nothing)."""
        bs = self.block
        if r.blocks and not r.generated and cached < attachable(r.cached // bs, chunk, bs) * bs:
            m.cache.drop(r.blocks[cached // bs:])
        r.cached = cached

    def reserved(self, m: Machine, r: Request, skip: int) -> None:
        """Token worker `m` reserved `r`'s KV holding its first `skip` prompt tokens already."""
        if r.blocks and skip < cached_tokens(m.cache, r.blocks, r.prompt_tokens, self.block):
            m.cache.drop(r.blocks[skip // self.block:])

    def finished(self, m: Machine, r: Request, tokens: list[int]) -> None:
        """`r` ended on `m`, which computed the KV of `tokens` (its prompt and outputs but the
        last): `m` frees their blocks, last to first."""
        if r.blocks is not None:
            m.cache.free(extend_hashes(list(r.blocks), tokens, self.block))

    def leaving(self, m: Machine, r: Request, tokens: list[int]) -> None:
        """`r` leaves early (before its release): where it decoded on `m`, `m` frees the blocks of
        `tokens` (its prompt and the outputs the router has seen) but the last token's."""
        if r.phase is Phase.DECODE or r.phase is Phase.READY:
            self.finished(m, r, tokens[:-1])

    @staticmethod
    def emptied(m: Machine) -> None:
        """`m`'s worker died: whatever it held is gone."""
        if m.cache is not None:
            m.cache.names.clear()

"""Splitwise's pools (paper §IV-A) and the unsplit JSQ baseline, as cluster schedulers.

`SplitwiseScheduler` keeps a prompt, a token and a mixed pool. On arrival it picks the pair at
once, each by Join-the-Shortest-Queue over pending tokens. A machine past a threshold counts as
full (by default the authors' rule, as their simulator's `MixedPoolScheduler.is_queue_long`: a
prompt machine with prompts queued whose queued and running prompt tokens plus the arriving
prompt's pass it; `overflow_rule="queued"`: its queued prompt tokens alone pass it; a token
machine: decode tokens wait for its KV memory): the request then goes to the least-loaded
mixed-pool machine, and when the mixed pool is full too, a machine of the opposite pool is
borrowed into the mixed pool; when every candidate is full, JSQ runs over the pool and the mixed
pool together. A mixed machine runs whole requests with mixed batching, like an unsplit machine,
and returns to its own pool once it holds no work of the opposite kind. A request whose token
machine has no KV memory yet waits there and picks its prompt machine when it is admitted, so
the prompt side is chosen by the load of that moment (policy/cluster.py admit_freed).

`JSQScheduler` is the unsplit baseline: every machine mixed, JSQ over all of them.
"""

from __future__ import annotations

from operator import attrgetter

from .cluster import ClusterScheduler, RoutingConfig
from .predictor import make_predictor
from .state import Machine, Pool, Request
from .tetriinfer import Registry, pick_decode

_pending = attrgetter("pending")        # pending tokens: the JSQ queue length


class SplitwiseScheduler(ClusterScheduler):
    def __init__(self, machines: list[Machine], cfg: RoutingConfig = RoutingConfig()) -> None:
        self.cfg = cfg
        self.pools: dict[Pool, list[Machine]] = {Pool.PROMPT: [], Pool.TOKEN: [], Pool.MIXED: []}
        for m in machines:
            self.pools[m.pool].append(m)
        if not self.pools[Pool.PROMPT] or not self.pools[Pool.TOKEN]:
            raise ValueError("Splitwise needs at least one prompt and one token machine")
        self.borrowed = 0                # machines moved into the mixed pool so far
        if cfg.decode_dispatch == "tetriinfer":
            self.predictor, self.registry = make_predictor(cfg.predictor), Registry()

    def _move(self, m: Machine, to: Pool) -> None:
        self.pools[m.pool].remove(m)
        m.pool = to
        self.pools[to].append(m)

    def _prompt_full(self, m: Machine, r: Request) -> bool:
        """Whether `m` takes no more prompts (the overflow rule, RoutingConfig)."""
        if self.cfg.overflow_rule == "queued":
            return m.queued_prompt_tokens > self.cfg.prompt_queue_threshold
        return bool(m.prompt_queue) and (m.queued_prompt_tokens + m.running_prompt_tokens + r.prompt_tokens
                                         > self.cfg.prompt_queue_threshold)

    def _full(self, m: Machine, r: Request) -> bool:
        return self._prompt_full(m, r) or m.queued_decode_tokens > self.cfg.token_queue_threshold

    def _overflow(self, r: Request, lender: Pool, exclude: Machine | None = None) -> Machine | None:
        """A machine of the mixed pool with room for `r`, else one borrowed from `lender`."""
        mixed = [m for m in self.pools[Pool.MIXED] if not self._full(m, r)]
        if mixed:
            return min(mixed, key=_pending)
        candidates = [m for m in self.pools[lender] if m is not exclude]
        if len(candidates) < 1 or len(self.pools[lender]) < 2:
            return None                  # never empty a pool by borrowing its last machine
        m = min(candidates, key=_pending)
        self._move(m, Pool.MIXED)
        self.borrowed += 1
        return m

    def pick_prompt(self, r: Request) -> Machine:
        """The prompt machine for `r`: JSQ over the prompt pool; when that one is full (the
        overflow rule), a mixed machine with room or one borrowed from the token pool; when every
        candidate is full, JSQ over the prompt and mixed pools together."""
        prompts = self.pools[Pool.PROMPT]
        p = min(prompts, key=_pending) if prompts else None
        if p is not None and (not self.cfg.mixed_pool or not self._prompt_full(p, r)):
            return p
        m = self._overflow(r, Pool.TOKEN) if self.cfg.mixed_pool else None
        if m is not None:
            return m
        return min(prompts + self.pools[Pool.MIXED], key=_pending)

    def pick_token(self, r: Request, p: Machine) -> Machine:
        """The token machine for `r` prefilled on `p`, by the same rules from the other side. A
        mixed `p` decodes its own requests."""
        if p.pool is Pool.MIXED:
            return p
        tokens = self.pools[Pool.TOKEN]
        if tokens and self.cfg.decode_dispatch == "tetriinfer":
            return pick_decode(tokens, r, self.predictor, self.registry)
        t = min(tokens, key=_pending) if tokens else None
        if t is not None and (not self.cfg.mixed_pool
                              or t.queued_decode_tokens <= self.cfg.token_queue_threshold):
            return t
        m = self._overflow(r, Pool.PROMPT, exclude=p) if self.cfg.mixed_pool else None
        if m is not None:
            return m
        return min(tokens + self.pools[Pool.MIXED], key=_pending)

    def route(self, r: Request) -> tuple[Machine, Machine]:
        """Pick (prompt machine, token machine) for a new request; equal when it runs unsplit."""
        p = self.pick_prompt(r)
        return p, self.pick_token(r, p)

    def add(self, m: Machine) -> None:
        self.pools[m.pool].append(m)

    def remove(self, m: Machine) -> None:
        if m in self.pools[m.pool]:
            self.pools[m.pool].remove(m)

    def settle(self, m: Machine) -> None:
        """After an iteration: a mixed machine with no work of the opposite kind goes home."""
        if m.pool is not Pool.MIXED:
            return
        if m.home is Pool.PROMPT:
            opposite = m.running or m.ready or m.admit_queue or m.inbound_tokens
        else:
            opposite = m.prompt_queue or m.running_prompt_tokens
        if not opposite:
            self._move(m, m.home)


class JSQScheduler(ClusterScheduler):
    """Unsplit baseline: each request runs whole on the machine with the fewest pending tokens."""

    def __init__(self, machines: list[Machine]) -> None:
        for m in machines:
            m.pool = m.home = Pool.MIXED
        self.machines = list(machines)  # its own list: removing a dead machine must not shrink the caller's
        self.borrowed = 0

    def route(self, r: Request) -> tuple[Machine, Machine]:
        m = min(self.machines, key=_pending)
        return m, m

    def pick_prompt(self, r: Request) -> Machine:
        return next(m for m in self.machines if m.id == r.token_machine)

    def add(self, m: Machine) -> None:
        m.pool = m.home = Pool.MIXED
        self.machines.append(m)

    def remove(self, m: Machine) -> None:
        if m in self.machines:
            self.machines.remove(m)

"""Splitwise's pools (paper §IV-A) and the unsplit JSQ baseline, as cluster schedulers.

`SplitwiseScheduler` keeps a prompt, a token and a mixed pool, and picks each arriving request's
pair at once, each by Join-the-Shortest-Queue over pending tokens. A machine past a threshold is
full: a prompt machine by `overflow_rule` ("authors", as their simulator's
`MixedPoolScheduler.is_queue_long`: its queued and running prompt tokens plus the arriving
prompt's, with prompts queued; "queued": its queued prompt tokens alone); a token machine when
decode tokens wait for its KV memory, or with `token_tbt_slo` when its next decode step with the
request would take longer (by the simulator's step times, or the live router's fit `LIVE_FIT`).
Two borrowing rules (RoutingConfig.borrow_rule):

- "authors" (default; their simulator's `MixedPoolScheduler.schedule`, which produced the paper's
  numbers): each side takes the shortest queue of its pool, else of the mixed pool, each only if
  not full; a side with none borrows the other pool's shortest queue into the mixed pool (its last
  machine too), and when the lender is empty the request runs whole on the shortest queue of all.
  The two sides are picked apart; a mixed machine goes home only once it holds no work at all.
- "splitserve": a full pool sends the request to the least-loaded mixed machine, which runs it
  whole; when that is full too, a machine of the opposite pool is borrowed (never a pool's last);
  when every candidate is full, JSQ over the pool and the mixed pool together. A mixed machine
  goes home once it holds no work of the opposite kind.

A mixed machine runs what it holds with mixed batching, as an unsplit one. A request waiting for
its token machine's KV memory picks its prompt machine when admitted (policy/cluster.py
admit_freed). `JSQScheduler` is the unsplit baseline: every machine mixed, JSQ over all.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from .cluster import ClusterScheduler, RoutingConfig
from .latency import LIVE_FIT, BatchLatency
from .predictor import make_predictor
from .prefix_routing import CacheKeys, least_pending, pick
from .state import Machine, Pool, Request
from .tetriinfer import Registry, pick_decode

_pending = attrgetter("pending")        # pending tokens: the JSQ queue length
Full = Callable[[Machine, Request], bool]   # whether a side's machine is too full to take a request


def move(pools: dict[Pool, list[Machine]], m: Machine, to: Pool) -> None:
    """Machine `m` leaves its pool of `pools` for pool `to`."""
    pools[m.pool].remove(m)
    m.pool = to
    pools[to].append(m)


class SplitwiseScheduler(ClusterScheduler):
    """Splitwise's prompt, token and mixed pools, each request's pair picked at arrival (the
    module's docstring)."""

    def __init__(self, machines: list[Machine], cfg: RoutingConfig = RoutingConfig()) -> None:
        self.cfg = cfg
        self.pools: dict[Pool, list[Machine]] = {Pool.PROMPT: [], Pool.TOKEN: [], Pool.MIXED: []}
        for m in machines:
            self.pools[m.pool].append(m)
        if not self.pools[Pool.PROMPT] or not self.pools[Pool.TOKEN]:
            raise ValueError("Splitwise needs at least one prompt and one token machine")
        self.borrowed = 0                # machines moved into the mixed pool so far
        self.keys = CacheKeys()          # each prompt cache key's prompt machine (prefix_routing.py)
        self.authors = cfg.borrow_rule == "authors"
        self.lat: BatchLatency = LIVE_FIT
        if cfg.decode_dispatch == "tetriinfer":
            self.predictor, self.registry = make_predictor(cfg.predictor), Registry()

    def _prompt_full(self, m: Machine, r: Request) -> bool:
        """Whether `m` takes no more prompts (the overflow rule, RoutingConfig)."""
        if self.cfg.overflow_rule == "queued":
            return m.queued_prompt_tokens > self.cfg.prompt_queue_threshold
        return bool(m.prompt_queue) and (m.queued_prompt_tokens + m.running_prompt_tokens + r.prompt_tokens
                                         > self.cfg.prompt_queue_threshold)

    def bind_latency(self, latency: BatchLatency) -> None:
        """The simulator's step times (its machines' perf models), in place of LIVE_FIT."""
        self.lat = latency

    def _token_full(self, m: Machine, r: Request) -> bool:
        """Whether `m` takes no more decodes: decode tokens wait for its KV memory, or (with
        `token_tbt_slo`) its decodes with `r` joined (running, ready, waiting to start) would make a
        step longer than the SLO, their KV the running decodes' plus `r`'s prompt."""
        if m.queued_decode_tokens > self.cfg.token_queue_threshold:
            return True
        slo = self.cfg.token_tbt_slo
        if slo <= 0.0:
            return False
        batch = len(m.running) + len(m.ready) + len(m.decode_queue) + 1
        return self.lat.decode_time(m, batch, m.context_tokens + r.prompt_tokens) > slo

    # ---- the authors' rule (borrow_rule="authors") ------------------------------------------------
    def _shortest(self, pool: Pool, r: Request, full: Full, exclude: int = -1) -> Machine | None:
        """The shortest queue of `pool` (but machine `exclude`), or None if none or it is `full`; in
        the prompt pool, a request's prompt cache key's machine first (prefix_routing.CacheKeys)."""
        ms = [m for m in self.pools[pool] if m.id != exclude] if exclude >= 0 else self.pools[pool]
        if not ms:
            return None
        m = self.keys.pick(ms, r, self.cfg.prefix_slack) if pool is Pool.PROMPT else pick(ms, r, self.cfg.prefix_slack)
        return None if full(m, r) else m

    def _borrow(self, lender: Pool, exclude: int = -1) -> Machine | None:
        """The shortest queue of `lender` (but machine `exclude`), moved into the mixed pool; None
        when the lender has no machine left."""
        ms = [m for m in self.pools[lender] if m.id != exclude]
        if not ms:
            return None
        m = least_pending(ms)
        move(self.pools, m, Pool.MIXED)
        self.borrowed += 1
        return m

    def _side(self, own: Pool, r: Request, full: Full, exclude: int = -1) -> Machine | None:
        """A side's machine by the authors' rule, borrowing nothing: its pool's shortest queue,
        else the mixed pool's, each only if not `full`."""
        m = self._shortest(own, r, full, exclude)
        return m if m is not None else self._shortest(Pool.MIXED, r, full, exclude)

    def _route_authors(self, r: Request) -> tuple[Machine, Machine]:
        """MixedPoolScheduler.schedule: each side from its pool, else the mixed pool; then the prompt
        side borrows (from the token pool), then the token side (from the prompt pool); a side with
        nothing to borrow runs the request whole on the shortest queue of all."""
        p = self._side(Pool.PROMPT, r, self._prompt_full)
        t = self._side(Pool.TOKEN, r, self._token_full)    # picked before a borrow: may be borrowed as p
        if p is None:
            p = self._borrow(Pool.TOKEN)
        if t is None:
            t = self._borrow(Pool.PROMPT)
        if p is None or t is None:
            p = t = least_pending(self.pools[Pool.PROMPT], self.pools[Pool.MIXED], self.pools[Pool.TOKEN])
        return p, t

    def _overflow(self, r: Request, lender: Pool, exclude: Machine | None = None) -> Machine | None:
        """A machine of the mixed pool with room for `r`, else one borrowed from `lender`."""
        mixed = [m for m in self.pools[Pool.MIXED] if not (self._prompt_full(m, r) or self._token_full(m, r))]
        if mixed:
            return least_pending(mixed)
        candidates = [m for m in self.pools[lender] if m is not exclude]
        if len(candidates) < 1 or len(self.pools[lender]) < 2:
            return None                  # never empty a pool by borrowing its last machine
        m = least_pending(candidates)
        move(self.pools, m, Pool.MIXED)
        self.borrowed += 1
        return m

    def pick_prompt(self, r: Request) -> Machine:
        """The prompt machine for `r`: JSQ over the prompt pool; when that one is full (the
        overflow rule), a mixed machine with room or one borrowed from the token pool; when every
        candidate is full, JSQ over the prompt and mixed pools together. By the authors' rule (a
        request admitted late, its token machine chosen) never its own token machine."""
        prompts = self.pools[Pool.PROMPT]
        if self.authors and self.cfg.mixed_pool:
            t = r.token_machine
            p = self._side(Pool.PROMPT, r, self._prompt_full, t) or self._borrow(Pool.TOKEN, t)
            if p is not None:
                return p
            return min((m for m in prompts + self.pools[Pool.MIXED] if m.id != r.token_machine),
                       key=_pending, default=min(prompts + self.pools[Pool.MIXED], key=_pending))
        p = self.keys.pick(prompts, r, self.cfg.prefix_slack) if prompts else None
        if p is not None and (not self.cfg.mixed_pool or not self._prompt_full(p, r)):
            return p
        m = self._overflow(r, Pool.TOKEN) if self.cfg.mixed_pool else None
        if m is not None:
            return m
        return least_pending(prompts, self.pools[Pool.MIXED])

    def pick_token(self, r: Request, p: Machine) -> Machine:
        """The token machine for `r` prefilled on `p`, by the same rules from the other side. A
        mixed `p` decodes its own requests."""
        if p.pool is Pool.MIXED:
            return p
        tokens = self.pools[Pool.TOKEN]
        if tokens and self.cfg.decode_dispatch == "tetriinfer":
            return pick_decode(tokens, r, self.predictor, self.registry)
        t = pick(tokens, r, self.cfg.prefix_slack) if tokens else None
        if t is not None and (not self.cfg.mixed_pool or not self._token_full(t, r)):
            return t
        m = self._overflow(r, Pool.PROMPT, exclude=p) if self.cfg.mixed_pool else None
        if m is not None:
            return m
        return least_pending(tokens, self.pools[Pool.MIXED])

    def route(self, r: Request) -> tuple[Machine, Machine]:
        """Pick (prompt machine, token machine) for a new request; equal when it runs unsplit."""
        if self.authors and self.cfg.mixed_pool and self.cfg.decode_dispatch == "jsq":
            return self._route_authors(r)
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
        if self.authors:   # idle: notify_free_instance (KV still in flight to it is not work yet)
            if not (m.prompt_queue or m.running_prompt_tokens or m.running or m.ready or m.admit_queue
                    or m.decode_queue):
                move(self.pools, m, m.home)
            return
        if m.home is Pool.PROMPT:
            opposite = m.running or m.ready or m.admit_queue or m.inbound_tokens
        else:
            opposite = m.prompt_queue or m.running_prompt_tokens
        if not opposite:
            move(self.pools, m, m.home)


class JSQScheduler(ClusterScheduler):
    """Unsplit baseline: each request runs whole on the machine with the fewest pending tokens."""

    def __init__(self, machines: list[Machine], prefix_slack: int = -1) -> None:
        self.slack = prefix_slack
        for m in machines:
            m.pool = m.home = Pool.MIXED
        self.machines = list(machines)  # its own list: removing a dead machine must not shrink the caller's
        self.borrowed = 0
        self.keys = CacheKeys()         # each prompt cache key's machine (prefix_routing.py)

    def route(self, r: Request) -> tuple[Machine, Machine]:
        m = self.keys.pick(self.machines, r, self.slack)
        return m, m

    def pick_prompt(self, r: Request) -> Machine:
        return next(m for m in self.machines if m.id == r.token_machine)

    def add(self, m: Machine) -> None:
        m.pool = m.home = Pool.MIXED
        self.machines.append(m)

    def remove(self, m: Machine) -> None:
        if m in self.machines:
            self.machines.remove(m)

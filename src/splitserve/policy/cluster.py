"""Cluster-level scheduling (paper §IV-A): pool management and request routing.

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
the prompt side is chosen by the load of that moment.

`JSQScheduler` is the unsplit baseline: every machine mixed, JSQ over all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Callable, Protocol

from .state import Machine, Phase, Pool, Request
from .transitions import admit_waiting, check_fits, enqueue_prompt, reserve_decode


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingConfig:
    prompt_queue_threshold: int = 8192   # prefill tokens beyond which a prompt machine is full
    overflow_rule: str = "authors"       # what counts against it: "authors" (queued + running +
                                         # the arriving prompt, with prompts queued) or "queued"
    token_queue_threshold: int = 0       # queued decode tokens (waiting for KV memory) beyond which
                                         # a token machine is full
    mixed_pool: bool = True              # allow overflow into the mixed pool and borrowing
    kv_pull: bool = False                # DistServe: the token machine pulls a prefilled request's
                                         # KV when it has memory (else it reserves before the prefill)
    decode_dispatch: str = "jsq"         # the token machine: "jsq" (pending tokens) or "tetriinfer"
                                         # (policy/tetriinfer.py: power of two by predicted length)
    predictor: str = "oracle"            # output-length predictor of predictive policies (predictor.py)
    cluster_scheduler: str = "auto"      # CLUSTER_SCHEDULERS by name; auto: splitwise when the design
                                         # splits the phases, else jsq
    scale_window: float = 0.0            # aladdin: seconds of arrivals whose rate sizes the active
                                         # workers (0: no scaling; policy/aladdin.py)
    aladdin_ttft_slo: float = 0.0        # aladdin: TTFT SLO, s (0: the prefill of 4096 tokens)
    aladdin_atgt_slo: float = 0.0        # aladdin: ATGT SLO, s (0: 1.3 x a lone decode step at 4096)
    aladdin_theta: float = 0.9           # aladdin: theta, the share of the SLOs' room it packs to
    flip_idle_s: float = 60.0            # --cluster-scheduler tetriinfer: an instance idle this long
                                         # flips role (policy/instance_flip.py)


_pending = attrgetter("pending")        # pending tokens: the JSQ queue length


class ClusterScheduler(Protocol):
    """What the simulator and the live router need of a cluster-level scheduler."""

    borrowed: int

    def route(self, r: Request) -> tuple[Machine, Machine]:
        """(prompt machine, token machine) for a new request; the same machine: unsplit."""

    def pick_prompt(self, r: Request) -> Machine:
        """The prompt machine for `r`, admitted late (its token machine had no KV memory)."""

    def settle(self, m: Machine) -> None:
        """After `m`'s work changed: a machine lent to another pool may go home."""

    def add(self, m: Machine) -> None:
        """`m` joins (a replacement for a dead machine)."""

    def remove(self, m: Machine) -> None:
        """`m` is gone (dead); nothing is routed to it any more."""


def moves_kv(r: Request) -> bool:
    """Whether `r`'s KV moves from its prompt machine to its token machine: they differ, and it
    makes more than its first token (a one-token request ends where its prompt ran)."""
    return r.prompt_machine != r.token_machine and r.output_tokens > 1


def admit(cls: ClusterScheduler, r: Request, pull: bool = False) -> bool:
    """A request arrives: route it, check it can ever fit, reserve its KV on its token machine and
    queue its prompt. False: it waits for KV memory on its token machine, holding nothing
    (admit_freed queues its prompt later). DoesNotFit when a machine could never hold it.
    With `pull` (RoutingConfig.kv_pull, DistServe's pull): its prompt is queued at once and its
    token machine reserves its KV only when the prefill is done (`pull_kv`)."""
    p, t = cls.route(r)
    r.prompt_machine, r.token_machine = p.id, t.id
    if r.kv_need > p.kv_capacity or r.kv_need > t.kv_capacity:
        check_fits(p, r)
        check_fits(t, r)
    if not moves_kv(r) or pull or reserve_decode(t, r):
        enqueue_prompt(p, r)
        return True
    return False


def pull_kv(t: Machine, r: Request) -> bool:
    """Pull: `r`'s prefill is done (HANDOFF) and its KV waits on its prompt machine, whose memory is
    the queue. True: its token machine `t` has reserved memory and takes the KV now; False: `r`
    waits in `t`'s admit queue (FCFS) until admit_freed hands it over. Token machines never wait on
    prompt machines, so no two machines wait on each other (with no mixed pool: config.py)."""
    return reserve_decode(t, r)


def admit_freed(cls: ClusterScheduler, m: Machine) -> list[Request]:
    """KV memory was freed on `m`: the waiters it admits, each queued on the prompt machine chosen
    now, by the load of this moment; a waiter already prefilled (pull, in HANDOFF) is not queued:
    the caller moves its KV now."""
    admitted = admit_waiting(m)
    for r in admitted:
        if r.phase is Phase.HANDOFF:
            continue
        p = cls.pick_prompt(r)
        r.prompt_machine = p.id
        enqueue_prompt(p, r)
    return admitted


class SplitwiseScheduler:
    def __init__(self, machines: list[Machine], cfg: RoutingConfig = RoutingConfig()) -> None:
        self.cfg = cfg
        self.pools: dict[Pool, list[Machine]] = {Pool.PROMPT: [], Pool.TOKEN: [], Pool.MIXED: []}
        for m in machines:
            self.pools[m.pool].append(m)
        if not self.pools[Pool.PROMPT] or not self.pools[Pool.TOKEN]:
            raise ValueError("Splitwise needs at least one prompt and one token machine")
        self.borrowed = 0                # machines moved into the mixed pool so far
        if cfg.decode_dispatch == "tetriinfer":
            from .predictor import make_predictor
            from .tetriinfer import Registry
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
            from .tetriinfer import pick_decode
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


class JSQScheduler:
    """Unsplit baseline: each request runs whole on the machine with the fewest pending tokens."""

    def __init__(self, machines: list[Machine]) -> None:
        for m in machines:
            m.pool = m.home = Pool.MIXED
        self.machines = machines
        self.borrowed = 0

    def route(self, r: Request) -> tuple[Machine, Machine]:
        m = min(self.machines, key=_pending)
        return m, m

    def pick_prompt(self, r: Request) -> Machine:
        return next(m for m in self.machines if m.id == r.token_machine)

    def settle(self, m: Machine) -> None:
        pass

    def add(self, m: Machine) -> None:
        m.pool = m.home = Pool.MIXED
        self.machines.append(m)

    def remove(self, m: Machine) -> None:
        if m in self.machines:
            self.machines.remove(m)


def _splitwise(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    if not split:
        raise ValueError("the splitwise cluster scheduler needs a design with prompt and token pools")
    return SplitwiseScheduler(machines, cfg)


def _tetriinfer(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    if not split:
        raise ValueError("the tetriinfer cluster scheduler needs a design with prompt and token pools")
    from .instance_flip import InstanceFlipScheduler
    return InstanceFlipScheduler(machines, cfg)


def _aladdin(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    from .aladdin import AladdinScheduler
    return AladdinScheduler(machines, cfg, split)


# cluster-level schedulers by name (--cluster-scheduler): (machines, routing, split) -> scheduler
CLUSTER_SCHEDULERS: dict[str, Callable[[list[Machine], RoutingConfig, bool], ClusterScheduler]] = {
    "splitwise": _splitwise,
    "jsq": lambda machines, cfg, split: JSQScheduler(machines),
    "aladdin": _aladdin,
    "tetriinfer": _tetriinfer,
}


def make_cluster_scheduler(machines: list[Machine], cfg: RoutingConfig, split: bool) -> ClusterScheduler:
    """The cluster scheduler the routing config names; `auto`: Splitwise's for a design with prompt
    and token pools (`split`), JSQ over mixed machines otherwise. The simulator and the live router
    both build theirs here."""
    name = cfg.cluster_scheduler if cfg.cluster_scheduler != "auto" else ("splitwise" if split else "jsq")
    return CLUSTER_SCHEDULERS[name](machines, cfg, split)

"""Cluster-level scheduling (paper §IV-A): what every cluster scheduler answers, and how a request
is admitted through one.

`ClusterScheduler` is the base of every cluster scheduler (policy/pools.py: Splitwise's pools and
the JSQ baseline; policy/instance_flip.py: TetriInfer's; policy/aladdin.py: Aladdin's): each hook
the simulator and the live router call exists here with its default, so neither probes for one.
`arrive` is the one arrival path both take: the request carries its predicted length when the
machine scheduler wants one (policy/predictor.py `predict`), then `admit` routes it and reserves
its KV. The schedulers by name are in policy/cluster_schedulers.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .latency import BatchLatency
from .predictor import LengthPredictor, predict
from .state import Machine, Phase, Pool, Request
from .kv_allocation import check_fits
from .transitions import admit_waiting, enqueue_prompt, reserve_decode


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingConfig:
    prompt_queue_threshold: int = 8192   # prefill tokens beyond which a prompt machine is full
    overflow_rule: str = "authors"       # what counts against it: "authors" (queued + running +
                                         # the arriving prompt, with prompts queued) or "queued"
    borrow_rule: str = "authors"         # how machines are borrowed and given back: "authors" (their
                                         # simulator's MixedPoolScheduler.schedule: both machines picked
                                         # apart, a pool may lend its last machine, unsplit on the shortest
                                         # queue of all when nothing is left, home only when idle) or
                                         # "splitserve" (policy/pools.py)
    token_queue_threshold: int = 0       # queued decode tokens (waiting for KV memory) beyond which
                                         # a token machine is full
    token_tbt_slo: float = 0.0           # > 0: a token machine is full too when its next decode step with
                                         # the request would take longer (seconds; policy/pools.py); 0: off
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
    prefix_slack: int = 4096             # prefix-aware routing (policy/prefix_routing.py): a request
                                         # goes where its longest cached prefix is unless that machine's
                                         # pending tokens pass the least's by more (-1: off)


@dataclass(frozen=True, slots=True)
class Flip:
    """An instance's change of role (policy/instance_flip.py)."""

    at: float          # the watcher's time of the flip (s)
    machine: int
    to: Pool
    selected_at: float  # when it was selected and left its pool (drain time: at - selected_at)


class ClusterScheduler:
    """What the simulator and the live router need of a cluster-level scheduler: every hook, with
    its default (a subclass overrides what it does)."""

    borrowed: int = 0                # machines moved into the mixed pool so far
    watch_interval: float = 0.0      # seconds between two `watch` calls (0: no watcher)
    flips: Sequence[Flip] = ()       # role changes made so far (policy/instance_flip.py)

    def route(self, r: Request) -> tuple[Machine, Machine]:
        """(prompt machine, token machine) for a new request; the same machine: unsplit."""
        raise NotImplementedError

    def pick_prompt(self, r: Request) -> Machine:
        """The prompt machine for `r`, admitted late (its token machine had no KV memory)."""
        raise NotImplementedError

    def settle(self, m: Machine) -> None:
        """After `m`'s work changed: a machine lent to another pool may go home."""

    def add(self, m: Machine) -> None:
        """`m` joins (a replacement for a dead machine)."""
        raise NotImplementedError

    def remove(self, m: Machine) -> None:
        """`m` is gone (dead); nothing is routed to it any more."""
        raise NotImplementedError

    def watch(self, now: float, quiet: Callable[[Machine], bool] | None = None) -> list[Machine]:
        """The periodic watcher at time `now`, every `watch_interval`: the machines that changed
        role (they may start work). `quiet` (live only): whether the worker itself holds nothing."""
        return []

    def accepting(self, m: Machine) -> bool:
        """Whether new requests may be routed to `m` (a scaling scheduler's scaled-down workers
        take none)."""
        return True

    def bind_latency(self, latency: BatchLatency) -> None:
        """The simulator's batch latencies (its machines' perf models), for a scheduler that places
        by them (policy/aladdin.py); the live router keeps the scheduler's own."""

    def activity(self, end: float) -> dict[str, object] | None:
        """A scaling scheduler's report until `end` (seconds each worker was on; policy/aladdin.py);
        None: it scales nothing."""
        return None


def moves_kv(r: Request) -> bool:
    """Whether `r`'s KV moves from its prompt machine to its token machine: they differ, and it
    makes more than the token its prefill makes (a one-token request ends where its prompt ran; so
    does a decode sent back through the prompt pool with one token left)."""
    return r.prompt_machine != r.token_machine and r.output_tokens - r.generated > 1


def admit(cls: ClusterScheduler, r: Request, pull: bool = False, first: bool = False) -> bool:
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
    if not moves_kv(r) or pull or reserve_decode(t, r, first=first):
        enqueue_prompt(p, r)
        return True
    return False


def readmit(cls: ClusterScheduler, r: Request, pull: bool = False) -> bool:
    """A decode preempted on its token machine that recomputes through the prompt pool
    (`--recompute prompt-pool`; policy/preemption.py requeue left it, holding nothing): admitted
    again as at its arrival, by the load of this moment, its prefill its prompt and the tokens it
    made; its token machine takes their KV (and its next token's) as `admit` says, ahead of the
    requests waiting there (it was admitted before them). As `admit`."""
    return admit(cls, r, pull, first=True)


def arrive(cls: ClusterScheduler, r: Request, predictor: LengthPredictor | None, pull: bool = False) -> bool:
    """A request arrives, in the simulator and at the live router alike: it carries its predicted
    output when its machine scheduler schedules by one (`predictor`, policy/predictor.py
    arrival_predictor; None: no prediction), then is admitted (`admit`)."""
    if predictor is not None:
        predict(r, predictor)
    return admit(cls, r, pull)


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

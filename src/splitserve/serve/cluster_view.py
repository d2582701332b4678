"""The machines of the router's policy view, one per worker, and which of them are live: the state
the view's parts share (cluster_state.py `LiveCluster`, its transitions; cluster_prefixes.py, the
prefix caches' bookkeeping), typed in one place, and the changes of membership: a worker down, its
replacement up, a role flipped by the cluster scheduler's watcher."""

from __future__ import annotations

from ..policy.cluster import ClusterScheduler, RoutingConfig
from ..policy.cluster_schedulers import make_cluster_scheduler
from ..policy.kv_allocation import configure
from ..policy.machine import BatchingConfig
from ..policy.state import Machine, Pool, Request
from .prefix_view import PrefixView


class ClusterView:
    """The view's machines and what the parts share of them (module docstring)."""

    def __init__(self, homes: list[Pool], kv_tokens: list[int], split: bool, routing: RoutingConfig,
                 kv_block: int, batching: BatchingConfig, prefix: bool) -> None:
        """homes: each worker's role (its replacement joins it); kv_tokens: each worker's KV cache in
        tokens; kv_block: tokens per block (KV is held in whole blocks, as the workers' paged caches
        allocate it); batching: the workers' settings (each machine follows their KV allocation);
        prefix: whether the workers keep prefix caches (`prefix`: the view of them, else None).
        Every worker starts live, its machine fresh in its home pool, under the cluster scheduler
        `routing` names."""
        self.homes = list(homes)
        self.kv_tokens = list(kv_tokens)
        self.kv_block = kv_block
        self.batching = batching
        self.prefix = PrefixView(kv_block) if prefix else None
        self.machines = [self.new_machine(i, h, c) for i, (h, c) in enumerate(zip(homes, kv_tokens))]
        self.alive = [True] * len(self.machines)
        self.in_step: list[list[Request]] = [[] for _ in self.machines]  # prefill chunks running per worker
        self.cls: ClusterScheduler = make_cluster_scheduler(self.machines, routing, split)

    def new_machine(self, i: int, home: Pool, cap: int) -> Machine:
        m = Machine(i, "live", home=home, kv_capacity=cap, kv_block=self.kv_block)
        configure(m, self.batching)
        if self.prefix is not None:
            self.prefix.fresh(m)
        return m

    def live(self, m: Machine) -> bool:
        """`m` is the current machine of a live worker (not one a replacement took the place of)."""
        return self.alive[m.id] and self.machines[m.id] is m

    def decoder(self, r: Request) -> Machine:
        """The machine that makes `r`'s tokens: its token machine, or its prompt machine unsplit."""
        return self.machines[r.token_machine if r.token_machine >= 0 else r.prompt_machine]

    def accepting(self, m: Machine) -> bool:
        """Whether new requests may be routed to `m`: a scaling scheduler's scaled-down workers
        (policy/aladdin_scaling.py) stay up as warm standby, finish what they hold and take nothing new."""
        return self.cls.accepting(m)

    # ---- membership ---------------------------------------------------------------------------
    def down(self, i: int) -> None:
        """Worker i died; the caller has released every request that ran or waited on it."""
        m = self.machines[i]
        self.alive[i] = False
        self.in_step[i] = []
        self.cls.remove(m)
        PrefixView.emptied(m)

    def up(self, i: int, kv_tokens: int | None = None) -> None:
        """A (replacement) worker i joined: a fresh machine in its home pool."""
        if self.alive[i]:
            return
        m = self.new_machine(i, self.homes[i], kv_tokens if kv_tokens is not None else self.kv_tokens[i])
        self.machines[i] = m
        self.alive[i] = True
        self.cls.add(m)

    def watch(self, now: float, quiet=None) -> list[int]:
        """The cluster scheduler's watcher at time `now` (policy/instance_flip.py, the router calls it
        every `watch_interval` seconds): the workers that flipped role. `quiet(machine)`: whether
        the worker itself reports holding nothing (a flip waits for it too). A flipped worker's
        home is its new role (its replacement joins that role)."""
        flipped = self.cls.watch(now, quiet)
        for m in flipped:
            self.homes[m.id] = m.pool
        return [m.id for m in flipped]

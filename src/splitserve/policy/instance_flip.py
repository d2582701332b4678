"""TetriInfer's instance flip (Hu et al., 2024; §3.2 cluster monitor, §3.5 instance flip, §5.1
setting): prefill and decode instances are roles, not machines; a transition watcher moves an
instance from one role to the other as the load changes, within fixed hardware.

`InstanceFlipScheduler` (`--cluster-scheduler tetriinfer`) routes as `SplitwiseScheduler`
(policy/pools.py) with no mixed pool and TetriInfer's decode dispatch (policy/tetriinfer.py), and
adds the watcher, `watch(now)`, which the simulator calls every FLIP_CHECK_S of simulated time and
the live router every FLIP_CHECK_S of wall-clock time, so the same loads give the same flips:

- load: an instance's pending tokens (the JSQ queue length), sampled every FLIP_CHECK_S (§3.2:
  "e.g., every 100 ms"); an instance is idle from the first sample that sees it at 0.
- when (§5.1: "once it becomes idle for a minute"): idle for `RoutingConfig.flip_idle_s`, and
  (ASSUMED: the paper names no target) every instance of the other role has load, its own role
  keeps an instance that is not flipping, and no other flips at the same time (the one idle
  longest first, then the lowest id).
- drain first (§3.5, Figure 10): once selected it leaves its pool (nothing more is routed to it)
  and flips when it holds nothing, no request and no KV; the flip itself takes no time (ASSUMED;
  the paper: 5 to 7 ms). Live, the router also waits for the worker's own report of holding
  nothing (serve/cluster_state.py `watch`).
- after: its `home` is its new role, where it may flip back only after another `flip_idle_s`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .cluster import Flip, RoutingConfig
from .pools import SplitwiseScheduler
from .state import Machine, Pool

FLIP_CHECK_S = 0.1          # the cluster monitor's sampling period (§3.2: "e.g., every 100 ms")
OTHER = {Pool.PROMPT: Pool.TOKEN, Pool.TOKEN: Pool.PROMPT}


def drained(m: Machine) -> bool:
    """`m` holds nothing: no request queued, prefilling, ready, decoding or waiting, no KV."""
    return (m.pending == 0 and m.kv_used == 0 and not m.prompt_queue and not m.running and not m.ready
            and not m.admit_queue)


class InstanceFlipScheduler(SplitwiseScheduler):
    """Splitwise's routing, no mixed pool, TetriInfer's decode dispatch, and instance flips."""

    def __init__(self, machines: list[Machine], cfg: RoutingConfig = RoutingConfig()) -> None:
        super().__init__(machines, dataclasses.replace(cfg, mixed_pool=False, decode_dispatch="tetriinfer"))
        self.watch_interval = FLIP_CHECK_S
        self.idle_since: dict[int, float] = {}       # machine id -> first sample that saw it idle
        self.draining: list[Machine] = []            # selected, out of their pool, not yet flipped
        self.selected_at: dict[int, float] = {}
        self.flip_log: list[Flip] = []
        self.flips = self.flip_log   # the base's Sequence; compiled (mypyc) an attribute keeps its type

    def watch(self, now: float, quiet: Callable[[Machine], bool] | None = None) -> list[Machine]:
        """One sample of the cluster monitor at time `now`: the machines that flipped. `quiet`
        (live only): whether the worker itself reports holding nothing."""
        flipped = []
        for m in list(self.draining):
            if drained(m) and (quiet is None or quiet(m)):
                self._flip(m, now)
                flipped.append(m)
        idle = self.idle_since
        for pool in (Pool.PROMPT, Pool.TOKEN):
            for m in self.pools[pool]:
                if m.pending == 0:
                    if m.id not in idle:
                        idle[m.id] = now
                elif m.id in idle:
                    del idle[m.id]
        if not self.draining and not flipped:
            c = self._candidate(now)
            if c is not None:
                self.pools[c.pool].remove(c)
                self.draining.append(c)
                self.selected_at[c.id] = now
                if drained(c) and (quiet is None or quiet(c)):
                    self._flip(c, now)
                    flipped.append(c)
        return flipped

    def _candidate(self, now: float) -> Machine | None:
        idle, limit = self.idle_since, self.cfg.flip_idle_s
        for pool in (Pool.PROMPT, Pool.TOKEN):
            mine, theirs = self.pools[pool], self.pools[OTHER[pool]]
            if len(mine) < 2 or any(t.id in idle for t in theirs):
                continue
            ready = [m for m in mine if m.id in idle and now - idle[m.id] >= limit]
            if ready:
                return min(ready, key=lambda m: (idle[m.id], m.id))
        return None

    def _flip(self, m: Machine, now: float) -> None:
        self.draining.remove(m)
        to = OTHER[m.pool]
        m.pool = m.home = to
        self.pools[to].append(m)
        self.idle_since[m.id] = now
        self.flip_log.append(Flip(now, m.id, to, self.selected_at.pop(m.id)))

    def remove(self, m: Machine) -> None:
        super().remove(m)
        if m in self.draining:
            self.draining.remove(m)
            self.selected_at.pop(m.id, None)
        self.idle_since.pop(m.id, None)

    def settle(self, m: Machine) -> None:
        pass                                          # no mixed pool: nothing is ever lent

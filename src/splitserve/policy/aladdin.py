"""Aladdin's cluster scheduler (Nie et al., 2024): joint request placement and worker scaling for
SLOs (`--cluster-scheduler aladdin`, `--policy aladdin`).

Placement (§4.2, Algorithm 1). Each request has a predicted output length `pred`
(policy/predictor.py; the midpoint of the predicted range). The workers taking new requests
(ACTIVE), sorted by capacity_norm (the L2 norm of batch size and weighted context
sum(l_in + GAMMA * pred) of the requests placed on them), largest first, take it at the first one
where, with it added:
  (b) ATGT: decode_time(b, sum(l_in + GAMMA * pred) / theta) <= T_dec (Eq. 3 and 4; theta, the
      slack for prediction error, is `--aladdin-theta`, 0.9 by default: ASSUMED);
  (c) TTFT: prefill_time(prompt tokens not yet prefilled there + l_in) <= T_pre (Eq. 2);
  (d) colocated only: the prefill of its prompt stalls the worker's decodes, so it may take at
      most theta of each running decode's time saved against the ATGT, T_dec * generated -
      (now - its first token); without it, packing to the ATGT limit misses the ATGT;
  (e) KV: the worker's predicted KV demand (each placed request growing to prompt + pred, then
      freed) never passes its capacity.
That is best fit. When none fits, a new bin opens (§4.2): a draining worker comes back, else one
that is off; when every worker is active, the least loaded takes it (ASSUMED: the paper's cluster
always has a new bin) and its KV admission makes it wait. Split designs (§5.1) place the prompt
side by (c) over the prompt pool and the token side by (b) and (e) over the token pool.

The parts (each owns its state): `Slos` (policy/aladdin_slos.py: T_pre, T_dec per worker, and
the latency model), `Corrections` (policy/aladdin_corrections.py: the predictions, the demand
placed on each worker, and their corrections) and `Scaling` (policy/aladdin_scaling.py: the
workers' states and Eq. 7); the scheduler owns the pools and places.
"""

from __future__ import annotations

from typing import Callable

from .aladdin_corrections import Corrections
from .aladdin_scaling import HEARTBEAT_S, Scaling, prompt_load, prompt_rank
from .aladdin_slos import Slos
from .cluster import ClusterScheduler, RoutingConfig
from .latency import GAMMA, LIVE_FIT, BatchLatency
from .predictor import make_predictor
from .state import Machine, Pool, Request

Rank = Callable[[Machine], tuple[float, int]]


class AladdinScheduler(ClusterScheduler):
    """The pools and the placement; its parts: `slos`, `demand` (Corrections), `scaling`."""

    def __init__(self, machines: list[Machine], cfg: RoutingConfig, split: bool, latency: BatchLatency = LIVE_FIT) -> None:
        if split and (not any(m.home is Pool.PROMPT for m in machines)
                      or not any(m.home is Pool.TOKEN for m in machines)):
            raise ValueError("split Aladdin needs prompt and token machines")
        self.split = split
        self.theta = cfg.aladdin_theta
        self.watch_interval = HEARTBEAT_S if cfg.scale_window > 0 else 0.0
        self.pools: dict[Pool, list[Machine]] = {Pool.PROMPT: [], Pool.TOKEN: [], Pool.MIXED: []}
        self.by_id: dict[int, Machine] = {}
        self.slos = Slos(cfg, latency)
        self.demand = Corrections(make_predictor(cfg.predictor))
        self.scaling = Scaling(self.pools, self.by_id, self.demand, self.slos, cfg, split)
        for m in machines:
            self.add(m)

    # ---- membership and the hooks the parts answer -------------------------------------------
    def bind_latency(self, latency: BatchLatency) -> None:
        """The simulator's latency model (its machines' perf models), in place of LIVE_FIT."""
        self.slos.bind(latency)

    def add(self, m: Machine) -> None:
        if not self.split:
            m.pool = m.home = Pool.MIXED
        self.pools[m.pool].append(m)
        self.by_id[m.id] = m
        self.demand.add(m.id)
        self.slos.forget(m.id)
        self.scaling.add(m)

    def remove(self, m: Machine) -> None:
        if m in self.pools[m.pool]:
            self.pools[m.pool].remove(m)
        self.demand.remove(m.id)

    def settle(self, m: Machine) -> None:
        """After `m`'s step: its demand as it now is (policy/aladdin_corrections.py); a draining
        worker left idle goes off."""
        self.demand.settle(m, self.scaling.accepting(m))
        self.scaling.off_if_idle(m)

    def watch(self, now: float, quiet: Callable[[Machine], bool] | None = None) -> list[Machine]:
        """The heartbeat (policy/aladdin_scaling.py). Returns no machine (Aladdin moves no worker
        between roles)."""
        self.scaling.watch(now)
        return []

    def accepting(self, m: Machine) -> bool:
        return self.scaling.accepting(m)

    def activity(self, end: float) -> dict[str, object] | None:
        return self.scaling.activity(end)

    # ---- placement ---------------------------------------------------------------------------
    def fits(self, m: Machine, r: Request, pred: int) -> bool:
        """Whether `m` meets (b), (c) and (d) (unsplit) and (e) with `r` placed on it. Its load is
        as of its last settle (nothing ends between two, but a request that left early, live, from
        a worker with nothing queued or running: counted again now)."""
        self.demand.refresh(m)
        t_pre, t_dec = self.slos.of(m)
        lat = self.slos.lat
        if not self.split:
            stall = lat.prefill_time(m, prompt_load(m) + r.prompt_tokens)
            if stall > t_pre:
                return False
        n, ctx, _ = self.demand.load[m.id]
        if lat.decode_time(m, n + 1, int((ctx + r.prompt_tokens + GAMMA * pred) / self.theta)) > t_dec:
            return False
        if not self.split:              # (d): the decodes' time saved against the ATGT covers the stall
            now = self.scaling.now
            for q in m.running:   # a decode with no first-token time (clockless) is not counted
                if q.first_token_at >= 0 and stall > self.theta * (t_dec * q.generated - (now - q.first_token_at)):
                    return False
        return self.demand.kv_fits(m, r, pred)

    def _best_fit(self, pool: Pool, ok: Callable[[Machine], bool], rank: Rank) -> Machine:
        """The first active worker of `pool`, largest `rank` first, that is `ok`; else a new bin;
        else (every worker active) the least loaded."""
        active = sorted(self.scaling.active(pool), key=rank, reverse=True)
        for m in active:
            if ok(m):
                return m
        opened = self.scaling.open_bin(pool)
        if opened is not None:
            return opened
        return min(active or self.pools[pool], key=rank)

    def pick_prompt(self, r: Request) -> Machine:
        """The prompt machine: unsplit, where it decodes; split, best fit by (c) over the prompt pool."""
        if not self.split:
            return self.by_id[r.token_machine]
        lat, slos = self.slos.lat, self.slos
        return self._best_fit(Pool.PROMPT, lambda m: lat.prefill_time(m, prompt_load(m) + r.prompt_tokens)
                              <= slos.of(m)[0], prompt_rank)

    def route(self, r: Request) -> tuple[Machine, Machine]:
        pred = self.demand.predicted(r)
        self.scaling.observe(r, pred)
        t = self._best_fit(Pool.TOKEN if self.split else Pool.MIXED, lambda m: self.fits(m, r, pred),
                           self.demand.rank)
        self.demand.place(t.id, r, pred)
        if not self.split:
            return t, t
        r.token_machine = t.id
        return self.pick_prompt(r), t

"""Aladdin's cluster scheduler (Nie et al., 2024; seed 002 paper 2): joint request placement and
worker scaling for SLOs (`--cluster-scheduler aladdin`, `--policy aladdin`).

Placement (§4.2, Algorithm 1). Each arriving request has a predicted output length `pred`
(policy/predictor.py; the midpoint of the predicted range). The workers taking new requests
(ACTIVE) are sorted by capacity_norm, the L2 norm of (batch size, weighted context
sum(l_in + GAMMA * pred)) of the requests placed on them and not finished, largest first; the
request goes to the first one where, with it added:
  (b) ATGT: decode_time(b, sum(l_in + GAMMA * pred) / theta) <= T_dec (Eq. 3 and 4: a batch of b
      whose weighted context is within theta of the limit l_d(b); theta the paper's knob for
      prediction error, `--aladdin-theta`: 0.9 by default, ASSUMED: 0 < theta < 1 in the paper);
  (c) TTFT: prefill_time(prompt tokens not yet prefilled there + l_in) <= T_pre (Eq. 2);
  (e) KV: the worker's predicted KV demand, every placed request growing one token per iteration
      from prompt + generated to prompt + pred and then freeing it (the paper's w vectors), never
      passes its KV capacity at any future iteration.
  (d) colocated only: the prefill of its prompt tokens not yet prefilled stalls the worker's
      decodes, so it may take at most theta of each running decode's time saved against the ATGT,
      T_dec * generated - (now - its first token) (the paper's literal form; a decode with no
      first-token time, as in clockless tests, is not counted). The simulator keeps token times;
      the live router sets the first token's time when it reaches it.
That is best fit: the most loaded worker that still meets every constraint. When none does, a new
bin opens (§4.2 "open a new bin"): a draining worker comes back, else one that is off (lowest id).
When every worker is already active and none fits: the least loaded one (ASSUMED; the paper's
cluster always has a new bin), where the machine's own admission makes it wait for KV memory.
Without (d) packing to the ATGT limit misses it: on 8 llama2-13b workers at 6 req/s of sharegpt,
25% of requests met both SLOs with vLLM's prefill-first iterations and 90% with mixed ones; with
(d), 100% (max ATGT 41.5 ms for an SLO of 41.6 ms). With split designs (§5.1, Figure 5) the
prompt side is placed by (c) over the prompt pool and the token side by (b) and (e) over the
token pool, each best fit with the same fallback.

SLOs (Table 2 and §6.1): T_pre the prefill time of the model's context (TTFT_CONTEXT tokens),
T_dec 1.3 times a lone request's decode step at that context, unless `aladdin_ttft_slo` /
`aladdin_atgt_slo` give them (seconds). The latency model comes through `BatchLatency`
(policy/latency.py): the simulator's is the machines' perf models, the live router's `LIVE_FIT`.
Corrections of predicted lengths are in policy/aladdin_corrections.py, scaling in
policy/aladdin_scaling.py.
"""

from __future__ import annotations

import math
from collections import deque

from .aladdin_corrections import Corrections, steps
from .aladdin_scaling import ACTIVE, HEARTBEAT_S, Scaling
from .cluster import ClusterScheduler, RoutingConfig
from .latency import ATGT_FACTOR, GAMMA, LIVE_FIT, TTFT_CONTEXT, BatchLatency
from .predictor import make_predictor
from .state import Machine, Phase, Pool, Request

def kv_peak(items: list[tuple[int, int]]) -> int:
    """The highest KV demand of requests (now holding `cur` tokens, `rem` more iterations each),
    each growing one token per iteration and freeing all at its end: max over k of
    sum over rem >= k of (cur + k); the maximum is at k = 0 or at some request's last iteration."""
    if not items:
        return 0
    items.sort()
    n = len(items)
    peak = suffix = 0
    for i in range(n - 1, -1, -1):
        rem, cur = items[i]
        suffix += cur
        if i == 0 or items[i - 1][0] != rem:
            v = suffix + (n - i) * rem
            if v > peak:
                peak = v
    return peak


class AladdinScheduler(Corrections, Scaling, ClusterScheduler):
    def __init__(self, machines: list[Machine], cfg: RoutingConfig, split: bool, latency: BatchLatency = LIVE_FIT) -> None:
        self.cfg = cfg
        self.split = split
        self.lat = latency
        self.predictor = make_predictor(cfg.predictor)
        self.borrowed = 0
        self.window = cfg.scale_window
        self.theta = cfg.aladdin_theta
        self.watch_interval = HEARTBEAT_S if cfg.scale_window > 0 else 0.0
        self.pools: dict[Pool, list[Machine]] = {Pool.PROMPT: [], Pool.TOKEN: [], Pool.MIXED: []}
        self.by_id: dict[int, Machine] = {}
        self.state: dict[int, int] = {}
        self.placed: dict[int, list[Request]] = {}
        self.load: dict[int, tuple[int, float, int]] = {}   # (requests, sum(l_in + GAMMA pred),
                                                       # sum(l_in + pred)) of those placed there
        self.countdown: dict[int, int] = {}            # settles before a placed request may end or
                                                       # outlive its prediction (no scan before)
        self.nrun: dict[int, int] = {}                 # its running decodes at the last settle
        self.pred: dict[int, int] = {}
        self.slo: dict[int, tuple[float, float]] = {}
        self.on_since: dict[int, float] = {}
        self.on_s: dict[int, float] = {}
        self.now = 0.0
        self.started = -1.0                            # first arrival
        self.arrivals: deque[tuple[float, int, int]] = deque()   # (time, prompt, predicted output)
        self.sum_in = self.sum_out = 0
        self.hist: list[int] = []                      # finished output lengths, sorted
        self.hist_order: deque[int] = deque()
        self.scale_ups = self.scale_downs = self.opened = self.corrections = 0
        if split and (not any(m.home is Pool.PROMPT for m in machines)
                      or not any(m.home is Pool.TOKEN for m in machines)):
            raise ValueError("split Aladdin needs prompt and token machines")
        for m in machines:
            self.add(m)

    # ---- membership --------------------------------------------------------------------------
    def bind_latency(self, latency: BatchLatency) -> None:
        """The simulator's latency model (its machines' perf models), in place of LIVE_FIT."""
        self.lat = latency
        self.slo.clear()

    def add(self, m: Machine) -> None:
        if not self.split:
            m.pool = m.home = Pool.MIXED
        self.pools[m.pool].append(m)
        self.by_id[m.id] = m
        self.state[m.id] = ACTIVE
        self.placed[m.id] = []
        self.load[m.id] = (0, 0.0, 0)
        self.countdown[m.id] = self.nrun[m.id] = 0
        self.slo.pop(m.id, None)
        self.on_since.setdefault(m.id, self.now)
        self.on_s.setdefault(m.id, 0.0)

    def remove(self, m: Machine) -> None:
        if m in self.pools[m.pool]:
            self.pools[m.pool].remove(m)
        for r in self.placed.get(m.id, ()):
            self.pred.pop(r.id, None)
        self.placed[m.id] = []
        self.load[m.id] = (0, 0.0, 0)

    # ---- SLOs and load -----------------------------------------------------------------------
    def slos(self, m: Machine) -> tuple[float, float]:
        """(T_pre, T_dec) of `m`, seconds."""
        s = self.slo.get(m.id)
        if s is None:
            s = self.slo[m.id] = (self.cfg.aladdin_ttft_slo or self.lat.prefill_time(m, TTFT_CONTEXT),
                                  self.cfg.aladdin_atgt_slo
                                  or ATGT_FACTOR * self.lat.decode_time(m, 1, TTFT_CONTEXT))
        return s

    def norm(self, m: Machine) -> float:
        n, ctx, _ = self.load[m.id]
        return math.hypot(n, ctx)

    def _prompt_load(self, m: Machine) -> int:
        return m.queued_prompt_tokens + m.running_prompt_tokens

    def predicted(self, r: Request) -> int:
        p = self.pred.get(r.id)
        if p is None:
            lo, hi = self.predictor.predict(r.id, r.prompt_tokens, r.output_tokens)
            p = self.pred[r.id] = max(1, (lo + hi) // 2)
        return p

    # ---- placement ---------------------------------------------------------------------------
    def fits(self, m: Machine, r: Request, pred: int) -> bool:
        """Whether `m` meets (b), (c) (unsplit) and (e) with `r` placed on it. Its load is as of its
        last settle (nothing ends between two, but a request that left early, live, from a worker
        with nothing queued or running: counted again now)."""
        mid = m.id
        if self.placed[mid] and not (m.running or m.ready or m.prompt_queue):
            self._scan(m)
        t_pre, t_dec = self.slos(m)
        lat = self.lat
        if not self.split:
            stall = lat.prefill_time(m, self._prompt_load(m) + r.prompt_tokens)
            if stall > t_pre:
                return False
        n, ctx, fin = self.load[mid]
        if lat.decode_time(m, n + 1, int((ctx + r.prompt_tokens + GAMMA * pred) / self.theta)) > t_dec:
            return False
        if not self.split:              # (d): the decodes' time saved against the ATGT covers the stall
            now = self.now
            for q in m.running:
                if q.first_token_at >= 0 and stall > self.theta * (t_dec * q.generated - (now - q.first_token_at)):
                    return False
        if fin + r.prompt_tokens + pred <= m.kv_capacity:   # every one at its end at once: fits
            return True
        items = [(pred, r.prompt_tokens)]
        preds = self.pred
        for q in self.placed[mid]:
            if q.phase is not Phase.DONE:
                items.append((max(preds[q.id] - q.generated, 0), q.prompt_tokens + q.generated))
        return kv_peak(items) <= m.kv_capacity

    def _best_fit(self, pool: Pool, ok) -> Machine:
        ms = self.pools[pool]
        state = self.state
        active = sorted((m for m in ms if state[m.id] == ACTIVE), key=self._rank, reverse=True)
        for m in active:
            if ok(m):
                return m
        m = self._open(pool)
        if m is not None:
            self.opened += 1
            return m
        return min(active or ms, key=self._rank)

    def _rank(self, m: Machine) -> tuple[float, int]:
        return self.norm(m), -m.id            # ties: the lower id first (largest first)

    def _prompt_rank(self, m: Machine) -> tuple[int, int]:
        return self._prompt_load(m), -m.id

    def pick_prompt(self, r: Request) -> Machine:
        """The prompt machine: unsplit, where it decodes; split, best fit by (c) over the prompt pool."""
        if not self.split:
            return self.by_id[r.token_machine]
        ms = self.pools[Pool.PROMPT]
        state = self.state
        active = sorted((m for m in ms if state[m.id] == ACTIVE), key=self._prompt_rank, reverse=True)
        for m in active:
            if self.lat.prefill_time(m, self._prompt_load(m) + r.prompt_tokens) <= self.slos(m)[0]:
                return m
        m = self._open(Pool.PROMPT)
        if m is not None:
            self.opened += 1
            return m
        return min(active or ms, key=self._prompt_rank)

    def route(self, r: Request) -> tuple[Machine, Machine]:
        self._observe(r)
        pred = self.predicted(r)
        t = self._best_fit(Pool.TOKEN if self.split else Pool.MIXED, lambda m: self.fits(m, r, pred))
        self.placed[t.id].append(r)
        self.countdown[t.id] = min(self.countdown[t.id], steps(r, pred))
        n, ctx, fin = self.load[t.id]
        self.load[t.id] = (n + 1, ctx + r.prompt_tokens + GAMMA * pred, fin + r.prompt_tokens + pred)
        if not self.split:
            return t, t
        r.token_machine = t.id
        return self.pick_prompt(r), t

"""Aladdin's cluster scheduler (Nie et al., 2024; seed 002 paper 2): joint request placement and
worker scaling for SLOs (`--cluster-scheduler aladdin`, `--policy aladdin`).

Placement (§4.2, Algorithm 1). Each arriving request has a predicted output length `pred`
(policy/predictor.py; the midpoint of the predicted range). The workers taking new requests
(ACTIVE) are sorted by capacity_norm, the L2 norm of (batch size, weighted context
sum(l_in + GAMMA * pred)) of the requests placed on them and not finished, largest first; the
request goes to the first one where, with it added:
  (b) ATGT: decode_time(b, sum(l_in + GAMMA * pred) / theta) <= T_dec (Eq. 3 and 4: a batch of b
      whose weighted context is within theta of the limit l_d(b); theta the paper's knob for
      prediction error, `--aladdin-theta`, THETA by default);
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

Corrections (§4.3, Algorithm 2). When a worker's settle finds a request that has generated its
predicted length and goes on (underestimated), its length is predicted again: the mean of the last
HISTORY finished outputs longer than what it has generated (the paper's conditional average, not
conditioned on the input length: ASSUMED), or twice what it has generated with fewer than
MIN_HISTORY such outputs (ASSUMED). A request that ends early (overestimated) leaves its worker's
demand at once. splitserve dispatches a request to its worker at arrival, so nothing placed can
move without restarting it (and Aladdin itself never migrates, §5.3): the corrected demand steers
the placements that follow, which is Algorithm 2's effect (new requests go to the workers whose
estimated load is lower) without its re-assignment of requests placed in the same heartbeat.

Scaling (§5.2, Eq. 7). Every HEARTBEAT_S (the `watch` call), from the arrival rate over the last
`scale_window` seconds and the mean prompt and predicted output lengths of those arrivals, the
fewest workers that meet the SLOs: N = ceil(rate * (mean_out * t_iter(B) / B + t_pre(mean_in))),
B the largest batch meeting (b) with mean requests and holding their mean KV (l_in + pred / 2),
t_iter(B) its iteration time (Little's law: a worker holds B requests, each mean_out iterations;
its prefills take t_pre of its time). The paper fits k5 and c5 of Eq. 7 to runs of Algorithm 1;
here they come from the same latency model (ASSUMED). With split designs: token workers by the
decode term, prompt workers ceil(rate * t_pre(mean_in) / theta). Workers beyond N stop receiving
new requests (DRAINING, the least loaded first), finish what they hold, then are OFF; they come
back (draining ones first) when N grows or a request fits nowhere. `activity` reports the seconds
each worker was on (ACTIVE, or DRAINING with work), to the heartbeat.

SLOs (Table 2 and §6.1): T_pre the prefill time of the model's context (TTFT_CONTEXT tokens),
T_dec 1.3 times a lone request's decode step at that context, unless `aladdin_ttft_slo` /
`aladdin_atgt_slo` give them (seconds). The latency model comes through `BatchLatency`: the
simulator's is the machines' perf models (`PerfLatency`), the live router's `LIVE_FIT`.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .predictor import make_predictor
from .state import Machine, Phase, Pool, Request

GAMMA = 0.5            # §4.2: "we normally set gamma = 0.5" (context at the middle of a request's life)
THETA = 0.9            # ASSUMED default of --aladdin-theta: 0 < theta < 1 in the paper, value not given
TTFT_CONTEXT = 4096    # §6.1: the prefill SLO is the latency of the model's context length, 4096
ATGT_FACTOR = 1.3      # §6.1: batched decoding at most 1.3 times a lone request's
HEARTBEAT_S = 1.0      # ASSUMED: the paper's "cluster heartbeat" has no stated period
HISTORY = 1000         # ASSUMED: finished outputs kept for re-prediction
MIN_HISTORY = 10       # ASSUMED: fewer longer outputs than this: double instead
MAX_BATCH = 1 << 14    # search bound of the scaling model's batch

ACTIVE, DRAINING, OFF = 0, 1, 2


class BatchLatency(Protocol):
    """Batched latency of one worker (§3.2), in seconds."""

    def prefill_time(self, m: Machine, tokens: int) -> float:
        """A prefill batch of `tokens` prompt tokens in total on `m` (Eq. 2)."""

    def decode_time(self, m: Machine, batch: int, context: int) -> float:
        """A decode iteration of `batch` requests holding `context` KV tokens in total (Eq. 3)."""


@dataclass(frozen=True, slots=True)
class LinearLatency:
    """Eq. 2 and Eq. 3: t_pre = k1 * tokens + c1; t_d = (k2 * l_ave + c2) * b + c3 =
    k2 * context + c2 * b + c3."""

    k1: float
    c1: float
    k2: float
    c2: float
    c3: float

    def prefill_time(self, m: Machine, tokens: int) -> float:
        return self.k1 * tokens + self.c1

    def decode_time(self, m: Machine, batch: int, context: int) -> float:
        return self.k2 * context + self.c2 * batch + self.c3


# The live router's fit: least squares of Eq. 2 and Eq. 3 to the tiny model's engine steps on the
# dev VM (CPU, float32, one thread; `python scripts/aladdin_live_fit.py`): prefills of 16..480
# tokens, decodes of 1..32 requests at 16..480 prompt tokens each. The VM's two cores are shared,
# so its steps are noisy: the fit's largest relative errors were 70% (prefill) and 30% (decode).
LIVE_FIT = LinearLatency(k1=6.81e-06, c1=0.000452, k2=3.29e-08, c2=7.61e-06, c3=0.000428)


class PerfLatency:
    """The simulator's latency model: each machine's perf model (perf/), the one that times its
    batches."""

    __slots__ = ("perfs",)

    def __init__(self, perfs: Sequence) -> None:
        self.perfs = perfs

    def prefill_time(self, m: Machine, tokens: int) -> float:
        return self.perfs[m.id].prompt_time(tokens)

    def decode_time(self, m: Machine, batch: int, context: int) -> float:
        return self.perfs[m.id].token_time(batch, context)


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


class AladdinScheduler:
    def __init__(self, machines: list[Machine], cfg, split: bool, latency: BatchLatency = LIVE_FIT) -> None:
        self.cfg = cfg
        self.split = split
        self.lat = latency
        self.predictor = make_predictor(cfg.predictor)
        self.borrowed = 0
        self.window = cfg.scale_window
        self.theta = cfg.aladdin_theta                 # THETA unless --aladdin-theta
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
        self.countdown[t.id] = min(self.countdown[t.id], _steps(r, pred))
        n, ctx, fin = self.load[t.id]
        self.load[t.id] = (n + 1, ctx + r.prompt_tokens + GAMMA * pred, fin + r.prompt_tokens + pred)
        if not self.split:
            return t, t
        r.token_machine = t.id
        return self.pick_prompt(r), t

    # ---- corrections -------------------------------------------------------------------------
    def settle(self, m: Machine) -> None:
        """After `m`'s step: finished requests leave its demand (their lengths join the history);
        one that has generated its predicted length and goes on is predicted again. A step gives
        each request at most one token, so the scan waits until one may have ended or reached its
        prediction (the countdown), or a running decode left (ended early, live)."""
        mid = m.id
        placed = self.placed.get(mid)
        if not placed:                  # a prompt machine of a split design, or an empty one
            if self.state.get(mid) == DRAINING and _idle(m):
                self._off(m)
            return
        c = self.countdown[mid] - 1
        n = len(m.running)
        if c > 0 and n >= self.nrun[mid] and self.state[mid] == ACTIVE:
            self.countdown[mid] = c
            self.nrun[mid] = n
            return
        self._scan(m)
        if self.state.get(mid) == DRAINING and _idle(m):
            self._off(m)

    def _scan(self, m: Machine) -> None:
        mid = m.id
        keep = []
        ctx = 0.0
        fin = 0
        due = 1 << 30
        preds = self.pred
        for q in self.placed[mid]:
            if q.phase is Phase.DONE:
                self._finished(q)
                continue
            p = preds[q.id]
            if q.generated >= p:
                p = preds[q.id] = self.repredict(q.generated)
                self.corrections += 1
            keep.append(q)
            ctx += q.prompt_tokens + GAMMA * p
            fin += q.prompt_tokens + p
            s = _steps(q, p)
            if s < due:
                due = s
        self.placed[mid] = keep
        self.load[mid] = (len(keep), ctx, fin)
        self.countdown[mid] = due
        self.nrun[mid] = len(m.running)

    def repredict(self, generated: int) -> int:
        """A new predicted length for a request that has generated `generated` tokens and goes on."""
        h = self.hist
        i = bisect.bisect_right(h, generated)
        if len(h) - i >= MIN_HISTORY:
            return max(generated + 1, -(-sum(h[i:]) // (len(h) - i)))
        return 2 * generated

    def _finished(self, q: Request) -> None:
        self.pred.pop(q.id, None)
        if q.generated > 0:
            bisect.insort(self.hist, q.generated)
            self.hist_order.append(q.generated)
            if len(self.hist_order) > HISTORY:
                old = self.hist_order.popleft()
                del self.hist[bisect.bisect_left(self.hist, old)]

    # ---- scaling -----------------------------------------------------------------------------
    def _observe(self, r: Request) -> None:
        now = r.arrival
        if now > self.now:
            self.now = now
        if self.started < 0:
            self.started = now
            for mid in self.on_since:
                self.on_since[mid] = now
        if self.window > 0:
            pred = self.predicted(r)
            self.arrivals.append((now, r.prompt_tokens, pred))
            self.sum_in += r.prompt_tokens
            self.sum_out += pred

    def estimate(self, now: float) -> tuple[float, float, float] | None:
        """(rate, mean prompt, mean predicted output) of the arrivals in the last window; None
        before a heartbeat of arrivals."""
        a = self.arrivals
        while a and a[0][0] <= now - self.window:
            _, i, o = a.popleft()
            self.sum_in -= i
            self.sum_out -= o
        if self.started < 0 or now - self.started < HEARTBEAT_S:
            return None
        if not a:
            return 0.0, 0.0, 0.0
        return len(a) / min(self.window, now - self.started), self.sum_in / len(a), self.sum_out / len(a)

    def batch_limit(self, m: Machine, mean_in: float, mean_out: float) -> int:
        """B: the largest batch of mean requests meeting (b) and holding their mean KV on `m`."""
        t_dec = self.slos(m)[1]
        c = mean_in + GAMMA * mean_out
        kv = mean_in + mean_out / 2
        lo, hi = 1, MAX_BATCH
        while lo < hi:
            b = (lo + hi + 1) // 2
            if self.lat.decode_time(m, b, int(b * c / self.theta)) <= t_dec and b * kv <= m.kv_capacity:
                lo = b
            else:
                hi = b - 1
        return lo

    def workers_needed(self, rate: float, mean_in: float, mean_out: float) -> dict[Pool, int]:
        """Eq. 7 from the latency model: the fewest workers of each pool for `rate`."""
        dec = self.pools[Pool.TOKEN if self.split else Pool.MIXED]
        if not dec or rate <= 0:
            return {Pool.TOKEN if self.split else Pool.MIXED: 1} | ({Pool.PROMPT: 1} if self.split else {})
        m = dec[0]
        b = self.batch_limit(m, mean_in, mean_out)
        per_req = mean_out * self.lat.decode_time(m, b, int(b * (mean_in + GAMMA * mean_out))) / b
        if not self.split:
            per_req += self.lat.prefill_time(m, int(mean_in))
            return {Pool.MIXED: max(1, math.ceil(rate * per_req))}
        p = self.pools[Pool.PROMPT][0] if self.pools[Pool.PROMPT] else m
        return {Pool.TOKEN: max(1, math.ceil(rate * per_req)),
                Pool.PROMPT: max(1, math.ceil(rate * self.lat.prefill_time(p, int(mean_in)) / self.theta))}

    def watch(self, now: float, quiet=None) -> list[Machine]:
        """The heartbeat: draining workers with nothing left go off; the number of active workers
        follows Eq. 7. Returns no machine (Aladdin moves no worker between roles)."""
        if now > self.now:
            self.now = now
        for mid, s in self.state.items():
            if s == DRAINING and _idle(self.by_id[mid]):
                self._off(self.by_id[mid])
        est = self.estimate(now)
        if est is None:
            return []
        for pool, n in self.workers_needed(*est).items():
            self._resize(pool, n)
        return []

    def _resize(self, pool: Pool, n: int) -> None:
        ms = self.pools[pool]
        active = [m for m in ms if self.state[m.id] == ACTIVE]
        if len(active) > n:
            rank = self._prompt_rank if pool is Pool.PROMPT else self._rank
            for m in sorted(active, key=rank)[:len(active) - n]:
                self.state[m.id] = DRAINING
                self.scale_downs += 1
                if _idle(m):
                    self._off(m)
        else:
            for _ in range(n - len(active)):
                if self._open(pool) is None:
                    break

    def _open(self, pool: Pool) -> Machine | None:
        """A worker of `pool` that takes new requests again: a draining one (still on), else the
        off one of the lowest id."""
        ms = self.pools[pool]
        cands = [m for m in ms if self.state[m.id] == DRAINING] or [m for m in ms if self.state[m.id] == OFF]
        if not cands:
            return None
        m = cands[0]
        if self.state[m.id] == OFF:
            self.on_since[m.id] = self.now
        self.state[m.id] = ACTIVE
        self.scale_ups += 1
        return m

    def _off(self, m: Machine) -> None:
        self.state[m.id] = OFF
        self.on_s[m.id] += self.now - self.on_since[m.id]

    def accepting(self, m: Machine) -> bool:
        """Whether `m` receives new requests (not scaled down)."""
        return self.state.get(m.id) == ACTIVE

    def activity(self, end: float) -> dict:
        """Seconds each worker was on (by machine id) until `end`, and the scaling counts."""
        on = {mid: s + (end - self.on_since[mid] if self.state[mid] != OFF else 0.0)
              for mid, s in self.on_s.items()}
        return {"machine_seconds": on, "scale_ups": self.scale_ups, "scale_downs": self.scale_downs,
                "bins_opened": self.opened, "corrections": self.corrections}


def _steps(q: Request, pred: int) -> int:
    """Steps of its machine before `q` may end or pass `pred` (its first token may come from
    another machine, its prompt machine)."""
    return min(pred, q.output_tokens) - q.generated - (q.generated == 0)


def _idle(m: Machine) -> bool:
    return not (m.prompt_queue or m.running or m.ready or m.admit_queue) and m.kv_used == 0 and m.pending == 0

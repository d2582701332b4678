"""Aladdin's worker scaling (policy/aladdin.py).

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
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from .aladdin_corrections import Corrections
from .aladdin_slos import Slos
from .cluster import RoutingConfig
from .latency import GAMMA
from .state import Machine, Pool, Request

HEARTBEAT_S = 1.0      # ASSUMED: the paper's "cluster heartbeat" has no stated period
MAX_BATCH = 1 << 14    # search bound of the scaling model's batch

ACTIVE, DRAINING, OFF = 0, 1, 2      # a worker takes new requests / finishes what it holds / is off


class Scaling:
    """The workers' states (`state`, by machine id), the clock (`now`: the last arrival or
    heartbeat), the window of arrivals Eq. 7 reads, and the seconds each worker was on. It reads the
    scheduler's `pools` and `by_id`, the placed demand (`demand`: which active worker is the least
    loaded) and the SLOs (`slos`), and changes none of them."""

    def __init__(self, pools: dict[Pool, list[Machine]], by_id: dict[int, Machine], demand: Corrections,
                 slos: Slos, cfg: RoutingConfig, split: bool) -> None:
        self.pools, self.by_id, self.demand, self.slos = pools, by_id, demand, slos
        self.split = split
        self.window = cfg.scale_window
        self.theta = cfg.aladdin_theta
        self.state: dict[int, int] = {}
        self.on_since: dict[int, float] = {}
        self.on_s: dict[int, float] = {}
        self.now = 0.0
        self.started = -1.0                            # first arrival
        self.arrivals: deque[tuple[float, int, int]] = deque()   # (time, prompt, predicted output)
        self.sum_in = self.sum_out = 0
        self.scale_ups = self.scale_downs = self.opened = 0

    def add(self, m: Machine) -> None:
        """`m` joins, taking new requests."""
        self.state[m.id] = ACTIVE
        self.on_since.setdefault(m.id, self.now)
        self.on_s.setdefault(m.id, 0.0)

    def observe(self, r: Request, pred: int) -> None:
        """`r` arrives, predicted to make `pred` tokens: the clock, and the window's arrivals."""
        now = r.arrival
        if now > self.now:
            self.now = now
        if self.started < 0:
            self.started = now
            for mid in self.on_since:
                self.on_since[mid] = now
        if self.window > 0:
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
        t_dec = self.slos.of(m)[1]
        c = mean_in + GAMMA * mean_out
        kv = mean_in + mean_out / 2
        lo, hi = 1, MAX_BATCH
        while lo < hi:
            b = (lo + hi + 1) // 2
            if self.slos.lat.decode_time(m, b, int(b * c / self.theta)) <= t_dec and b * kv <= m.kv_capacity:
                lo = b
            else:
                hi = b - 1
        return lo

    def workers_needed(self, rate: float, mean_in: float, mean_out: float) -> dict[Pool, int]:
        """Eq. 7 from the latency model: the fewest workers of each pool for `rate`."""
        lat = self.slos.lat
        dec = self.pools[Pool.TOKEN if self.split else Pool.MIXED]
        if not dec or rate <= 0:
            return {Pool.TOKEN if self.split else Pool.MIXED: 1} | ({Pool.PROMPT: 1} if self.split else {})
        m = dec[0]
        b = self.batch_limit(m, mean_in, mean_out)
        per_req = mean_out * lat.decode_time(m, b, int(b * (mean_in + GAMMA * mean_out))) / b
        if not self.split:
            per_req += lat.prefill_time(m, int(mean_in))
            return {Pool.MIXED: max(1, math.ceil(rate * per_req))}
        p = self.pools[Pool.PROMPT][0] if self.pools[Pool.PROMPT] else m
        return {Pool.TOKEN: max(1, math.ceil(rate * per_req)),
                Pool.PROMPT: max(1, math.ceil(rate * lat.prefill_time(p, int(mean_in)) / self.theta))}

    def watch(self, now: float) -> None:
        """The heartbeat: draining workers with nothing left go off; the number of active workers
        follows Eq. 7."""
        if now > self.now:
            self.now = now
        for mid, s in self.state.items():
            if s == DRAINING and idle(self.by_id[mid]):
                self._off(self.by_id[mid])
        est = self.estimate(now)
        if est is None:
            return
        for pool, n in self.workers_needed(*est).items():
            self.resize(pool, n)

    def resize(self, pool: Pool, n: int) -> None:
        """`n` workers of `pool` take new requests: the least loaded beyond them drain (off at once
        when idle), or workers come back (`_open`)."""
        active = self.active(pool)
        if len(active) > n:
            rank: Callable[[Machine], tuple[float, int]] = prompt_rank if pool is Pool.PROMPT else self.demand.rank
            for m in sorted(active, key=rank)[:len(active) - n]:
                self.state[m.id] = DRAINING
                self.scale_downs += 1
                if idle(m):
                    self._off(m)
        else:
            for _ in range(n - len(active)):
                if self._open(pool) is None:
                    break

    def active(self, pool: Pool) -> list[Machine]:
        """The workers of `pool` taking new requests."""
        state = self.state
        return [m for m in self.pools[pool] if state[m.id] == ACTIVE]

    def open_bin(self, pool: Pool) -> Machine | None:
        """A new bin for a request that fits no active worker of `pool` (§4.2): `_open`."""
        m = self._open(pool)
        if m is not None:
            self.opened += 1
        return m

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

    def off_if_idle(self, m: Machine) -> None:
        """A draining `m` that holds nothing any more goes off."""
        if self.state.get(m.id) == DRAINING and idle(m):
            self._off(m)

    def accepting(self, m: Machine) -> bool:
        """Whether `m` receives new requests (not scaled down)."""
        return self.state.get(m.id) == ACTIVE

    def activity(self, end: float) -> dict[str, object]:
        """Seconds each worker was on (by machine id) until `end`, and the scaling counts."""
        on = {mid: s + (end - self.on_since[mid] if self.state[mid] != OFF else 0.0)
              for mid, s in self.on_s.items()}
        return {"machine_seconds": on, "scale_ups": self.scale_ups, "scale_downs": self.scale_downs,
                "bins_opened": self.opened, "corrections": self.demand.corrections}


def prompt_load(m: Machine) -> int:
    """Prompt tokens `m` has not prefilled yet: queued and started."""
    return m.queued_prompt_tokens + m.running_prompt_tokens


def prompt_rank(m: Machine) -> tuple[int, int]:
    """Best fit's order over a prompt pool: prompt load, then the lower id."""
    return prompt_load(m), -m.id


def idle(m: Machine) -> bool:
    return not (m.prompt_queue or m.running or m.ready or m.admit_queue) and m.kv_used == 0 and m.pending == 0

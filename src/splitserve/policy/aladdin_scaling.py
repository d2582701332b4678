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

from .latency import GAMMA
from .state import Machine, Pool, Request

HEARTBEAT_S = 1.0      # ASSUMED: the paper's "cluster heartbeat" has no stated period
MAX_BATCH = 1 << 14    # search bound of the scaling model's batch

ACTIVE, DRAINING, OFF = 0, 1, 2      # a worker takes new requests / finishes what it holds / is off


class Scaling:
    """AladdinScheduler's heartbeat (`watch`), Eq. 7 and the workers' states (its state is the
    scheduler's: policy/aladdin.py)."""

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
            if s == DRAINING and idle(self.by_id[mid]):
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
                if idle(m):
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



def idle(m: Machine) -> bool:
    return not (m.prompt_queue or m.running or m.ready or m.admit_queue) and m.kv_used == 0 and m.pending == 0

"""The policy's view of the live cluster: `policy.state.Machine` objects kept in step with the
real workers, driven by the same policy code the simulator uses (see sim/simulator.py).

The simulator learns of progress from its own events; the server learns it from worker messages.
Each method here is one such message and does what the simulator does at the matching event:

    arrive      route(r) at arrival; reserve_decode on the token machine (or wait in its
                admit queue); enqueue_prompt on the prompt machine        (Simulation._arrive)
    first_token the prompt finished on its prompt machine                  (finish_iteration)
    kv_arrived  the KV landed: release_prompt_kv, join_decode              (Simulation._transfer_end)
    tokens      decode progress on the token machine                       (finish_iteration)
    finish      the last token: free its KV, admit_waiting, pick_prompt for them (Simulation._freed)
    forget      a request leaves early (abort, failure, its worker died): undo what it holds

plus `settle` after each (a mixed-pool machine goes home when it holds no work of the opposite
kind). `down`/`up` take a dead worker out of its pool and put its replacement in. Nothing here
does I/O; the router carries the decisions out.
"""

from __future__ import annotations

from ..policy.cluster import JSQScheduler, RoutingConfig, SplitwiseScheduler
from ..policy.machine import admit_waiting, decode_reservation, enqueue_prompt, join_decode, \
    prefill_reservation, release_prompt_kv, reserve_decode
from ..policy.state import Machine, Phase, Pool, Request


class NoWorkers(RuntimeError):
    """No live worker can take this request now."""


class LiveCluster:
    def __init__(self, homes: list[Pool], kv_tokens: list[int], split: bool,
                 routing: RoutingConfig = RoutingConfig(), kv_block: int = 1) -> None:
        """kv_tokens: each worker's KV cache in tokens; kv_block: tokens per block (reservations
        are whole blocks, as the workers' paged caches allocate them)."""
        self.split = split
        self.homes = list(homes)
        self.kv_tokens = list(kv_tokens)
        self.kv_block = kv_block
        self.machines = [Machine(i, "live", home=h, kv_capacity=c, kv_block=kv_block)
                         for i, (h, c) in enumerate(zip(homes, kv_tokens))]
        self.cls = SplitwiseScheduler(self.machines, routing) if split else JSQScheduler(self.machines)
        self.alive = [True] * len(self.machines)

    # ---- routing ------------------------------------------------------------------------------
    def arrive(self, r: Request) -> bool:
        """Pick r's machines. True: its prompt may start now; False: it waits for KV memory on
        its token machine (it comes back from `finish`/`forget` when admitted)."""
        try:
            p, t = self.cls.route(r)
        except (ValueError, IndexError):
            raise NoWorkers("no live worker of the needed kind") from None
        for m in (p, t):
            if decode_reservation(m, r) > m.kv_capacity:
                raise NoWorkers(f"request needs {r.kv_need} KV tokens; a worker holds {m.kv_capacity}")
        r.prompt_machine, r.token_machine = p.id, t.id
        if p is t or r.output_tokens == 1 or reserve_decode(t, r):
            self._start_prompt(p, r)
            return True
        return False

    def _start_prompt(self, p: Machine, r: Request) -> None:
        enqueue_prompt(p, r)
        p.kv_used += prefill_reservation(p, r)  # the live engine holds it from admission on

    def split_request(self, r: Request) -> bool:
        return r.prompt_machine != r.token_machine

    # ---- progress -----------------------------------------------------------------------------
    def first_token(self, r: Request, finished: bool) -> list[Request]:
        p = self.machines[r.prompt_machine]
        self._leave_prompt_queue(p, r)
        r.generated = 1
        if finished:
            return self._done(r, early=True)
        if r.token_machine == p.id:
            self._decode_on(p, r)
        else:
            r.phase = Phase.HANDOFF
        self._settle(p)
        return []

    def kv_arrived(self, r: Request) -> None:
        p, t = self.machines[r.prompt_machine], self.machines[r.token_machine]
        release_prompt_kv(p, r)
        join_decode(t, r)
        t.ready.remove(r)  # the live worker starts decoding at once (form_batch's join)
        t.inbound_tokens -= r.output_tokens - r.generated
        t.pending -= r.output_tokens - r.generated
        self._decode_on(t, r)
        self._settle(p)

    def _decode_on(self, m: Machine, r: Request) -> None:
        r.phase = Phase.DECODE
        left = r.output_tokens - r.generated
        m.running.append(r)
        m.context_tokens += r.prompt_tokens + r.generated
        m.decode_tokens_left += left
        m.pending += left

    def tokens(self, r: Request, k: int) -> None:
        m = self.machines[r.token_machine]
        k = min(k, r.output_tokens - r.generated)
        r.generated += k
        m.decode_tokens_left -= k
        m.pending -= k
        m.context_tokens += k

    def finish(self, r: Request) -> list[Request]:
        """The last token came out (or a stop). Returns waiters admitted by the freed memory:
        their prompt machines are chosen now and their prompts may start."""
        return self._done(r, early=False)

    def forget(self, r: Request) -> list[Request]:
        """Undo whatever `r` holds (it was aborted, failed, or its worker died)."""
        if r.phase is Phase.DONE:
            return []
        p, t = self.machines[r.prompt_machine], self.machines[r.token_machine]
        if r in t.admit_queue:
            t.admit_queue.remove(r)
            t.queued_decode_tokens -= r.output_tokens - r.generated
            t.pending -= r.output_tokens - r.generated
            r.phase = Phase.DONE
            return []
        if r.phase in (Phase.QUEUED, Phase.PREFILL):
            self._leave_prompt_queue(p, r)
            return self._done(r, early=True)
        if r.phase is Phase.HANDOFF:
            release_prompt_kv(p, r)
            return self._done(r, early=True)
        return self._done(r, early=False)

    def _leave_prompt_queue(self, p: Machine, r: Request) -> None:
        if r in p.prompt_queue:
            p.prompt_queue.remove(r)
            p.queued_prompt_tokens -= r.prefill_len
            p.pending -= r.prefill_len

    def _done(self, r: Request, early: bool) -> list[Request]:
        """Release r's KV wherever it is held. `early`: it never reached its decode batch."""
        p, t = self.machines[r.prompt_machine], self.machines[r.token_machine]
        if early:
            if r.phase in (Phase.QUEUED, Phase.PREFILL):
                p.kv_used -= prefill_reservation(p, r)
            elif r.phase is Phase.HANDOFF:
                pass  # the prompt side was released by the caller
            if t is not p and r.kv_on_token_machine:
                left = r.output_tokens - 1
                t.kv_used -= decode_reservation(t, r)
                t.inbound_tokens -= left
                t.pending -= left
        else:
            left = r.output_tokens - r.generated
            if r in t.running:
                t.running.remove(r)
            t.decode_tokens_left -= left
            t.pending -= left
            t.context_tokens -= r.prompt_tokens + r.generated
            t.kv_used -= decode_reservation(t, r)
        r.phase = Phase.DONE
        admitted = []
        for m in {p, t}:
            if self._live(m):
                admitted += self._admit(m)
                self._settle(m)
        return admitted

    def _live(self, m: Machine) -> bool:
        return self.alive[m.id] and self.machines[m.id] is m

    def _settle(self, m: Machine) -> None:
        if self._live(m):
            self.cls.settle(m)

    def _admit(self, m: Machine) -> list[Request]:
        out = []
        for r in admit_waiting(m):
            try:
                p = self.cls.pick_prompt(r)
            except (ValueError, IndexError):
                p = m
            r.prompt_machine = p.id
            self._start_prompt(p, r)
            out.append(r)
        return out

    # ---- membership ---------------------------------------------------------------------------
    def down(self, i: int) -> list[Request]:
        """Worker i died. Returns requests that waited for memory on it (the caller re-routes
        them); the caller has `forget` every request that ran on it first."""
        m = self.machines[i]
        self.alive[i] = False
        waiting = list(m.admit_queue)
        if isinstance(self.cls, SplitwiseScheduler):
            if m in self.cls.pools[m.pool]:
                self.cls.pools[m.pool].remove(m)
        elif m in self.cls.machines:
            self.cls.machines.remove(m)
        return waiting

    def up(self, i: int, kv_tokens: int | None = None) -> None:
        """A (replacement) worker i joined: a fresh machine in its home pool."""
        if self.alive[i]:
            return
        cap = kv_tokens if kv_tokens is not None else self.kv_tokens[i]
        m = Machine(i, "live", home=self.homes[i], kv_capacity=cap, kv_block=self.kv_block)
        self.machines[i] = m
        self.alive[i] = True
        if isinstance(self.cls, SplitwiseScheduler):
            self.cls.pools[m.pool].append(m)
        else:
            m.pool = m.home = Pool.MIXED
            self.cls.machines.append(m)

    def idle(self) -> bool:
        """Every live machine's counters are back at zero (tests)."""
        return all(m.pending == 0 and m.kv_used == 0 and m.recount_pending() == 0
                   and not (m.prompt_queue or m.running or m.ready or m.admit_queue)
                   for m, a in zip(self.machines, self.alive) if a)

    def snapshot(self) -> list[dict]:
        return [{"id": m.id, "alive": a, "home": m.home.name.lower(), "pool": m.pool.name.lower(),
                 "pending": m.pending, "kv_used": m.kv_used, "kv_capacity": m.kv_capacity,
                 "prompt_queue": len(m.prompt_queue), "admit_queue": len(m.admit_queue),
                 "running": len(m.running)} for m, a in zip(self.machines, self.alive)]

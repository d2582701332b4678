"""The router's view of the live cluster: one policy `Machine` per worker, moved by the workers'
reports through the same transitions the simulator makes (policy/transitions.py), and routed by
the same cluster scheduler (policy/cluster.py). It does no arithmetic of its own. With prefix
caching, each machine's view of its worker's cache follows these events too (serve/prefix_view.py).

    router learns                          view does (transitions)          simulator's moment
    a request arrives                      arrive: predict, route,          Simulation._arrive
                                           reserve_decode or wait,
                                           enqueue_prompt
    a worker's step starts ("step")        start_decode (joined), grow_decode form_batch
                                           (grown), preempt, start_chunk,
                                           requeue_preempted; the scheduler's
                                           own report (ecoserve's sizing)
    that step ends ("out")                 end_chunk; first_token for a     finish_iteration, then
                                           completed prefill; decode_tokens; Simulation._iter_end
                                           settle; admit_freed
    the KV landed ("kv_in")                kv_landed; admit_freed            Simulation._transfer_end
    a request leaves early                 release; admit_freed              (live only)

A worker reports a step when it starts and when it ends, so prompt KV is reserved when the prompt
starts, as in the simulator, and pending tokens move from queued to running then. The first
token of a split request can reach the router through the token worker ("kv_in") before the
prompt worker's step report: `first_from_token_worker` applies the prompt side's transitions
then, and the late report finds nothing left to do. tests/serve/test_cluster_state.py drives the
simulator's path and this one with the same random events and compares the machines after
each. Nothing here does I/O; the router carries the decisions out.

`LiveCluster` owns its parts: `view` (cluster_view.py `ClusterView`: the machines, which are live,
the cluster scheduler; `down`/`up` take a dead worker out of its pool and put its replacement in)
and `prefixes` (cluster_prefixes.py: the prefix caches' bookkeeping); its own methods are the
transitions above.

Under ecoserve a worker's scheduler sizes KV itself and reports how (policy/schedulers/ecoserve/
view.py: `step_started` applies it with the calls ecoserve made). On demand, a step's report names
the decodes that took KV for it (`grown`), and a worker with no room for a reservation after all
makes the request wait here (`wait_for_room`). Queue order may differ from a worker's (ecoserve's
deadlines); this view never takes from its queues, only their members and counters matter.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..policy.cluster import RoutingConfig, admit_freed, arrive, readmit
from ..policy.schedulers import SCHEDULERS
from ..policy.state import Machine, Phase, Pool, Request
from ..policy.release import release, unreserve
from ..policy.sized_kv import drop_waiting, plan_kv
from ..policy.kv_allocation import DoesNotFit
from ..policy.machine import BatchingConfig
from ..policy.preemption import requeue, sent_back
from ..policy.transitions import (decode_tokens, end_chunk, first_token, grow_decode, kv_landed, preempt, start_chunk,
                                  start_decode)
from .cluster_prefixes import ViewPrefixes
from .cluster_view import ClusterView


class NoWorkers(RuntimeError):
    """No live worker can take this request now."""


def _unknown(rid: str) -> Request | None:
    """step_started's `get` where the caller knows no requests: every id is unknown."""
    return None


class LiveCluster:
    """The router's policy view: the transitions the workers' reports drive, over its `view`."""

    def __init__(self, homes: list[Pool], kv_tokens: list[int], split: bool,
                 routing: RoutingConfig = RoutingConfig(), kv_block: int = 1, predictor=None,
                 batching: BatchingConfig = BatchingConfig(), prefix: bool = False) -> None:
        """kv_tokens: each worker's KV cache in tokens; kv_block: tokens per block (KV is held in whole
        blocks, as the workers' paged caches allocate it); predictor: the output-length predictor a
        request's estimate comes from at arrival, as in the simulator (policy/predictor.py
        arrival_predictor; the router sends it in `gen`); batching: the workers' settings (their
        machine scheduler, whose own step reports this view applies; their KV allocation, which
        each machine follows); prefix: whether the workers keep prefix caches, each machine then a
        view of its worker's (serve/prefix_view.py)."""
        self.sched = SCHEDULERS[batching.scheduler]
        self.predictor = predictor
        self.view = ClusterView(homes, kv_tokens, split, routing, kv_block, batching, prefix)
        self.prefixes = ViewPrefixes(self.view)

    # ---- routing ------------------------------------------------------------------------------
    def arrive(self, r: Request, again: bool = False) -> bool:
        """Pick r's machines. True: its prompt is queued; False: it waits for KV memory on its token
        machine (it comes back from an admission when memory is freed). `again`: a decode preempted
        to recompute through the prompt pool (policy/cluster.py readmit), not a new request."""
        try:
            return readmit(self.view.cls, r) if again else arrive(self.view.cls, r, self.predictor)
        except (ValueError, IndexError):
            raise NoWorkers("no live worker of the needed kind") from None
        except DoesNotFit as e:
            raise NoWorkers(str(e)) from None

    # ---- a worker's step ------------------------------------------------------------------------
    def step_started(self, wid: int, chunks: list[tuple[Request, int]], preempted: list[Request],
                     joined: list[Request], report: Any = None, get: Callable[[str], Request | None] = _unknown,
                     grown: Sequence[Request] = ()) -> list[Request]:
        """Worker `wid` formed a step: what form_batch did for it. `report`: its scheduler's own
        report of the step (the `step` message's `sched`; `get`: request id -> this view's request,
        None when it has none), applied by the scheduler in its order (ecoserve: re-hosted guests,
        GTs parked, reservations grown, then the preempted (guests, and waiting GTs "unstuck"), GTs
        resumed, prompts planned as they start); `grown`: on demand, its decodes that took KV for
        it. (A report may name a request this view has released already, on its own: it is
        skipped.) Returns the preempted that recompute through the prompt pool (`--recompute
        prompt-pool`), holding nothing: the caller admits each again (`readmit`)."""
        m = self.view.machines[wid]
        for r in joined:
            if r.phase is Phase.READY and r in m.ready:
                start_decode(m, r)
        for r in grown:
            if r.phase is Phase.DECODE and r.token_machine == wid:
                grow_decode(m, r)
        sized = self.sched.apply_report(m, report, get)
        sized.before()
        victims = [r for r in preempted if r.phase is Phase.DECODE and r in m.running
                   or r.phase is Phase.WAITING and r in m.decode_queue]
        for r in victims:
            if r.phase is Phase.DECODE:
                preempt(m, r)
                sized.preempted(r)
            else:
                drop_waiting(m, r)
        sized.after()
        for r, n in chunks:
            if self.awaiting_first(r) and r.chunk == 0 and r.prompt_machine == wid:
                if sized.planned(r):
                    plan_kv(m, r)
                start_chunk(m, r, n)
                self.view.in_step[wid].append(r)
        requeue(m, victims)
        return sent_back(m, victims)

    def end_step(self, wid: int, outputs: list[tuple[Request, int, bool]]) -> list[Request]:
        """Worker `wid`'s step ran and made `outputs`: (request, tokens, ended by the worker). As
        finish_iteration and the simulator after it: chunks end, completed prefills make their
        first token, decodes theirs; the machine settles; memory freed admits waiters (returned:
        their prompts are queued on the prompt machines chosen now)."""
        m = self.view.machines[wid]
        for r in self.view.in_step[wid]:
            if r.chunk:
                end_chunk(m, r)
        self.view.in_step[wid] = []
        freed: set[Machine] = set()
        for r, k, ended in outputs:
            if self.awaiting_first(r):  # its prefill is complete (its token is here)
                self.complete_prefill(r)
                p = self.view.machines[r.prompt_machine]
                if first_token(p, r):
                    freed.add(p)
                    continue
                k -= 1
            if r.phase is Phase.DECODE and k:
                t = self.view.decoder(r)
                if decode_tokens(t, [r], k):
                    freed.add(t)
                    continue
            if ended and r.phase is not Phase.DONE:
                freed |= self._release(r)
        self._settle(m)
        return self._admit(freed)

    @staticmethod
    def awaiting_first(r: Request) -> bool:
        """`r` waits for the token that ends its prefill (its first, or its next after a recompute)."""
        return r.phase is Phase.QUEUED or r.phase is Phase.PREFILL

    def complete_prefill(self, r: Request) -> None:
        """A token ended `r`'s prefill: apply whatever of its chunks no step report has (none, when
        the reports came first; all, when its first token came through the token worker's "kv_in"
        before them)."""
        p = self.view.machines[r.prompt_machine]
        while r.prefilled < r.prefill_len:
            if not r.chunk:
                start_chunk(p, r, r.prefill_len - r.prefilled)
            end_chunk(p, r)
        if r in self.view.in_step[p.id]:
            self.view.in_step[p.id].remove(r)
        if self.view.prefix is not None:
            self.view.prefix.holds(p, r)

    def first_from_token_worker(self, r: Request) -> None:
        """`r`'s first token came with its KV ("kv_in") before the prompt worker's step report: its
        prompt side's transitions, now (the late report finds nothing left to do)."""
        if self.awaiting_first(r):
            self.complete_prefill(r)
            first_token(self.view.machines[r.prompt_machine], r)

    def kv_landed(self, r: Request) -> list[Request]:
        """`r`'s KV reached its token worker: its prompt machine's copy is freed (admitting waiters
        there, as Simulation._transfer_end), and it joins its token worker's next step."""
        p, t = self.view.machines[r.prompt_machine], self.view.machines[r.token_machine]
        kv_landed(p, t, r)
        if self.view.prefix is not None:
            self.view.prefix.holds(t, r)
        return self._admit({p})

    # ---- leaving -------------------------------------------------------------------------------
    def release(self, r: Request, tokens: list[int] | None = None) -> list[Request]:
        """`r` leaves early (abort, failure, its worker died): undo what it holds. Returns waiters
        admitted by the memory it freed. `tokens`: its prompt and the outputs seen (prefix caches)."""
        if self.view.prefix is not None and tokens is not None and self.view.live(m := self.view.decoder(r)):
            self.view.prefix.leaving(m, r, tokens)
        return self._admit(self._release(r))

    def wait_for_room(self, r: Request) -> None:
        """`r`'s token worker had no room for its reservation after all (`reserved` full: on demand,
        this view's reports lag the worker): it waits in that worker's admit queue, holding nothing,
        and is admitted again when memory frees there (returned then by end_step or kv_landed)."""
        unreserve(r, self.view.machines[r.prompt_machine], self.view.machines[r.token_machine])

    def _release(self, r: Request) -> set[Machine]:
        if r.phase is Phase.DONE:
            return set()
        p, t = self.view.machines[r.prompt_machine], self.view.machines[r.token_machine]
        for m in (p, t):
            if r in self.view.in_step[m.id]:
                self.view.in_step[m.id].remove(r)
        release(r, p, t)
        return {p, t}

    def _admit(self, freed: set[Machine]) -> list[Request]:
        """Memory was freed on `freed`: the waiters they admit, each queued on the prompt machine
        chosen now (the caller dispatches them)."""
        admitted = []
        for m in sorted(freed, key=lambda m: m.id):
            if self.view.live(m):
                admitted += admit_freed(self.view.cls, m)
        return admitted

    def _settle(self, m: Machine) -> None:
        if self.view.live(m):
            self.view.cls.settle(m)

"""EcoServe's machine-level scheduler (Shen and Sen; seed 003, §3-§4): one instance, no phase split,
KV reserved for each request's *predicted* output, and the unused half of a long request's
reservation lent to shorter ones (KV-cache pipelining).

What it does, each iteration (the paper's Algorithm 1), and where:
1. Two queues (§3.2.1): prompts (PTs) wait in `m.prompt_queue`; a request whose prefill is done
   (a generation task, GT) leaves the batch for `m.decode_queue` holding only its prompt's KV
   (`park_decode`). A PT reserves its prompt only (`plan_kv`: whole blocks of the prefill).
2. Exact allocation for the predicted length (§3.2.1): a GT that starts decoding reserves KV up to
   its prompt + predicted output (`resume_decode`), the predictor's padded estimate
   (policy/predictor.py ecoserve-*; `Request.predicted`, 0: the output limit). A share RESERVE of
   the machine's KV is left free by these reservations, for prompts and for under-predicted GTs.
3. Time-synced batching (§3.2.2): GTs whose predicted remaining lengths fall in the same GROUP
   tokens form a group; they sit together in the ordered queue and the selection takes them in
   one iteration (a group that does not fit is split: its first members start), so they start
   together and, predicted alike, end together.
4. Ordering (§3.3): both queues by the deadline's bucket (ascending), then (GTs) the KV they occupy
   by KV_BUCKET (descending), then the group (GTs) or the prompt's length (PTs) (descending); ties
   first come first served. A deadline is arrival + SLO_SCALE x (T_PROMPT + T_TOKEN x predicted),
   the paper's JCT SLO (§4) with our constants. GTs are selected in this order until one does not
   fit (its reservation above the free KV less the reserve); then PTs in their order up to
   `prompt_token_cap` tokens (the paper's target forward size) and the free KV; while a GT waits
   for memory, only what the reserve leaves beside the prompt KV that waiting GTs hold (ASSUMED:
   else prompts admitted each iteration fill the memory with GTs that cannot start).
5. KV-cache pipelining (§3.4): for each GT that started with its own reservation (a host, RL l),
   the waiting GTs whose predicted lengths are the largest at most l/2 - b, then two at most
   l/4 - b, four at most l/8 - b, ... (b = BUFFER x l) decode inside its reservation: they
   reserve nothing more (`Request.host` is the host; a guest of a guest's slot is in the same
   host's reservation). Guests start in the host's iteration, so a guest predicted right ends
   before the host's tokens reach its part of the reservation.
6. Under-prediction (§3.2.2): before each iteration, the KV every host and its guests will have
   written after it (whole blocks of each) is compared with what they hold. A shortfall takes
   free KV (the reserve first of all: `grow_kv`, counted "reserve"); if there is none, the guests
   that outlived their prediction (then the youngest) are preempted and recompute later (the
   paper moves them to CPU memory; here, offload-free: counted "preempted"); a host left alone
   that still lacks KV stops and is regrouped (`park_decode`, counted "regrouped"): its remaining
   length re-predicted as what it was first predicted to make in all (ASSUMED: the paper's
   "subtract the generated length from the predicted RL" is empty once the RL is reached; this
   doubles the estimate each time), it waits holding its KV, first among its deadline bucket's
   equals by the KV it holds. If a host ends before its guests, the oldest guest becomes the host
   (the others' KV now comes from it, growing as above).
7. Progress: when nothing runs and nothing can start while GTs wait (their held KV filled the
   machine), the first GT starts with its predicted reservation, preempting the last waiting GTs
   in queue order for it (counted "unstuck"; with less, it starts with all that is free): a
   request alone always fits (check_fits), so every request completes.

How EcoServe's contiguous allocation maps onto pages. The paper lays a host's reservation out as
one contiguous range and puts a guest at its middle. A paged cache has no middle: here a
reservation is a number of whole blocks (`kv_held`), and the host and its guests (a family) share
its blocks' sum: as long as what the family has written (each member's blocks) is at most what
its members hold, no guest takes a block the host will write before the guest is done, which is
the contiguous layout's guarantee, block-rounded. The live engine (engine/scheduler.py,
engine/block_manager.py) runs it for real: each family has a pool of reserved, unwritten blocks
(its held blocks less its written ones), taken from the free list when a reservation starts or
grows, and a guest's new blocks come out of its host's pool, so the guest writes into blocks the
host reserved. The policy's shortfall check (6) runs before every step, so a pool never runs dry.

Where it differs, and why:
- Constants ASSUMED from the paper's own settings: RESERVE 3% of the KV (§2.2: 1.2/3/5%; §4
  sensitivity: best 2/3/4% for Alpaca/ShareGPT/BookCorpus), BUFFER 15% (§4: 15/15/10%), GROUP 32
  tokens (its block size, §2.1), SLO_SCALE 2 (§4). T_PROMPT 0.1 s, T_TOKEN 0.05 s stand for the
  paper's measured mean prompt and token latencies (per dataset, not given): ASSUMED. Bucket widths
  DEADLINE_BUCKET 0.5 s (the paper's example ranges 0.2-0.5 s, 0.5-2 s) and KV_BUCKET 128 tokens
  (its example RL ranges) are ASSUMED; the policy has no clock, so deadlines are bucketed as
  absolute times, not as time left.
- Groups are taken whenever KV allows (the paper re-selects when a group completes, which frees
  KV; new GTs here may also join when memory is free): ASSUMED, same effect on memory.
- Whole prompts (no chunking), a longer prompt than the budget runs alone, as the other
  schedulers here; the paper splits BookCorpus prompts into 2048-token pieces beforehand.
- A guest that outlives its slot is preempted only when the family has no free KV to grow into.
- The live engine's arrival is an admission counter, so its deadlines order requests by
  admission; the simulator's are in seconds.

Live, the router keeps its own view of each worker (serve/cluster_state.py). A machine whose
`sizing` is set (the engine's view of itself) records in a `Sizing` what form_batch did to KV
beyond a batch's chunks, preemptions and joins: GTs parked (`park`), resumed with their
reservation and host (`resume`), re-hosted, reservations grown (`grow_kv`), prompts planned
(`plan_kv`); the worker reports it in its `step` message and the router's view makes the same
calls (tests/serve/test_cluster_state.py compares both views event by event).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..machine import Batch, BatchingConfig, _form_isolated, close_batch
from ..state import Machine, Phase, Request
from ..transitions import (drop_waiting, grow_kv, note, park_decode, plan_kv, preempt, prefill_reservation,
                           resume_decode, start_chunk, start_decodes)
from .base import MachineScheduler

if TYPE_CHECKING:
    from typing import Callable

    from ..machine import BatchReport

GROUP = 32              # predicted lengths in one GROUP-token step form a time-synced group
RESERVE = 0.03          # share of KV that reservations for predicted outputs leave free
BUFFER = 0.15           # b, as a share of the host's predicted length
SLO_SCALE = 2.0
T_PROMPT = 0.1          # s, a prompt's mean latency (ASSUMED)
T_TOKEN = 0.05          # s, a token's mean latency (ASSUMED)
DEADLINE_BUCKET = 0.5   # s
KV_BUCKET = 128         # tokens


def predicted(r: Request) -> int:
    """The output tokens `r` is predicted to make in all (its limit when it has no prediction)."""
    return r.predicted or r.output_tokens


def left(r: Request) -> int:
    return predicted(r) - r.generated


def deadline(r: Request) -> float:
    """When `r`'s JCT SLO ends (fixed at its first prediction)."""
    if r.deadline < 0:
        r.deadline = r.arrival + SLO_SCALE * (T_PROMPT + T_TOKEN * predicted(r))
    return r.deadline


def prompt_key(r: Request) -> tuple:
    return (int(deadline(r) // DEADLINE_BUCKET), -r.prefill_len, r.arrival, r.id)


def gt_key(r: Request) -> tuple:
    return (int(deadline(r) // DEADLINE_BUCKET), -(r.kv_held // KV_BUCKET), -left(r) // GROUP, r.arrival, r.id)


def reserve(m: Machine) -> int:
    return m.kv_round(math.ceil(RESERVE * m.kv_capacity))


def _repredict(r: Request) -> None:
    """`r` reached its predicted length and goes on: predicted to make as many again (ASSUMED)."""
    if left(r) <= 0:
        r.predicted = r.generated + predicted(r)


@dataclass(slots=True)
class Sizing:
    """How form_batch sized KV on a machine whose `sizing` is set, in the order it did it, for a view
    of the machine kept elsewhere: the engine reports it to the router (BatchReport, the `step`
    message), whose view (serve/cluster_state.py) applies it with `park`, `grow_kv`, `resume` and
    `plan_kv`, the calls made here. Preemptions (of guests, and of waiting GTs: "unstuck") are the
    batch's `preempted`, reported as every scheduler's."""

    rehosted: list[tuple[Request, Request]] = field(default_factory=list)  # (guest, its new host)
    parked: list[Request] = field(default_factory=list)       # left the batch for the GT queue
    grown: list[tuple[Request, int]] = field(default_factory=list)   # (host, KV tokens more)
    resumed: list[tuple[Request, int, Request]] = field(default_factory=list)   # (GT, KV held, host)
    planned: list[Request] = field(default_factory=list)      # prompts that reserve their prefill only

    def report(self, rep: "BatchReport", rid: "Callable[[Request], str]") -> None:
        """Tell `rep` (a BatchReport) what was recorded, each request by its id `rid(r)`, and forget it."""
        rep.rehosted = [(rid(g), rid(h)) for g, h in self.rehosted]
        rep.parked = [rid(r) for r in self.parked]
        rep.grown = [(rid(h), n) for h, n in self.grown]
        rep.resumed = [(rid(r), held, rid(h)) for r, held, h in self.resumed]
        rep.planned = [rid(r) for r in self.planned]
        for part in (self.rehosted, self.parked, self.grown, self.resumed, self.planned):
            part.clear()


def park(m: Machine, r: Request) -> None:
    """Running `r` leaves the batch for the GT queue, keeping its KV (a GT whose prefill just
    ended, or a host regrouped): it is hosted by nobody, predicted again if it reached its
    prediction, and waits in `gt_key` order."""
    m.running.remove(r)
    r.host = None
    _repredict(r)
    park_decode(m, r, gt_key)
    if m.sizing is not None:
        m.sizing.parked.append(r)


def resume(m: Machine, r: Request, held: int, host: Request) -> None:
    """Waiting `r` decodes from now on, holding `held` KV tokens, in `host`'s reservation (itself: its
    own)."""
    resume_decode(m, r, held)
    r.host = host
    if m.sizing is not None:
        m.sizing.resumed.append((r, held, host))


def _grow(m: Machine, h: Request, n: int) -> None:
    grow_kv(m, h, n)
    note(m, "reserve")
    if m.sizing is not None:
        m.sizing.grown.append((h, n))


def _written(m: Machine, r: Request) -> int:
    """KV tokens (whole blocks) `r` will have written after its next decode step."""
    return m.kv_round(r.prompt_tokens + r.generated)


def _families(m: Machine) -> tuple[dict[Request, list[Request]], list[Request]]:
    """The families (host first, then its guests) whose writes of the next step may pass what they
    hold, re-hosting a family whose host has left; and the fresh GTs (prefill just done) to park."""
    fresh: list[Request] = []
    over: list[Request] = []
    guests: dict[Request, list[Request]] | None = None
    for r in m.running:
        h = r.host
        if h is r:
            if r.prompt_tokens + r.generated > r.kv_held:   # held is whole blocks: it needs another
                over.append(r)
        elif h is None:
            if r.kv_held and not r.in_flight:
                fresh.append(r)
        elif guests is None:
            guests = {h: [r]}
        elif h in guests:
            guests[h].append(r)
        else:
            guests[h] = [r]
    fams: dict[Request, list[Request]] = {}
    if guests:
        for h, gs in guests.items():
            if h.phase is Phase.DECODE:
                fams[h] = [h, *gs]
                continue
            gs.sort(key=lambda x: (x.arrival, x.id))   # the host ended: the oldest guest hosts
            for x in gs:
                x.host = gs[0]
            if m.sizing is not None:
                m.sizing.rehosted += [(x, gs[0]) for x in gs]
            fams[gs[0]] = gs
    for h in over:
        if h not in fams:
            fams[h] = [h]
    return fams, fresh


def _settle(m: Machine, fams: dict[Request, list[Request]], batch: Batch) -> set[Request]:
    """Cover every family's writes of the next step (6 above); returns the decodes held back this
    iteration (only on a pipelined machine, while a member is still in a batch in flight)."""
    held_back: set[Request] = set()
    for h, fam in fams.items():
        short = 0
        for x in fam:
            short += _written(m, x) - x.kv_held
        if short <= 0:
            continue
        if m.kv_free >= short:
            _grow(m, h, short)
            continue
        guests = sorted((x for x in fam if x is not h and not x.in_flight),
                        key=lambda x: (left(x) > 0, -x.arrival, -x.id))
        for g in guests:
            short -= _written(m, g) - g.kv_held
            preempt(m, g)
            fam.remove(g)
            batch.preempted.append(g)
            note(m, "preempted")
            if short <= 0 or m.kv_free >= short:
                break
        if short <= 0:
            continue
        if m.kv_free >= short:
            _grow(m, h, short)
        elif len(fam) == 1 and not h.in_flight:
            park(m, h)
            note(m, "regrouped")
        else:
            held_back.update(x for x in fam if not x.in_flight)
    return held_back


def _start_gts(m: Machine, cfg: BatchingConfig, seats: float) -> tuple[float, bool]:
    """Start waiting GTs in queue order while their reservations fit (2, 3 above), then lend their
    reservations to shorter ones (5). Returns the seats left and whether a GT waits for memory."""
    q = m.decode_queue
    room = m.kv_free - reserve(m)
    hosts: list[Request] = []
    blocked = False
    for r in list(q):
        held = max(m.kv_round(r.prompt_tokens + predicted(r)), r.kv_held)
        if seats < 1 or held - r.kv_held > room:
            blocked = True
            break
        room -= held - r.kv_held
        resume(m, r, held, r)
        hosts.append(r)
        seats -= 1
    if not hosts or not q or seats < 1:
        return seats, blocked
    cands = sorted(q, key=lambda x: (left(x), x.arrival, x.id))
    lens = [left(x) for x in cands]
    for h in hosts:
        n = left(h)
        b = BUFFER * n
        spare = h.kv_held - _written(m, h)
        level = 1
        while seats >= 1 and cands:
            bound = n / (1 << level) - b
            if bound < 1:
                break
            for _ in range(1 << (level - 1)):
                j = bisect_right(lens, bound) - 1
                while j >= 0 and _written(m, cands[j]) - cands[j].kv_held > spare:
                    j -= 1   # its first token would not fit the host's unwritten blocks
                if j < 0 or seats < 1:
                    break
                g = cands.pop(j)
                lens.pop(j)
                spare -= _written(m, g) - g.kv_held
                resume(m, g, g.kv_held, h)
                note(m, "pipelined")
                seats -= 1
            level += 1
    return seats, blocked


def _start_prompts(m: Machine, cfg: BatchingConfig, batch: Batch, seats: float, room: int) -> None:
    """Whole prompts in queue order up to the token budget, the seats and `room` KV tokens."""
    q = m.prompt_queue
    if len(q) > 1:
        order = sorted(q, key=prompt_key)
        q.clear()
        q.extend(order)
    budget = cfg.prompt_token_cap
    while q and seats >= 1:
        head = q[0]
        n = head.prefill_len - head.prefilled
        if batch.prompts and n > budget:
            break
        mine = head.token_machine == m.id and not head.isolated
        kv = m.kv_round(head.prefill_len) if mine else prefill_reservation(m, head)
        if head.prefilled == 0:
            if kv > room:
                break
            room -= kv
            if mine:
                plan_kv(m, head)
                if m.sizing is not None:
                    m.sizing.planned.append(head)
        start_chunk(m, head, n)
        batch.prompts.append(head)
        batch.chunks.append(n)
        batch.prompt_tokens += n
        budget -= n
        seats -= 1


def _prompt_room(m: Machine) -> int:
    """KV prompts may take while a GT waits for memory: what the reserve leaves beside the prompts'
    KV the waiting GTs already hold (ASSUMED: so the reserve, not the free KV, bounds the prompts
    waiting as GTs, and their KV cannot crowd out the reservations of the GTs before them)."""
    room = min(m.kv_free, reserve(m))
    for r in m.decode_queue:
        room -= r.kv_held
        if room <= 0:
            return 0
    return room


def _unstick(m: Machine, batch: Batch) -> None:
    """Nothing runs and nothing could start: the first waiting GT starts with what is free,
    preempting the last waiting ones if it must (7 above)."""
    q = m.decode_queue
    q.sort(key=gt_key)
    h = q[0]
    need = _written(m, h) - h.kv_held
    want = max(m.kv_round(h.prompt_tokens + predicted(h)) - h.kv_held, need)
    while m.kv_free < want and len(q) > 1:   # room for its prediction, not only its next token
        v = q[-1]
        drop_waiting(m, v)
        batch.preempted.append(v)
        note(m, "unstuck")
    if m.kv_free < need:
        raise AssertionError(f"request {h.id} cannot decode alone ({need} KV tokens, {m.kv_free} free)")
    resume(m, h, h.kv_held + min(want, m.kv_free), h)


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    batch = Batch()
    if m.ready:
        batch.joined = start_decodes(m)
    fams, fresh = _families(m)
    for r in fresh:      # their prefill just ended: they wait as GTs
        park(m, r)
    held_back = _settle(m, fams, batch) if fams else set()
    if m.isolated:  # rare: a suspect request is here (policy/machine.py: isolated requests; they
        formed = _form_isolated(m, cfg, batch)   # reserve prompt + output, and GTs wait meanwhile)
        if formed is not None or not m.decode_queue:
            return formed
        # nothing could run, and waiting GTs hold KV an isolated prompt needs: the GTs (never
        # isolated: a suspect runs whole) go on alone until they free it
        seats = (cfg.max_seqs - len(m.running)) if cfg.max_seqs else math.inf
        _start_gts(m, cfg, seats)
        if not m.running:
            _unstick(m, batch)
        return close_batch(m, batch, m.running)
    seats = (cfg.max_seqs - len(m.running)) if cfg.max_seqs else math.inf
    blocked = False
    if m.decode_queue:
        seats, blocked = _start_gts(m, cfg, seats)
    if m.prompt_queue:
        _start_prompts(m, cfg, batch, seats, _prompt_room(m) if blocked else m.kv_free)
    if not m.running and not batch.prompts and m.decode_queue and not m.running_prompt_tokens:
        _unstick(m, batch)   # (prefills still in a pipelined machine's stages will free or hold KV)
    if m.stages > 1 or held_back:
        decoding = [r for r in m.running if not r.in_flight and r not in held_back]
    else:
        decoding = m.running
    return close_batch(m, batch, decoding)



@dataclass(frozen=True, slots=True)
class EcoServe(MachineScheduler):
    """EcoServe's declarations: predicted lengths, KV pooled by a host and its guests, and its
    sizing recorded (`Sizing`) and reported for a view kept elsewhere."""

    def record(self, m: Machine) -> None:
        m.sizing = Sizing()

    def report(self, m: Machine, rep: "BatchReport", rid: "Callable[[Request], str]") -> None:
        if m.sizing is not None:
            m.sizing.report(rep, rid)

    def kv_pool(self, r: Request) -> Request | None:
        return r.host or r


SCHEDULER = EcoServe("ecoserve", form_batch, "EcoServe: prompt and generation queues, KV for the predicted output, "
                     "same-length groups, a long reservation lent to short requests", predicts=True, pools_kv=True)

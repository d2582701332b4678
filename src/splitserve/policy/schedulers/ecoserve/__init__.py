"""EcoServe's machine-level scheduler (Shen and Sen, §3-§4): one instance, no phase split,
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
   reserve nothing more (`Gen.host`, order.py, is the host; a guest of a guest's slot is in the same
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
`sched` is a `Sizing` (the engine's view of itself: `EcoServe.record`) records there what
form_batch did to KV beyond a batch's chunks, preemptions and joins: GTs parked (`park`), resumed
with their reservation and host (`resume`), re-hosted, reservations grown (`grow`), prompts
planned (`plan_kv`); the worker reports it in its `step` message (`sched`) and the router's view
makes the same calls (view.py; tests/serve/test_cluster_state.py compares both views event by
event).

What EcoServe keeps beyond the shared objects: per request a `Gen` (order.py: its host and
deadline, `Request.sched`), per machine its `Sizing` when one is recorded (`Machine.sched`). The
predicted length (`Request.predicted`, policy/predictor.py) and the KV a request holds when its
scheduler sizes it (`Request.kv_held`, read by policy/transitions.py) are shared.

Modules: order.py (constants, per-request state, queue order), sizing.py (the calls that size KV,
recorded), families.py (5-6: hosts and guests before each step), start.py (2-5, 7: what starts),
view.py (the router's view applying a report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ...kv_allocation import RESERVE
from ...machine import Batch, BatchingConfig, close_batch, form_isolated
from ...state import Machine, Request
from ...transitions import start_decodes
from ..base import Applying, MachineScheduler
from .families import families, settle
from .order import host, set_host
from .sizing import Sizing, park
from .start import prompt_room, start_gts, start_prompts, unstick
from .view import SizingView, check_sizing


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    batch = Batch()
    if m.ready:
        batch.joined = start_decodes(m)
    fams, fresh = families(m)
    for r in fresh:      # their prefill just ended: they wait as GTs
        park(m, r)
    held_back = settle(m, fams, batch) if fams else set()
    if m.isolated:  # rare: a suspect request is here (policy/machine.py: isolated requests; they
        formed = form_isolated(m, cfg, batch)   # reserve prompt + output, and GTs wait meanwhile)
        for v in batch.preempted:   # they hold no KV: hosted by nobody
            set_host(v, None)
        if formed is not None or not m.decode_queue:
            return formed
        # nothing could run, and waiting GTs hold KV an isolated prompt needs: the GTs (never
        # isolated: a suspect runs whole) go on alone until they free it
        seats = (cfg.max_seqs - len(m.running)) if cfg.max_seqs else math.inf
        start_gts(m, cfg, seats)
        if not m.running:
            unstick(m, batch)
        return close_batch(m, batch, m.running)
    seats = (cfg.max_seqs - len(m.running)) if cfg.max_seqs else math.inf
    blocked = False
    if m.decode_queue:
        seats, blocked = start_gts(m, cfg, seats)
    if m.prompt_queue:
        start_prompts(m, cfg, batch, seats, prompt_room(m) if blocked else m.kv_free)
    if not m.running and not batch.prompts and m.decode_queue and not m.running_prompt_tokens:
        unstick(m, batch)   # (prefills still in a pipelined machine's stages will free or hold KV)
    if m.stages > 1 or held_back:
        decoding = [r for r in m.running if not r.in_flight and r not in held_back]
    else:
        decoding = m.running
    return close_batch(m, batch, decoding)


@dataclass(frozen=True, slots=True)
class EcoServe(MachineScheduler):
    """EcoServe's declarations: predicted lengths, KV pooled by a host and its guests, its sizing
    recorded (`Sizing`), reported and applied by a view kept elsewhere (`SizingView`)."""

    def record(self, m: Machine) -> None:
        m.sched = Sizing()

    def report(self, m: Machine, rid: Callable[[Request], str]) -> Any:
        return None if m.sched is None else m.sched.encode(rid)

    def check_report(self, rep: Any) -> str | None:
        return check_sizing(rep)

    def apply_report(self, m: Machine, rep: Any, get: Callable[[str], Request | None]) -> Applying:
        return SizingView(m, rep, get)

    def kv_pool(self, r: Request) -> Request | None:
        return host(r) or r


SCHEDULER = EcoServe("ecoserve", form_batch, "EcoServe: prompt and generation queues, KV for the predicted output, "
                     "same-length groups, a long reservation lent to short requests", predicts=True, pools_kv=True,
                     allocation=RESERVE)

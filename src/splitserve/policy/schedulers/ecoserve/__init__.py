"""EcoServe's machine-level scheduler (Shen and Sen, §3-§4): one instance, no phase split,
KV reserved for each request's *predicted* output, and the unused half of a long request's
reservation lent to shorter ones (KV-cache pipelining).

Each iteration (the paper's Algorithm 1):
1. Two queues (§3.2.1): prompts (PTs) in `m.prompt_queue`, reserving their prefill's blocks only
   (`plan_kv`); a prefilled request (a generation task, GT) waits in `m.decode_queue` holding its
   prompt's KV (`park_decode`).
2. Exact allocation (§3.2.1): a GT that starts reserves its prompt + predicted output
   (`resume_decode`; `Request.predicted`, policy/predictor.py); a share RESERVE of the KV stays
   free of these reservations, for prompts and under-predicted GTs.
3. Time-synced batching (§3.2.2): GTs whose predicted remaining lengths fall in the same GROUP
   tokens start together, and so end together.
4. Ordering (§3.3): both queues by deadline bucket, then GTs by held KV and group, PTs longest
   first; GTs start in that order until one does not fit, then PTs up to `prompt_token_cap`.
5. KV-cache pipelining (§3.4): a GT starting with its own reservation of l tokens (a host) lends
   it to waiting GTs predicted to need at most l/2 - b, then two at most l/4 - b, ...
   (b = BUFFER x l); these guests reserve nothing more (`Gen.host`, order.py).
6. Under-prediction (§3.2.2): before each iteration a family (a host and its guests) that has
   written more than it holds grows into free KV (`grow_kv`), else preempts the guests that
   outlived their prediction, else regroups its host (`park_decode`, re-predicted).
7. Progress: when nothing can start, the first GT starts anyway, preempting waiting GTs for its
   reservation, so every request completes.

Pages, not a contiguous range: the paper puts a guest in the middle of its host's range; here a
family shares the sum of its members' whole blocks (`kv_held`), and while what it has written
stays within that sum no guest takes a block the host will write, the same guarantee
block-rounded (the live engine keeps each family's unwritten blocks: engine/block_manager.py).

Where it differs, and why: the paper's settings give RESERVE, BUFFER, GROUP and SLO_SCALE;
T_PROMPT, T_TOKEN and the bucket widths are ASSUMED (not given), and deadlines are absolute times
(the policy has no clock). Prompts run whole; a preempted guest recomputes (the paper moves it to
CPU memory).

Live, the engine's view of a machine records what form_batch sized (`Sizing`, sizing.py), the
worker reports it, and the router's view applies it with the same calls (view.py).

Modules: order.py (constants, per-request state, queue order), sizing.py (the calls that size KV,
recorded), families.py (5, 6), start.py (2-5, 7), view.py (the router's view applying a report).
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

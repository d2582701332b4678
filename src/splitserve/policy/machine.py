"""Machine-level scheduling (paper §IV-B): which work one machine runs in its next iteration.

One rule set serves every machine, because a machine's queues say what it is:
- a prompt machine has only prompts: FCFS, at most `prompt_token_cap` prefill tokens a batch
  (2048 in the paper; a single larger prompt still runs alone);
- a token machine has only decodes: FCFS admission, as many as KV memory holds, in one batch;
- a mixed machine (Splitwise's mixed pool, or an unsplit baseline) runs prompts and decodes in the
  same iteration. Prompts take priority: a prompt that lacks KV memory preempts running decodes,
  youngest first, none more than `preemption_limit` times, so no request starves;
- with `chunk_size` > 0 (Sarathi-style chunked prefill), an iteration holds at most `chunk_size`
  tokens: every running decode first, then prompt chunks FCFS in what is left;
- a pipelined machine (`stages` > 1) has up to one batch in flight per stage; a new batch takes
  the work no batch in flight holds;
- an isolated request (a suspect of a failed engine step, serve/router.py) never shares an
  iteration: iterations alternate between the oldest isolated request alone and the rest.

These are the "splitwise" scheduler (form_mixed), the default; `BatchingConfig.scheduler` names
another (policy/schedulers/), each built from the helpers here.

The caller owns time: it asks for a batch, runs it, then reports the iteration done. Nothing here
reads a clock or changes a counter: form_batch and finish_iteration decide, and the transitions
of policy/transitions.py carry the decisions out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .state import Machine, Phase, Request
from .kv_allocation import prefill_reservation
from .preemption import grow_decodes, make_room, requeue
from .transitions import decode_tokens, end_chunk, first_token, start_chunk, start_decodes

@dataclass(frozen=True, slots=True, kw_only=True)
class BatchingConfig:
    prompt_token_cap: int = 2048       # prefill tokens per iteration (paper §IV-B)
    chunk_size: int = 0                # 0: whole prompts; > 0: chunked prefill token budget
    preemption_limit: int = 3          # times one request may be preempted
    max_seqs: int = 0                  # requests holding KV at once (0: as many as memory holds)
    scheduler: str = "splitwise"       # the machine-level scheduler, by name (policy/schedulers/)
    max_len: int = 0                   # orca only: KV tokens reserved per request (0: its prompt + output)
    kv_allocation: str = "reserve"     # "reserve" or "on-demand" (policy/kv_allocation.py)
    kv_watermark: float = 0.01         # on demand: share of the KV blocks an admission leaves free
    recompute: str = "auto"            # a decode preempted where its prompt did not run: recomputed
                                       # "in-place", or through the "prompt-pool" (policy/cluster.py
                                       # readmit); "auto": prompt-pool on demand, in-place under reserve


@dataclass(slots=True, init=False)  # __init__ below, compiled (state.Request says why)
class Batch:
    prompts: list[Request]      # prefilled (or chunked) this iteration
    chunks: list[int]           # prefill tokens computed for each
    prompt_tokens: int
    joined: list[Request]       # decodes that entered the batch now
    decoding: list[Request]     # the running decodes of this iteration
    decodes: int                # len(decoding)
    context: int                # their KV tokens
    preempted: list[Request]
    grown: list[Request]        # on demand: decodes that took KV for this step
    cached: int                 # of prompt_tokens, those a prefix cache gave (not computed; set by
                                # the simulator: sim/prefix.py)

    def __init__(self, prompts: list[Request] | None = None, chunks: list[int] | None = None, prompt_tokens: int = 0,
                 joined: list[Request] | None = None, decoding: list[Request] | None = None, decodes: int = 0,
                 context: int = 0, preempted: list[Request] | None = None, grown: list[Request] | None = None,
                 cached: int = 0) -> None:
        self.prompts = [] if prompts is None else prompts
        self.chunks = [] if chunks is None else chunks
        self.prompt_tokens = prompt_tokens
        self.joined = [] if joined is None else joined
        self.decoding = [] if decoding is None else decoding
        self.decodes = decodes
        self.context = context
        self.preempted = [] if preempted is None else preempted
        self.grown = [] if grown is None else grown
        self.cached = cached


@dataclass(slots=True)
class BatchReport:
    """A formed batch as its machine tells a view of it kept elsewhere (a worker, the router), by
    request id: prefill chunks started (id, tokens), decodes preempted, decodes that joined, and
    the decodes it runs (`grown`: those of them that took KV for it, on demand); and its machine scheduler's own report (`sched`: MachineScheduler.report,
    opaque here; ecoserve's KV sizing), None when it tells nothing; and (an engine's) each prompt
    starting there with the tokens its prefix cache gave it (`cached`: id, tokens). The view applies the same
    transitions (serve/cluster_state.py)."""

    chunks: list[tuple[str, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    joined: list[str] = field(default_factory=list)
    decoding: list[str] = field(default_factory=list)
    grown: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)   # of `preempted`, those that left this machine for the
                                                    # prompt pool (not on the wire: a view applies the rule)
    sched: Any = None
    cached: list[tuple[str, int]] = field(default_factory=list)  # an engine's starting prompts: tokens from its prefix cache

    def told(self) -> bool:
        """Whether a view kept elsewhere must hear of this batch (it changed something there)."""
        return bool(self.chunks or self.preempted or self.joined or self.grown) or self.sched is not None


@dataclass(slots=True, init=False)  # __init__ below, compiled (state.Request says why)
class IterationResult:
    first_tokens: list[Request]     # prefill finished: they produced a token (their first, or the
                                    # next one after a recompute)
    finished: list[Request]         # produced their last token; their KV is released

    def __init__(self, first_tokens: list[Request], finished: list[Request]) -> None:
        self.first_tokens = first_tokens
        self.finished = finished


# ---- the rules, stated once ---------------------------------------------------------------------
def prompt_budget(cfg: BatchingConfig, decodes: int) -> int:
    """Prefill tokens one iteration may compute: the cap, or with chunked prefill what is left of
    the chunk after one token for each of the `decodes` running decodes."""
    if cfg.chunk_size > 0:
        return max(cfg.chunk_size - decodes, 0)
    return cfg.prompt_token_cap


def prompt_take(cfg: BatchingConfig, remaining: int, budget: int, first: bool) -> int:
    """Tokens of the queue head's prefill to run this iteration; 0: it waits (and so does everyone
    behind it: FCFS). Whole prompts run whole, and only if they fit what is left of the budget,
    except the iteration's first prompt, which runs alone however long it is; chunked prefill takes
    what the budget leaves."""
    if budget <= 0:
        return 0
    if cfg.chunk_size > 0:
        return min(remaining, budget)
    return remaining if first or remaining <= budget else 0


def admit_prompt(m: Machine, cfg: BatchingConfig, head: Request, budget: int, batch: Batch,
                 decoding: list[Request], fits: Callable[[Request], bool] | None = None) -> int:
    """Start the next chunk of prompt `head` if the rules let it: the tokens it takes; 0 when it
    waits (and, FCFS, so does everyone behind it). Its first chunk needs a seat (max_seqs) and its
    KV, for which decodes of `decoding` may be preempted; or, given `fits`, only what `fits(head)`
    allows (a scheduler's own admission test, no preemption; it must also check the KV is free)."""
    n = prompt_take(cfg, head.prefill_len - head.prefilled, budget, first=not batch.prompts)
    if n == 0:
        return 0
    if head.prefilled == 0:
        if cfg.max_seqs and len(decoding) + len(batch.prompts) >= cfg.max_seqs:
            return 0
        if fits is not None:
            if not fits(head):
                return 0
        elif not make_room(m, prefill_reservation(m, head), cfg.preemption_limit, batch.preempted, decoding):
            return 0
    start_chunk(m, head, n)
    batch.prompts.append(head)
    batch.chunks.append(n)
    batch.prompt_tokens += n
    return n


def free_decodes(m: Machine) -> list[Request]:
    """The running decodes a new batch may take: all of them, or on a pipelined machine those that
    no batch in flight holds (they wait for it)."""
    if m.stages > 1:
        return [r for r in m.running if not r.in_flight]
    return m.running


def close_batch(m: Machine, batch: Batch, decoding: list[Request]) -> Batch | None:
    """A formed iteration that runs the prompts taken and the decodes `decoding`: the decodes it
    preempted are requeued (they recompute soon, before younger prompts); None when it runs
    nothing. On a pipelined machine its decodes are in flight until it ends."""
    if batch.preempted:
        requeue(m, batch.preempted)
    elif not batch.prompts and not decoding:
        return None
    batch.decoding = decoding
    batch.decodes = len(decoding)
    if decoding is m.running:
        batch.context = m.context_tokens
    else:
        batch.context = sum(r.prompt_tokens + r.generated for r in decoding)
        if m.stages > 1:
            for r in decoding:
                r.in_flight = True
    return batch


def form_mixed(m: Machine, cfg: BatchingConfig) -> Batch | None:
    """The splitwise scheduler (the rules above): mixed continuous batching. Starts the chosen
    prefill chunks (their first chunk reserves KV, preempting decodes if it must); running and
    ready decodes already hold theirs."""
    batch = Batch()
    if m.ready:
        batch.joined = start_decodes(m)
    if m.isolated:  # rare: a suspect request is here
        return form_isolated(m, cfg, batch)
    queue = m.prompt_queue
    running = m.running if m.stages == 1 else free_decodes(m)
    grow_decodes(m, running, batch.preempted, cfg.preemption_limit, batch.grown)  # on demand
    budget = prompt_budget(cfg, len(running))
    while queue and not (m.kv_on_demand and batch.preempted and queue[0].prefilled == 0):  # vLLM: a step
        # that preempted takes no new prompt (a started prefill goes on: it holds its KV)
        n = admit_prompt(m, cfg, queue[0], budget, batch, running)
        if not n:
            break
        budget -= n
    return close_batch(m, batch, running)


def _formed(m: Machine, cfg: BatchingConfig, batch: Batch, decoding: list[Request]) -> Batch | None:
    """An isolated iteration running `decoding` (grown on demand) and the prompts taken
    (form_batch's end, for a part of the running decodes)."""
    grow_decodes(m, decoding, batch.preempted, cfg.preemption_limit, batch.grown)
    requeue(m, batch.preempted)
    if not (batch.prompts or decoding or batch.joined or batch.preempted):  # what changed must be told
        return None
    batch.decoding = decoding
    batch.decodes = len(decoding)
    batch.context = sum(r.prompt_tokens + r.generated for r in decoding)
    return batch


def form_isolated(m: Machine, cfg: BatchingConfig, batch: Batch) -> Batch | None:
    """`m` holds isolated requests. Iterations alternate between the oldest of them that can run,
    alone, and everything else (by the usual rules, preempting only decodes that are not
    isolated); a turn with nothing to run gives way to the other. (The oldest alone would starve
    a younger isolated decode behind an isolated prompt that cannot fit.)"""
    isolated = sorted((r for r in (*m.running, *m.prompt_queue) if r.isolated), key=lambda r: r.arrival)
    others = [r for r in m.running if not r.isolated]
    m.isolated_turn = not m.isolated_turn
    for alone in ((True, False) if m.isolated_turn else (False, True)):
        if alone:
            for lone in isolated:
                if lone.phase is Phase.DECODE:
                    return _formed(m, cfg, batch, [lone])
                admit_prompt(m, cfg, lone, prompt_budget(cfg, 0), batch, others)
                if batch.prompts:
                    return _formed(m, cfg, batch, [])
        else:
            budget = prompt_budget(cfg, len(others))
            for head in [r for r in m.prompt_queue if not r.isolated]:
                n = admit_prompt(m, cfg, head, budget, batch, others)
                if not n:
                    break
                budget -= n
            if batch.prompts or others:
                return _formed(m, cfg, batch, others)
        m.isolated_turn = not m.isolated_turn
    return _formed(m, cfg, batch, [])


def finish_iteration(m: Machine, batch: Batch) -> IterationResult:
    """Account for one finished iteration: every decode of the batch produced a token, prefills
    that completed produced one too. Returns who got a first token and who finished. Requests whose
    prefill finished and that decode elsewhere are left in HANDOFF for the caller to hand off."""
    finished = decode_tokens(m, batch.decoding) if batch.decoding else []
    if m.stages > 1:
        for r in batch.decoding:
            r.in_flight = False
    first: list[Request] = []
    for r in batch.prompts:
        if end_chunk(m, r):
            first.append(r)
            if first_token(m, r):
                finished.append(r)
    return IterationResult(first, finished)

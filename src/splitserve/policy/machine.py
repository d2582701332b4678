"""Machine-level scheduling (paper §IV-B): which work one machine runs in its next iteration.

One rule set serves every machine, because a machine's queues say what it is:
- a prompt machine has only prompts: FCFS, at most `prompt_token_cap` prefill tokens a batch
  (2048 in the paper; a single larger prompt still runs alone);
- a token machine has only decodes: FCFS admission, as many as KV memory holds, all in one batch;
- a mixed machine (Splitwise's mixed pool, or an unsplit baseline) runs prompts and decodes in the
  same iteration (mixed continuous batching). Prompts take priority: when a prompt lacks KV memory,
  running decodes are preempted (their KV dropped, recomputed later, ahead of younger prompts).
  A decode's priority grows with its age, so the youngest go first, and none is preempted more
  than `preemption_limit` times, so no request starves.
- with `chunk_size` > 0 (Sarathi-style chunked prefill), an iteration holds at most `chunk_size`
  tokens: every running decode (one each) first, then prompt chunks FCFS in what is left.

The caller owns time: it asks for a batch, runs it for however long it takes, then reports the
iteration done. Nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, TypeVar

from .state import Machine, Phase, Request

R = TypeVar("R", bound="Preemptible")


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    prompt_token_cap: int = 2048
    chunk_size: int = 0                # 0: whole prompts; > 0: chunked prefill token budget
    preemption_limit: int = 3


@dataclass(slots=True)
class Batch:
    prompts: list[Request] = field(default_factory=list)   # prefilled (or chunked) this iteration
    chunks: list[int] = field(default_factory=list)        # prefill tokens computed for each
    prompt_tokens: int = 0
    joined: list[Request] = field(default_factory=list)    # decodes that entered the batch now
    decodes: int = 0                                        # running decodes in this iteration
    context: int = 0                                        # their KV tokens
    preempted: list[Request] = field(default_factory=list)


@dataclass(slots=True)
class IterationResult:
    first_tokens: list[Request]     # prefill finished: they produced a token (their first, or the
                                    # next one after a recompute)
    finished: list[Request]         # produced their last token; their KV is released


def decode_reservation(m: Machine, r: Request) -> int:
    """KV tokens `r` holds on the machine `m` that decodes it: the prompt and every token it will
    generate, reserved up front (whole blocks) so a running decode batch never outgrows memory."""
    return m.kv_round(r.kv_need)


def prefill_reservation(m: Machine, r: Request) -> int:
    """KV tokens a prefill of `r` holds on `m`: everything if `m` will decode it too, else only the
    prompt's KV until it has been sent to the token machine."""
    return decode_reservation(m, r) if r.token_machine == m.id else m.kv_round(r.prompt_tokens)


def enqueue_prompt(m: Machine, r: Request) -> None:
    r.phase = Phase.QUEUED
    r.prefilled = 0
    m.prompt_queue.append(r)
    m.queued_prompt_tokens += r.prefill_len
    m.pending += r.prefill_len


def join_decode(m: Machine, r: Request) -> None:
    """KV of `r` is in place on `m` (memory already reserved): decode from the next iteration."""
    m.ready.append(r)


# ---- the rules, stated once -------------------------------------------------------------------
# form_batch below applies them to the policy's token-level state (simulator); the live engine
# applies the same functions to its paged cache (engine/policy_batching.py).

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


class Preemptible(Protocol):
    arrival: float
    preemptions: int


def preemption_victims(running: Iterable[R], shortfall: int, held: Callable[[R], int],
                       limit: int) -> list[R] | None:
    """Running decodes to preempt so that a prompt gets `shortfall` more KV: the youngest first, none
    preempted more than `limit` times; `held(r)` is what preempting `r` frees. None when all that
    may be preempted together free too little (the prompt waits and nobody is preempted)."""
    if shortfall <= 0:
        return []
    eligible = [r for r in running if r.preemptions < limit]
    if sum(map(held, eligible)) < shortfall:
        return None
    eligible.sort(key=lambda r: r.arrival, reverse=True)
    out: list[R] = []
    for r in eligible:
        if shortfall <= 0:
            break
        out.append(r)
        shortfall -= held(r)
    return out


def _preempt_for(m: Machine, need: int, limit: int, batch: Batch) -> bool:
    """Free at least `need` KV tokens on `m` by preempting running decodes (preemption_victims)."""
    victims = preemption_victims(m.running, need - m.kv_free, lambda r: decode_reservation(m, r), limit)
    if victims is None:
        return False
    for v in victims:
        m.running.remove(v)
        m.kv_used -= decode_reservation(m, v)
        m.context_tokens -= v.prompt_tokens + v.generated
        m.decode_tokens_left -= v.output_tokens - v.generated
        m.pending -= v.output_tokens - v.generated
        v.preemptions += 1
        batch.preempted.append(v)
    return True


def form_batch(m: Machine, cfg: BatchingConfig) -> Batch | None:
    """The next iteration's work on `m`, or None when it has nothing to run. Reserves KV memory
    for newly admitted prompts; running and ready decodes already hold theirs."""
    batch = Batch()
    if m.ready:
        for r in m.ready:
            r.phase = Phase.DECODE
            m.context_tokens += r.prompt_tokens + r.generated
            left = r.output_tokens - r.generated
            m.decode_tokens_left += left
            m.inbound_tokens -= left
        batch.joined = m.ready
        m.running.extend(m.ready)
        m.ready = []
    queue = m.prompt_queue
    budget = prompt_budget(cfg, len(m.running))
    requeue: list[Request] = []
    while queue:
        head = queue[0]
        remaining = head.prefill_len - head.prefilled
        n = prompt_take(cfg, remaining, budget, first=not batch.prompts)
        if n == 0:
            break
        if head.prefilled == 0:               # first chunk: reserve its KV
            need = prefill_reservation(m, head)
            if need > m.kv_free and not _preempt_for(m, need, cfg.preemption_limit, batch):
                break
            m.kv_used += need
            head.phase = Phase.PREFILL
        queue.popleft()
        batch.prompts.append(head)
        batch.chunks.append(n)
        batch.prompt_tokens += n
        budget -= n
        m.queued_prompt_tokens -= n
        if head.prefilled + n < head.prefill_len:
            requeue.append(head)              # chunked: the rest waits at the head of the queue
    for v in batch.preempted:                 # recompute soon, before younger prompts
        queue.appendleft(v)
        v.phase = Phase.QUEUED
        v.prefilled = 0
        m.queued_prompt_tokens += v.prefill_len
        m.pending += v.prefill_len
    for r in reversed(requeue):               # a prefill in progress holds its KV: it stays first,
        queue.appendleft(r)                   # or a waiter ahead of it could wait for it forever
    if not batch.prompts and not m.running:
        return None
    m.running_prompt_tokens = batch.prompt_tokens
    batch.decodes = len(m.running)
    batch.context = m.context_tokens
    return batch


def finish_iteration(m: Machine, batch: Batch) -> IterationResult:
    """Account for one finished iteration: every running decode produced a token, prefills that
    completed produced one too. Returns who got a first token and who finished. Requests whose
    prefill finished and that decode elsewhere are left for the caller to hand off."""
    finished: list[Request] = []
    running = m.running
    if running:
        keep: list[Request] = []
        for r in running:
            r.generated += 1
            if r.generated == r.output_tokens:
                finished.append(r)
            else:
                keep.append(r)
        m.context_tokens += len(running)
        m.decode_tokens_left -= len(running)
        m.pending -= len(running)
        if finished:
            for r in finished:
                r.phase = Phase.DONE
                m.kv_used -= decode_reservation(m, r)
                m.context_tokens -= r.prompt_tokens + r.generated
            m.running = keep
    first: list[Request] = []
    for r, n in zip(batch.prompts, batch.chunks):
        r.prefilled += n
        if r.prefilled < r.prefill_len:
            continue
        r.generated += 1
        first.append(r)
        if r.generated == r.output_tokens:
            r.phase = Phase.DONE
            m.kv_used -= prefill_reservation(m, r)
            finished.append(r)
        elif r.token_machine == m.id:
            r.phase = Phase.DECODE
            m.running.append(r)
            m.context_tokens += r.prompt_tokens + r.generated
            m.decode_tokens_left += r.output_tokens - r.generated
            m.pending += r.output_tokens - r.generated
        else:
            r.phase = Phase.HANDOFF
    m.pending -= m.running_prompt_tokens
    m.running_prompt_tokens = 0
    return IterationResult(first, finished)


def release_prompt_kv(m: Machine, r: Request) -> None:
    """The prompt machine's copy of `r`'s KV has been sent: free it."""
    m.kv_used -= prefill_reservation(m, r)


def reserve_decode(m: Machine, r: Request) -> bool:
    """Token side: reserve all of `r`'s KV on `m` before its prompt may start elsewhere (FCFS
    behind earlier waiters). False: `r` waits in `m.admit_queue`, holding no memory anywhere,
    until `admit_waiting` admits it. Reserving first means a prompt machine never holds KV that
    has nowhere to go, so no two machines can wait on each other's memory."""
    if not m.admit_queue and decode_reservation(m, r) <= m.kv_free:
        _reserve(m, r)
        return True
    m.admit_queue.append(r)
    m.queued_decode_tokens += r.output_tokens - r.generated
    m.pending += r.output_tokens - r.generated
    return False


def _reserve(m: Machine, r: Request) -> None:
    m.kv_used += decode_reservation(m, r)
    m.inbound_tokens += r.output_tokens - 1      # all but the first token, made by the prompt side
    m.pending += r.output_tokens - 1
    r.kv_on_token_machine = True


def admit_waiting(m: Machine) -> list[Request]:
    """Memory freed on `m`: reserve for waiting requests in FCFS order; returns those admitted
    (their prompts may be queued now)."""
    admitted: list[Request] = []
    q = m.admit_queue
    while q and decode_reservation(m, q[0]) <= m.kv_free:
        r = q.popleft()
        m.queued_decode_tokens -= r.output_tokens - r.generated
        m.pending -= r.output_tokens - r.generated
        _reserve(m, r)
        admitted.append(r)
    return admitted

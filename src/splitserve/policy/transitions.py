"""Every state transition of a request on a machine, and the only code that changes a machine's
counters. The simulator (through form_batch / finish_iteration and its events), the live router
(through its view of the cluster, serve/cluster_state.py) and each live worker's engine (through
its view of itself, engine/scheduler.py) all call these same functions; nothing else does
arithmetic on `Machine` state (docs/architecture.md shows where each is called from).

A request's life on its machines:

    prompt side   enqueue_prompt -> start_chunk -> end_chunk (... more chunks) -> first_token
    token side    reserve_decode (or wait: admit_waiting later) -> join_decode (its KV landed;
                  kv_arrived in a token engine's view of itself) -> start_decode -> decode_tokens
                  ... (its last token frees its KV); on demand grow_decode before each step
    preempted     preempt -> requeue_preempted (in place) or leave_preempted, then admitted again
                  through the prompt pool (policy/cluster.py readmit)
    hand-over     first_token leaves it in HANDOFF on the prompt machine; kv_landed frees the
                  prompt machine's copy and joins it on the token machine
    early end     release (policy/release.py): undo whatever it holds
    sized by a scheduler (ecoserve, policy/sized_kv.py)  plan_kv -> first_token -> park_decode ->
                  resume_decode -> grow_kv / park_decode again / preempt; drop_waiting

Together with policy/sized_kv.py and policy/release.py this is all the counter arithmetic.
`pending` (the JSQ queue length) is the sum of five counters and moves with them; `isolated`
counts the isolated requests a machine holds, so that batching keeps them alone (policy/machine.py).
"""

from __future__ import annotations

from .kv_allocation import admission_kv, can_reserve, decode_reservation, prefill_reservation
from .state import Machine, Phase, Request


# ---- prompt side ---------------------------------------------------------------------------------
def enqueue_prompt(m: Machine, r: Request) -> None:
    """`r` joins the tail of `m`'s prompt queue (FCFS)."""
    r.phase = Phase.QUEUED
    r.prefilled = 0
    m.prompt_queue.append(r)
    m.queued_prompt_tokens += r.prefill_len
    m.pending += r.prefill_len
    if r.isolated:
        m.isolated += 1


def start_chunk(m: Machine, r: Request, n: int) -> None:
    """A chunk of `n` prefill tokens of `r` starts on `m` (its whole prefill when not chunked); the
    first chunk reserves `r`'s KV here. `r` is out of the queue while the chunk runs."""
    q = m.prompt_queue
    if q and q[0] is r:
        q.popleft()
    else:
        q.remove(r)
    if r.prefilled == 0:
        need = prefill_reservation(m, r)
        m.kv_used += need
        if m.kv_on_demand and r.token_machine == m.id:
            r.kv_held = need
        r.phase = Phase.PREFILL
    r.chunk = n
    m.queued_prompt_tokens -= n
    m.running_prompt_tokens += n


def end_chunk(m: Machine, r: Request) -> bool:
    """`r`'s running chunk is done. True when its prefill is complete (first_token follows); else
    the rest waits at the head of the queue: a prefill in progress holds its KV, so no waiter may
    overtake it (it could wait for that KV forever)."""
    n, r.chunk = r.chunk, 0
    r.prefilled += n
    m.running_prompt_tokens -= n
    m.pending -= n
    if r.prefilled < r.prefill_len:
        m.prompt_queue.appendleft(r)
        return False
    return True


def first_token(m: Machine, r: Request) -> bool:
    """`r`'s prefill is complete on `m` and made its next token (the first, or the next one after a
    recompute). True when that was its last: it is done and its KV here is free. Else it decodes
    here, or waits in HANDOFF until its KV has reached its token machine (kv_landed)."""
    r.generated += 1
    if r.generated == r.output_tokens:
        r.phase = Phase.DONE
        m.kv_used -= prefill_reservation(m, r)
        if m.kv_on_demand and r.token_machine == m.id:
            r.kv_held = 0
        if r.isolated:
            m.isolated -= 1
        return True
    if r.token_machine == m.id:
        run_decode(m, r)
    else:
        r.phase = Phase.HANDOFF
        if r.isolated:
            m.isolated -= 1
    return False


def release_prompt_kv(m: Machine, r: Request) -> None:
    """The prompt machine's copy of `r`'s KV has been sent (or dropped): free it."""
    m.kv_used -= prefill_reservation(m, r)


def kv_landed(p: Machine, t: Machine, r: Request) -> None:
    """`r`'s KV has reached its token machine `t`: `p` frees its copy, `r` joins `t`'s next batch."""
    release_prompt_kv(p, r)
    join_decode(t, r)


# ---- token side ----------------------------------------------------------------------------------
def reserve_decode(m: Machine, r: Request, wait: bool = True, first: bool = False) -> bool:
    """Token side: reserve `r`'s KV on `m` before its prompt may start elsewhere (FCFS behind
    earlier waiters; `first`: ahead of them, a decode preempted and sent back through the prompt
    pool, as vLLM puts preempted requests first). False: `r` waits in `m.admit_queue` (or, with
    `wait` False, is not taken), holding no memory anywhere, until `admit_waiting` admits it.
    Reserving first means a prompt machine never holds KV that has nowhere to go, so no two
    machines can wait on each other's memory."""
    if (first or not m.admit_queue) and can_reserve(m, r):
        _reserve(m, r)
        return True
    if wait:
        if first:
            m.admit_queue.appendleft(r)
        else:
            m.admit_queue.append(r)
        m.queued_decode_tokens += r.output_tokens - r.generated
        m.pending += r.output_tokens - r.generated
    return False


def _reserve(m: Machine, r: Request) -> None:
    need = admission_kv(m, r)
    m.kv_used += need
    if m.kv_on_demand:
        r.kv_held = need
    left = inbound(r)
    m.inbound_tokens += left
    m.pending += left
    r.kv_on_token_machine = True


def inbound(r: Request) -> int:
    """Tokens `r`, reserved on its token machine, will make there once its KV lands: all it has left
    but the one its prefill makes on the prompt side (made already: HANDOFF, or landed: READY; a
    request resumed after a preemption has made some before)."""
    return r.output_tokens - r.generated - (0 if r.phase is Phase.HANDOFF or r.phase is Phase.READY else 1)


def admit_waiting(m: Machine) -> list[Request]:
    """Memory freed on `m`: reserve for waiting requests in FCFS order; returns those admitted
    (their prompts may be queued now)."""
    admitted: list[Request] = []
    q = m.admit_queue
    while q and can_reserve(m, q[0]):
        r = q.popleft()
        m.queued_decode_tokens -= r.output_tokens - r.generated
        m.pending -= r.output_tokens - r.generated
        _reserve(m, r)
        admitted.append(r)
    return admitted


def join_decode(m: Machine, r: Request) -> None:
    """`r`'s KV is in place on `m` (its memory reserved): it decodes from the next iteration."""
    r.phase = Phase.READY
    m.ready.append(r)
    if r.isolated:
        m.isolated += 1


def kv_arrived(m: Machine, r: Request) -> None:
    """A token machine's view of itself (an engine's, which never sees the prompt machine):
    reserved `r`'s KV and the token its prefill made elsewhere arrived; it decodes from the next
    iteration (as first_token on its prompt machine, then join_decode, in a view of both)."""
    r.generated += 1
    join_decode(m, r)


def start_decode(m: Machine, r: Request) -> None:
    """Ready `r` enters `m`'s decode batch."""
    m.ready.remove(r)
    _join(m, r)


def start_decodes(m: Machine) -> list[Request]:
    """Every ready request enters `m`'s decode batch; returns them."""
    joined, m.ready = m.ready, []
    for r in joined:
        _join(m, r)
    return joined


def _join(m: Machine, r: Request) -> None:
    left = r.output_tokens - r.generated
    m.inbound_tokens -= left
    m.pending -= left
    run_decode(m, r)


def run_decode(m: Machine, r: Request) -> None:
    r.phase = Phase.DECODE
    left = r.output_tokens - r.generated
    m.running.append(r)
    m.context_tokens += r.prompt_tokens + r.generated
    m.decode_tokens_left += left
    m.pending += left


def decode_tokens(m: Machine, rs: list[Request], k: int = 1) -> list[Request]:
    """Each running decode in `rs` made `k` tokens (at most what it had left). Returns those that
    made their last: they are done, out of the batch, and their KV is free."""
    done: list[Request] = []
    for r in rs:  # the simulator's hottest loop: one token each, most of the time
        g = r.generated + k
        r.generated = g
        if g >= r.output_tokens:
            done.append(r)
    made = k * len(rs)
    for r in done:  # made more than it had left: it made what it had left
        made -= r.generated - r.output_tokens
        r.generated = r.output_tokens
    m.context_tokens += made
    m.decode_tokens_left -= made
    m.pending -= made
    if done:
        for r in done:
            end_decode(m, r)
        m.running = [r for r in m.running if r.phase is Phase.DECODE]
    return done


def end_decode(m: Machine, r: Request) -> None:
    """`r` leaves `m`'s decode batch, with its KV (the caller takes it out of `m.running`)."""
    r.phase = Phase.DONE
    m.kv_used -= decode_reservation(m, r)
    r.kv_held = 0
    m.context_tokens -= r.prompt_tokens + r.generated
    m.decode_tokens_left -= r.output_tokens - r.generated
    m.pending -= r.output_tokens - r.generated
    if r.isolated:
        m.isolated -= 1


def grow_decode(m: Machine, r: Request) -> None:
    """On demand: running decode `r` takes the KV its next step writes (the blocks of its prompt and
    every token made so far, the last one's written by this step; policy/preemption.py decides)."""
    need = m.kv_round(r.prompt_tokens + r.generated) - r.kv_held
    if need > 0:
        m.kv_used += need
        r.kv_held += need


def preempt(m: Machine, r: Request) -> None:
    """Running decode `r` loses its KV on `m` to make room; it is recomputed later
    (requeue_preempted, once the iteration that preempted it has been formed)."""
    m.running.remove(r)
    end_decode(m, r)
    r.preemptions += 1
    r.kv_on_token_machine = False


def requeue_preempted(m: Machine, r: Request) -> None:
    """Preempted `r` waits at the head of `m`'s prompt queue: it recomputes its prompt and what it
    had generated, ahead of younger prompts."""
    r.phase = Phase.QUEUED
    r.prefilled = 0
    r.prompt_machine = m.id  # its prefill runs here now
    m.prompt_queue.appendleft(r)
    m.queued_prompt_tokens += r.prefill_len
    m.pending += r.prefill_len
    if r.isolated:
        m.isolated += 1


def leave_preempted(r: Request) -> None:
    """Preempted `r` leaves the machine that decoded it for the prompt pool (`recompute`
    prompt-pool): holding nothing, it waits to be admitted again as at its arrival
    (policy/cluster.py readmit), its prefill its prompt and what it had generated."""
    r.phase = Phase.QUEUED
    r.prefilled = 0

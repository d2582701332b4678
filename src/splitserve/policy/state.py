"""Request and machine state shared by the simulator and the live router.

Plain mutable objects with slots: the policies read and update them, the simulator drives them
with a virtual clock and the server with the wall clock. Nothing here knows about time sources,
events, sockets or tensors.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Pool(IntEnum):
    PROMPT = 0
    TOKEN = 1
    MIXED = 2


class Phase(IntEnum):
    QUEUED = 0        # waiting in a machine's prompt queue (first prefill or recompute after preemption)
    PREFILL = 1       # its prefill has started (a chunk runs, or the rest waits at the queue's head)
    HANDOFF = 2       # first token out, KV on its way to the token machine
    DECODE = 3        # in a machine's decode batch
    DONE = 4
    READY = 5         # KV landed on the token machine; it joins the decode batch at the next iteration
    WAITING = 6       # prefilled, holding its KV, in its machine's decode queue until the machine-level
                      # scheduler starts its decode (ecoserve's generation-task queue)


@dataclass(slots=True, eq=False, init=False)  # __init__ below: see its docstring
class Request:
    id: int
    arrival: float
    prompt_tokens: int
    output_tokens: int                 # tokens to generate, the first token included
    generated: int
    prefilled: int                     # tokens of the current prefill already computed (chunked prefill)
    phase: Phase
    prompt_machine: int
    token_machine: int
    preemptions: int
    kv_on_token_machine: bool          # token-side KV reserved (it may be prefilled and sent)
    chunk: int                         # prefill tokens of its chunk running now (0: none)
    isolated: bool                     # runs in iterations of its own (a suspect: serve/router.py)
    in_flight: bool                    # a decode in a batch still in a pipelined machine's stages
    # timing, filled by whoever drives the policy (simulator or server), seconds
    first_token_at: float
    last_token_at: float
    prompt_started_at: float
    token_times: list[float] | None    # only when a run asks to keep every token time
    ref_tbt: float                     # uncontended reference TBT (SLO slowdowns), seconds
    log_ref: float                     # its logarithm in histogram buckets (sim/metrics.py ref_bucket)
    predicted: int                     # predicted output tokens, the first included (0: none), for the
                                       # policies that schedule by it (policy/predictor.py predict)
    kv_held: int                       # KV tokens it holds on its decode machine when > 0: sized by its
                                       # machine scheduler in place of the prompt + output rule
                                       # (transitions.decode_reservation; ecoserve's), or, allocated
                                       # on demand, the blocks of the tokens it has (kv_allocation.py)
    sched: Any                         # its machine scheduler's own state of it, of that scheduler's
                                       # type (policy/schedulers/base.py; ecoserve's Gen), or None
    blocks: list[int] | None           # its prompt's full blocks' names (policy/prefix_cache.py) where
                                       # caches are modelled or viewed; None: prefix-aware routing skips it
    cached: int                        # prompt tokens its prefill machine's cache gave its current prefill
    cache_key: int                     # its prompt cache key's hash (prefix_routing.cache_key), -1: none

    def __init__(self, id: int, arrival: float, prompt_tokens: int, output_tokens: int, generated: int = 0,
                 prefilled: int = 0, phase: Phase = Phase.QUEUED, prompt_machine: int = -1, token_machine: int = -1,
                 preemptions: int = 0, kv_on_token_machine: bool = False, chunk: int = 0, isolated: bool = False,
                 in_flight: bool = False, first_token_at: float = -1.0, last_token_at: float = -1.0,
                 prompt_started_at: float = -1.0, token_times: list[float] | None = None, ref_tbt: float = 0.0,
                 log_ref: float = 0.0, predicted: int = 0, kv_held: int = 0, sched: Any = None,
                 blocks: list[int] | None = None, cached: int = 0, cache_key: int = -1) -> None:
        """A dataclass's own __init__ runs interpreted under mypyc (about 0.6 us a request against
        0.04 us for this one, compiled): the simulator makes one per arrival."""
        self.id = id
        self.arrival = arrival
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.generated = generated
        self.prefilled = prefilled
        self.phase = phase
        self.prompt_machine = prompt_machine
        self.token_machine = token_machine
        self.preemptions = preemptions
        self.kv_on_token_machine = kv_on_token_machine
        self.chunk = chunk
        self.isolated = isolated
        self.in_flight = in_flight
        self.first_token_at = first_token_at
        self.last_token_at = last_token_at
        self.prompt_started_at = prompt_started_at
        self.token_times = token_times
        self.ref_tbt = ref_tbt
        self.log_ref = log_ref
        self.predicted = predicted
        self.kv_held = kv_held
        self.sched = sched
        self.blocks = blocks
        self.cached = cached
        self.cache_key = cache_key

    @property
    def prefill_len(self) -> int:
        """Tokens the next prefill must compute: the prompt, plus what was generated before a
        preemption (recompute)."""
        return self.prompt_tokens + self.generated

    @property
    def kv_need(self) -> int:
        """KV tokens of this request at its end (prompt and every token it will generate): reserved
        up front on the machine that decodes it (reserve), or the most it grows to (on demand)."""
        return self.prompt_tokens + self.output_tokens


@dataclass(slots=True, eq=False)
class Machine:
    id: int
    hardware: str
    home: Pool                          # the pool it was provisioned for
    kv_capacity: int                    # tokens of KV cache it can hold
    kv_block: int = 1                   # tokens per KV block: reservations are whole blocks (a
                                        # paged cache); 1 models an unpaged cache
    kv_on_demand: bool = False          # how it allocates KV (policy/kv_allocation.py): False reserve
                                        # (prompt + every output token from admission), True on demand
    kv_watermark: int = 0               # on demand: KV tokens an admission leaves free (vLLM's watermark)
    recompute_here: bool = True         # a decode preempted here whose prompt ran elsewhere recomputes
                                        # here (True) or goes back through the prompt pool (False)
    pool: Pool = Pool.PROMPT            # the pool it is in now (MIXED while borrowed or overflowing)
    kv_used: int = 0                    # tokens reserved
    prompt_queue: deque[Request] = field(default_factory=deque)
    admit_queue: deque[Request] = field(default_factory=deque)   # decodes waiting for KV memory
    ready: list[Request] = field(default_factory=list)          # KV in place; join at next iteration
    running: list[Request] = field(default_factory=list)        # the decode batch
    decode_queue: list[Request] = field(default_factory=list)   # prefilled, holding KV, waiting for the
                                                                # scheduler to start their decode (WAITING)
    queued_prompt_tokens: int = 0       # prefill tokens waiting in prompt_queue
    queued_decode_tokens: int = 0       # tokens still to generate by requests in admit_queue or decode_queue
    running_prompt_tokens: int = 0      # prefill tokens in the batch now running
    decode_tokens_left: int = 0         # tokens still to generate by running decodes
    inbound_tokens: int = 0             # tokens to generate by requests reserved here whose KV has
                                        # not arrived yet (prefilling elsewhere, or in transfer)
    pending: int = 0                    # the sum of the five counters above, kept up to date by
                                        # policy/machine.py: the queue length JSQ compares
    context_tokens: int = 0             # KV tokens held by running decodes (drives decode time)
    isolated: int = 0                   # isolated requests here (queued, prefilling, ready or decoding)
    isolated_turn: bool = False         # with isolated requests: whose turn the last iteration was
    stages: int = 1                     # pipeline stages: > 1, batches overlap (each decode in one)
    counts: dict[str, int] | None = None  # a machine-level scheduler's event counts (sized_kv.note)
    sched: Any = None                   # its machine scheduler's own state of it, of that scheduler's
                                        # type (ecoserve's Sizing, in a view another follows), or None
    cache: Any = None                   # the names of the KV blocks it holds (policy/prefix_cache.py
                                        # BlockCache: simulated, or a router's view), or None
    busy: bool = False

    def __post_init__(self) -> None:
        self.pool = self.home

    def recount_pending(self) -> int:
        """Queue length as the cluster scheduler sees it, from its parts (for checks)."""
        return (self.queued_prompt_tokens + self.running_prompt_tokens
                + self.queued_decode_tokens + self.decode_tokens_left + self.inbound_tokens)

    @property
    def queued_tokens(self) -> int:
        """Work waiting to start (not running): what the mixed-pool threshold is compared with."""
        return self.queued_prompt_tokens + self.queued_decode_tokens

    @property
    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_used

    def kv_round(self, tokens: int) -> int:
        """KV tokens that holding `tokens` positions takes: whole blocks."""
        return -(-tokens // self.kv_block) * self.kv_block

    def has_work(self) -> bool:
        return bool(self.prompt_queue or self.running or self.ready or self.decode_queue)

"""Continuous batching: each engine step runs a batch mixing decodes and prefills (or prefill
chunks) under a token budget.

Batch *selection* is the one function `select_batch` (pure: it reads the queues and the block
counts and returns a decision); `Scheduler` carries the decision out (moves sequences between
queues, allocates and frees blocks). A different policy is a different `select` callable with the
same signature, passed to `Scheduler`.

Default policy: running sequences first, oldest first (decodes, and the next chunk of a chunked
prefill); when their new tokens do not fit in the free blocks, the newest running sequences are
preempted (their blocks freed, to be recomputed later). Then waiting sequences in FIFO order while
the budget, `max_num_seqs` and the free blocks allow. Without chunked prefill a prompt runs whole;
one larger than the remaining budget still runs if it is the step's only prefill.

Isolated sequences (suspect requests) never share a step: when a selection holds one and any
other sequence, the Scheduler runs, on alternate such steps, the oldest isolated sequence alone,
then the rest of the selection without the isolated ones. What is left out of a step stays as it
was (a waiting sequence is not admitted, no blocks are appended); the selection's preemptions
are carried out, as they only free room.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Protocol

from .block_manager import BlockManager
from .sequence import Sequence, Status


@dataclass(frozen=True)
class BatchLimits:
    max_num_seqs: int = 256  # sequences holding KV at once
    max_num_batched_tokens: int = 2048  # tokens per step (soft for an unchunked long prompt)
    chunk_size: int | None = None  # chunked prefill: at most this many prompt tokens per step


class BlockView(Protocol):
    num_free: int

    def blocks_needed(self, seq_id: Hashable, num_tokens: int) -> int: ...

    def blocks_released_by(self, seq_id: Hashable) -> int: ...


@dataclass
class Selection:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens)
    preempt: list[Sequence] = field(default_factory=list)


def select_batch(running: list[Sequence], waiting: list[Sequence], limits: BatchLimits,
                 blocks: BlockView) -> Selection:
    sel = Selection()
    budget, free = limits.max_num_batched_tokens, blocks.num_free
    prefill_scheduled = False
    queue = list(running)
    while queue:
        seq = queue.pop(0)
        n = min(seq.num_remaining, limits.chunk_size or seq.num_remaining, budget)
        if n <= 0:
            continue
        need = blocks.blocks_needed(seq.request_id, seq.num_computed + n)
        while need > free and queue:
            victim = queue.pop()
            sel.preempt.append(victim)
            free += blocks.blocks_released_by(victim.request_id)
        if need > free:
            sel.preempt.append(seq)
            continue
        free -= need
        budget -= n
        prefill_scheduled |= n > 1
        sel.scheduled.append((seq, n))
    if sel.preempt:
        return sel  # memory is tight: admit nothing new this step
    num_running = len(running)
    for seq in waiting:
        if num_running >= limits.max_num_seqs or budget <= 0:
            break
        n = seq.num_remaining
        if limits.chunk_size:
            n = min(n, limits.chunk_size, budget)
        elif n > budget and prefill_scheduled:
            break
        need = blocks.blocks_needed(seq.request_id, seq.num_computed + n)
        if need > free:
            break
        free -= need
        budget -= n
        prefill_scheduled = True
        num_running += 1
        sel.scheduled.append((seq, n))
    return sel


Select = Callable[[list[Sequence], list[Sequence], BatchLimits, BlockView], Selection]


class Scheduler:
    def __init__(self, blocks: BlockManager, limits: BatchLimits, select: Select = select_batch) -> None:
        self.blocks, self.limits, self.select = blocks, limits, select
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in arrival order
        self.num_preemptions = 0
        self._isolated_turn = True  # the next mixed selection runs its oldest isolated sequence

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence whose blocks are already allocated (imported KV)."""
        seq.status = Status.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)

    def schedule(self) -> tuple[list[tuple[Sequence, int]], list[tuple[int, int]]]:
        """This step's (sequence, new tokens) and the copy-on-write block copies to do first."""
        sel = self.select(self.running, list(self.waiting), self.limits, self.blocks)
        for seq in sel.preempt:
            self.preempt(seq)
        scheduled = self._isolate(sel.scheduled)
        copies: list[tuple[int, int]] = []
        for seq, n in scheduled:
            if seq.status is Status.WAITING:
                self.waiting.remove(seq)
                self.add_running(seq)
            copies += self.blocks.append(seq.request_id, seq.num_computed + n)
        return scheduled, copies

    def _isolate(self, scheduled: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """The part of a selection to run now: all of it, unless it mixes an isolated sequence
        with others; then alternately the oldest isolated one alone and the non-isolated ones."""
        isolated = [sn for sn in scheduled if sn[0].isolated]
        if not isolated or len(scheduled) == 1:
            return scheduled
        others = [sn for sn in scheduled if not sn[0].isolated]
        if others and not self._isolated_turn:
            self._isolated_turn = True
            return others
        self._isolated_turn = False
        return [min(isolated, key=lambda sn: sn[0].arrival)]

    def preempt(self, seq: Sequence) -> None:
        """Free the sequence's blocks; it is recomputed from scratch when readmitted."""
        self.blocks.free(seq.request_id)
        self.running.remove(seq)
        seq.num_computed = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        self.blocks.free(seq.request_id)
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED

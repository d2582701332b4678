"""Which sequences the engine runs in its next step: the simulator's machine-level policy itself.

The Scheduler keeps the policy's view of this engine, one policy `Machine` whose `Request`s shadow
the engine's sequences (KV in tokens, reserved in whole blocks, the capacity the whole cache). A
step is `form_batch` on that view (the scheduler `BatchingConfig.scheduler` names; docs/
architecture.md, "Machine-level schedulers"), carried out on the sequences and their blocks;
`finish_iteration` accounts for it after, and a sequence that ends early is `release`d. The view
changes only through policy/transitions.py, the transitions the simulator and the live router use,
so the router's view follows the engine's from the step `report` a serving worker sends.

What the policy holds, the block manager can always allocate: under reserve a reservation covers
every block the request will take; on demand (policy/kv_allocation.py) each decode's next block is
taken as the step is formed. KV for a request prefilled elsewhere is reserved the same way
(`reserve`; `NoRoom` when it does not fit now). A scheduler that pools KV (ecoserve: a host and
its guests share the host's reservation) has each family's reserved, unwritten blocks set aside
as one pool before each step (`_sync_pools`), so a guest writes into blocks its host reserved.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

from ..errors import UserError
from ..policy.kv_allocation import configure
from ..policy.machine import Batch, BatchingConfig, BatchReport, finish_iteration
from ..policy.schedulers import scheduler_of
from ..policy.state import Machine, Phase, Pool, Request
from ..policy.release import release
from ..policy.transitions import enqueue_prompt, kv_arrived, reserve_decode
from .block_manager import BlockManager
from ..policy.prefix_cache import attachable, extend_hashes
from .sequence import Sequence, Status

HERE, ELSEWHERE = 0, -1  # the engine's machine id in its own view; where a reserved request's prompt ran


class NoRoom(UserError):
    """A reservation for KV about to arrive does not fit now (the router's view thought it would:
    its reports lag the engine); it may fit later."""


def shadow_of(seq: Sequence) -> Request:
    """`seq`'s policy request: set from when the scheduler takes it in (`add`, `reserve`)."""
    if seq.shadow is None:
        raise AssertionError(f"request {seq.request_id!r} was never given to the scheduler")
    return seq.shadow


class Scheduler:
    def __init__(self, blocks: BlockManager, cfg: BatchingConfig = BatchingConfig()) -> None:
        self.blocks, self.cfg = blocks, cfg
        self.sched = scheduler_of(cfg)
        self.m = Machine(HERE, "engine", home=Pool.MIXED, kv_capacity=blocks.num_blocks * blocks.block_size,
                         kv_block=blocks.block_size)
        configure(self.m, cfg)
        self.seqs: dict[int, Sequence] = {}   # policy request id -> sequence
        self._ids = itertools.count()
        self.batch: Batch | None = None       # the step being run
        self.report = BatchReport()
        self.num_preemptions = 0
        self.scheduled: list[tuple[Sequence, int]] = []  # the step being run, as the engine runs it
        self.prefix_queries = self.prefix_hits = 0  # prompt tokens looked up in / found in the prefix cache
        self.sched.record(self.m)             # form_batch records what it reports beyond the batch

    def _shadow(self, seq: Sequence, predicted: int = 0, prompt_machine: int = HERE) -> Request:
        out = min(seq.params.max_tokens, seq.max_len - len(seq.prompt_ids))
        r = Request(next(self._ids), float(seq.arrival), len(seq.prompt_ids), out, generated=len(seq.output_ids),
                    prompt_machine=prompt_machine, token_machine=-1 if seq.prefill_only else HERE,
                    isolated=seq.isolated, predicted=predicted)
        seq.shadow = r
        self.seqs[r.id] = seq
        return r

    # ---- requests in -----------------------------------------------------------------------------
    def add(self, seq: Sequence, predicted: int = 0) -> None:
        """A new request whose prompt runs here (`predicted`: its predicted output tokens, for a
        scheduler that reserves by them; 0: none)."""
        seq.status = Status.WAITING
        enqueue_prompt(self.m, self._shadow(seq, predicted=predicted))

    def reserve(self, seq: Sequence) -> None:
        """Hold KV for `seq`, prefilled elsewhere, before its KV arrives (what the policy takes for it:
        its whole decode's under reserve, its prompt's and first token's blocks on demand); NoRoom
        when it does not fit now."""
        r = self._shadow(seq, prompt_machine=ELSEWHERE)
        if not reserve_decode(self.m, r, wait=False):
            del self.seqs[r.id]
            raise NoRoom(f"no room in the KV cache for a {r.prompt_tokens}-token prompt and "
                         f"{r.output_tokens} tokens ({self.m.kv_free} of {self.m.kv_capacity} tokens free)")

    def arrived(self, seq: Sequence) -> None:
        """`seq`'s KV and first token (made where its prompt ran) arrived: it decodes from the next step."""
        seq.status = Status.RUNNING
        kv_arrived(self.m, shadow_of(seq))

    # ---- views -----------------------------------------------------------------------------------
    @property
    def waiting(self) -> list[Sequence]:
        """Sequences whose prefill has not started (new, or preempted), in queue order."""
        return [self.seqs[r.id] for r in self.m.prompt_queue if r.phase is Phase.QUEUED]

    @property
    def running(self) -> list[Sequence]:
        """Sequences that hold KV here and run: prefilling, ready to decode or decoding."""
        return sorted((s for s in self.seqs.values()
                       if shadow_of(s).phase in (Phase.PREFILL, Phase.READY, Phase.DECODE, Phase.WAITING)),
                      key=lambda s: s.arrival)

    # ---- a step ----------------------------------------------------------------------------------
    def has_work(self) -> bool:
        m = self.m
        return bool(m.prompt_queue or m.running or m.ready or m.decode_queue)

    def schedule(self) -> tuple[list[tuple[Sequence, int]], list[tuple[int, int]]]:
        """This step's (sequence, new tokens) and the copy-on-write block copies to do first."""
        batch = self.batch = self.sched.form_batch(self.m, self.cfg)
        rep = self.report = BatchReport()
        seqs = self.seqs
        rep.sched = self.sched.report(self.m, lambda r: seqs[r.id].request_id)
        if batch is None:
            return [], []
        # before the preempted leave: the last to join may be preempted in the step it joins, and
        # the router's view, as form_batch did, starts its decode and then preempts it
        rep.joined = [seqs[r.id].request_id for r in batch.joined]
        rep.grown = [seqs[r.id].request_id for r in batch.grown]
        for r in batch.preempted:
            seq = seqs[r.id]
            self.blocks.free(seq.request_id)
            seq.num_computed = seq.registered = 0
            seq.preemptions += 1
            seq.status = Status.WAITING
            self.num_preemptions += 1
            rep.preempted.append(seq.request_id)
            if r.prompt_machine != HERE:   # it recomputes through the prompt pool: it leaves this engine
                del seqs[r.id]
                seq.status, seq.finish_reason = Status.FINISHED, "preempted"
                rep.left.append(seq.request_id)
        scheduled = [(seqs[r.id], 1) for r in batch.decoding]
        rep.decoding = [s.request_id for s, _ in scheduled]
        for r, n in zip(batch.prompts, batch.chunks):
            seq = seqs[r.id]
            seq.status = Status.RUNNING
            rep.chunks.append((seq.request_id, n))  # the policy's chunk: its view's KV ends where the engine's does
            if (seq.num_computed == 0 and self.blocks.caching and not self.blocks.has(seq.request_id)
                    and seq.params.prompt_logprobs is None):  # scored prompts are computed whole
                n -= self.attach_cached(seq, n)
                rep.cached.append((seq.request_id, seq.num_cached))
            scheduled.append((seq, n))
        self.scheduled = scheduled
        copies: list[tuple[int, int]] = []
        if self.sched.pools_kv:
            pools = self._sync_pools()
            for seq, n in scheduled:
                copies += self.blocks.append(seq.request_id, seq.num_computed + n, pools.get(seq.request_id))
            return scheduled, copies
        for seq, n in scheduled:
            copies += self.blocks.append(seq.request_id, seq.num_computed + n)
        return scheduled, copies

    def _sync_pools(self) -> dict[str, str]:
        """Set each family's pool to its reserved, unwritten blocks (a scheduler that pools KV, as
        ecoserve: its members' kv_held less their blocks); returns the pool of each of their sequences."""
        bs, blocks = self.blocks.block_size, self.blocks
        want: dict[Hashable, int] = {}   # a pool's key (its holder's request id) -> blocks
        pool_of: dict[str, str] = {}
        kv_pool = self.sched.kv_pool
        for seq in self.seqs.values():
            r = shadow_of(seq)
            if not r.kv_held or r.phase not in (Phase.PREFILL, Phase.DECODE, Phase.WAITING):
                continue
            holder = kv_pool(r)
            if holder is None:
                raise AssertionError(f"{type(self.sched).__name__} pools KV but gave {seq.request_id!r} no pool")
            key = self.seqs[holder.id].request_id
            pool_of[seq.request_id] = key
            have = len(blocks.block_table(seq.request_id)) if blocks.has(seq.request_id) else 0
            want[key] = want.get(key, 0) + r.kv_held // bs - have
        pools = blocks.pools.sizes()
        for pool, n in pools.items():   # shrink first: the free list then has room to grow others
            if want.get(pool, 0) < n:
                blocks.pools.set(pool, max(want.get(pool, 0), 0))
        for pool, n in want.items():
            if n < 0:
                raise AssertionError(f"family of {pool!r} wrote {-n} blocks more than it holds")
            if n > blocks.pools.size(pool):
                blocks.pools.set(pool, n)
        return pool_of

    def attach_cached(self, seq: Sequence, n: int) -> int:
        """A prompt starting with a chunk of `n` tokens: attach its longest cached prefix, less
        than `n` tokens in whole blocks (the chunk computes one at least: the last prompt token's
        logits make the first output); the tokens it saves."""
        bs = self.blocks.block_size
        hashes = extend_hashes(seq.block_hashes, seq.token_slice(0, n), bs)  # a restart's chunk has its outputs too
        hits = self.blocks.cache.lookup(hashes)
        hits = hits[:attachable(len(hits), n, bs)]
        self.prefix_queries += len(seq.prompt_ids)
        saved = len(hits) * bs
        self.prefix_hits += saved
        seq.num_cached = min(saved, len(seq.prompt_ids))  # a restart's saved outputs are not its prompt's
        if not hits:
            return 0
        self.blocks.attach(seq.request_id, hits)
        seq.num_computed, seq.registered = saved, len(hits)
        return saved

    def _register(self) -> None:
        """Name the blocks the step filled (K/V written), so that later prompts may share them."""
        blocks, bs = self.blocks, self.blocks.block_size
        for seq, _ in self.scheduled:
            full = seq.num_computed // bs
            if full <= seq.registered or not blocks.has(seq.request_id):
                continue
            hashes = extend_hashes(seq.block_hashes, seq.token_slice(0, full * bs), bs)
            table = blocks.block_table(seq.request_id)
            for i in range(seq.registered, full):
                blocks.cache.register(table[i], hashes[i])
            seq.registered = full

    def step_done(self) -> None:
        """The step ran: every decode made a token, every completed prefill made one."""
        if self.blocks.caching:
            self._register()
        self.scheduled = []
        if self.batch is not None:
            finish_iteration(self.m, self.batch)
            self.batch = None

    def finish(self, seq: Sequence) -> None:
        """`seq` leaves this engine (done, stopped early, handed over, aborted): its KV is freed."""
        r = seq.shadow
        if r is not None:
            release(r, self.m, self.m)
            self.seqs.pop(r.id, None)
        self.blocks.free(seq.request_id)
        if self.sched.pools_kv:
            self.blocks.pools.set(seq.request_id, 0)   # its guests' go on in the next host's pool
        seq.status = Status.FINISHED

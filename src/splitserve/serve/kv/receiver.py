"""The token worker's end of a KV transfer: `KVReceiver`, the receiving half of the worker's KV
connector (engine/kv_connector.py).

- `expect` (the router's `expect`): reserve room now, before any byte is sent, through the
  engine's `reserve_kv` (the scheduler's policy reservation); it returns the fields of the
  `reserved` answer that tell a writer where to write (one-sided: the block ids).
- `handle` takes each KV message as it lands: a typed message (messages.py: KvStart, KvLayer,
  KvDone, KvDrop); a malformed one is dropped and counted by reason (`malformed`), never raised.
  tcp: the K/V bytes in a `kvl` / serialized `kvd` are written with the engine's `write_kv_layer`;
  one-sided: they are already in the blocks (`inplace`). Once every layer is in (`kvd`), the
  engine hears it from `get_finished` ("loaded"), starts decoding, and answers `load_started`,
  upon which the router gets `kv_in` (or `kv_fail` if the request could not start).
- The deadline is progress-based: `start_s` (default max(30 s, 6 x the timeout)) for the prompt
  worker to begin, then the timeout from the latest sign of progress (a `kvs` that the sender puts
  out as each step of the prompt starts, a layer). A reservation past its deadline is reported
  (`kv_fail`, by `expire`), so a peer that dies mid-transfer leaks nothing on either side (the
  prompt worker's engine freed its blocks when the prefill ended).
- Freeing: the engine frees a reservation's blocks when `get_finished` lists it as "freed". On tcp
  that is at once (timeout, failure, `release`). On a one-sided transport a writer (the prompt
  worker the router named in `expect`'s `src`) might still be writing into them (stalled, not
  dead), so they are held (`held`) until it cannot write any more: its `kvd`/`kvx` for the
  request, the router's word that the prefill was never sent (`abort` with `prefill_sent` false)
  or that the writer is down (`peer_down`); after `hold_s` (default max(30 s, 6 x the timeout))
  they are freed regardless, and counted (`forced`): a writer stalled that long could still write
  into reused blocks, a risk bounded only by that time.

Per transfer: bytes, seconds (first byte put -> last byte in) and the non-overlapped part
(prefill end -> last byte in), reported to the router in `kv_in`. Times are wall-clock
(`time.time()`) stamps from both hosts: across hosts they include the clock offset. `stray`
counts KV messages for no live reservation (late, after a timeout or abort).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...engine.kv_connector import KVFinished, TokenSideOnly
from ...errors import UserError
from ..messages import KV, KvDone, KvDrop, KvFail, KvIn, KvLayer, KvStart, MalformedMessage, Message, decode
from ..messages.kinds import KvMode

if TYPE_CHECKING:
    from ...engine.kv_connector import KVHost



def _as_kv(buf, dtype, shape: tuple[int, ...]):
    """A data frame as a `shape` tensor of `dtype`: bytes (tcp: copied out of the message), or a
    tensor a collective transport received (collective.py: as it is); None if it does not fit."""
    import torch

    if isinstance(buf, torch.Tensor):
        return buf if buf.dtype == dtype and tuple(buf.shape) == tuple(shape) else None
    if memoryview(buf).nbytes != math.prod(shape) * dtype.itemsize:
        return None
    return torch.frombuffer(bytearray(buf), dtype=dtype).view(shape)


@dataclass(slots=True)
class Inbound:
    rid: str
    num_tokens: int
    deadline: float
    writer: int | None = None  # the prompt worker the router named (one-sided: it writes the blocks)
    skip: int = 0              # leading prompt tokens already held (prefix cache): positions skip.. come
    got: set = field(default_factory=set)
    nbytes: int = 0
    sent_at: float = 0.0


@dataclass(slots=True)
class Held:
    """Blocks of a dropped one-sided transfer whose writer may still write into them."""

    writer: int | None
    until: float  # monotonic: freed then whatever happens


@dataclass(slots=True)
class Landed:
    """Every layer is in; the engine has not started the request yet. The figures of `kv_in`."""

    first: int
    mode: KvMode
    nbytes: int
    seconds: float
    exposed: float
    lp: list | None = None  # the first token's logprob records (KvDone's), for the router
    skipped: int = 0        # leading prompt tokens not sent (this worker's prefix cache had them)


class KVReceiver(TokenSideOnly):
    """The token side of the worker's connector (see the module docstring). `notify` gets each
    `kv_in` / `kv_fail` message for the router (KvIn / KvFail), as it happens."""

    def __init__(self, timeout_s: float, one_sided: bool = False, hold_s: float | None = None,
                 start_s: float | None = None, notify: Callable[[KvIn | KvFail], None] | None = None) -> None:
        self.timeout_s, self.one_sided = timeout_s, one_sided
        # how long a reservation waits for its prompt worker's first step (queueing included)
        self.start_s = start_s if start_s is not None else max(30.0, 6 * timeout_s)
        self.hold_s = hold_s if hold_s is not None else max(30.0, 6 * timeout_s)
        self.notify = notify if notify is not None else (lambda ev: None)
        self.inbound: dict[str, Inbound] = {}
        self.held: dict[str, Held] = {}
        self.landed: dict[str, Landed] = {}
        self._starting: dict[str, Landed] = {}  # landed, reported to the engine, not answered yet
        self._freed: list[str] = []  # for the engine's next get_finished
        self.stray = 0   # KV messages for no live reservation (late, after a timeout or abort)
        self.forced = 0  # held blocks freed at hold_s without the writer's word
        self.malformed: Counter[str] = Counter()  # rejected KV messages, by reason ("kvl.layer", ...)

    @property
    def _host(self) -> KVHost:
        """The engine's host, bound before any other call (KVConnector.bind)."""
        host = self.host
        assert host is not None, "the connector is not bound to an engine"
        return host

    # ---- the router's word --------------------------------------------------------------------
    def expect(self, rid: str, prompt_ids: list[int], params, writer: int | None = None,
               isolated: bool = False, resumed: int = 0) -> dict:
        """Reserve room now (the last `resumed` ids are outputs made before a preemption); the
        `reserved` answer's fields that tell a writer where to write ({"blocks": ids} one-sided)
        and from which prompt position ({"skip": n}: the tokens before it are in this worker's
        prefix cache already). UserError when it does not fit."""
        host = self._host
        blocks = host.reserve_kv(prompt_ids, params, rid, isolated, resumed)
        skip = host.kv_cached(rid)
        self.inbound[rid] = Inbound(rid, len(prompt_ids), time.monotonic() + max(self.start_s, self.timeout_s), writer,
                                    skip=skip)
        return {"blocks": blocks, "skip": skip} if self.one_sided else {"skip": skip}

    def release(self, rid: str, prefill_sent: bool = True) -> bool:
        """The router dropped the request (abort, cancel). `prefill_sent`: its prompt worker was
        given the blocks (so, one-sided, it may still write into them until it says so)."""
        inb = self.inbound.get(rid)
        if inb is not None:
            self._drop(inb, prefill_sent)
            return True
        if rid in self.landed:  # complete, not started yet: its writer is done
            return self._free(rid)
        if rid in self.held and not prefill_sent:
            return self._free(rid)
        return False

    def peer_down(self, peer: int) -> None:
        """`peer` is dead: it writes nothing any more. Free what waited on it (the router restarts
        its requests)."""
        for rid in [r for r, h in self.held.items() if h.writer == peer]:
            self._free(rid)
        for rid in [r for r, i in self.inbound.items() if i.writer == peer and self.one_sided]:
            self._free(rid)

    # ---- freeing ------------------------------------------------------------------------------
    def _free(self, rid: str) -> bool:
        self.inbound.pop(rid, None)
        self.held.pop(rid, None)
        self.landed.pop(rid, None)
        self._freed.append(rid)
        return True

    def _drop(self, inb: Inbound, may_write: bool) -> None:
        """Stop waiting for `inb`: free its blocks, or hold them while a one-sided writer may still
        write into them."""
        del self.inbound[inb.rid]
        if self.one_sided and may_write:
            self.held[inb.rid] = Held(inb.writer, time.monotonic() + self.hold_s)
        else:
            self._freed.append(inb.rid)

    def _fail(self, rid: str, reason: str) -> None:
        self._free(rid)
        self.notify(KvFail(rid=rid, reason=reason))

    # ---- KV messages ---------------------------------------------------------------------------
    def _reject(self, kind: str | None, why: str) -> None:
        self.malformed[f"{kind or '?'}.{why}"] += 1

    def handle(self, header: dict | Message, data: list) -> None:
        """One KV message from a peer (a header from Codec.decode, or a message)."""
        try:
            msg = header if isinstance(header, Message) else decode(header, KV)
        except MalformedMessage as e:
            self._reject(e.kind, e.field or "type")
            return
        assert isinstance(msg, (KvStart, KvLayer, KvDone, KvDrop))  # the kinds of KV (decode checked them)
        rid = msg.rid
        inb = self.inbound.get(rid)
        if inb is None:
            self.stray += 1
            if rid in self.held and isinstance(msg, (KvDone, KvDrop)):
                self._free(rid)  # its writer is done with the blocks
            return
        if isinstance(msg, KvDrop):  # the writer stopped for good (the router aborts or cancels the request)
            self._free(rid)
            return
        inb.deadline = time.monotonic() + self.timeout_s  # progress: a prompt step began, a layer came
        if isinstance(msg, KvLayer):
            self._layer(inb, msg, data)
        elif isinstance(msg, KvDone):
            self._done(inb, msg, data)
        # KvStart: the progress is all

    def _layer(self, inb: Inbound, msg: KvLayer, data: list) -> None:
        host = self._host
        layout = host.kv_layout
        if msg.layer >= layout.num_layers:
            self._reject("kvl", "layer")
            return
        if data:
            kv = _as_kv(data[0], layout.dtype, layout.layer_shape(inb.num_tokens - inb.skip))
            if kv is None:
                self._reject("kvl", "size")
                return
            try:
                host.write_kv_layer(inb.rid, msg.layer, kv, inb.skip)
            except UserError:
                self._reject("kvl", "write")
                return
            inb.nbytes += kv.numel() * kv.element_size()
        elif self.one_sided and msg.inplace_bytes is not None:
            inb.nbytes += msg.inplace_bytes  # already in our blocks
        else:
            self.stray += 1
            return
        inb.got.add(msg.layer)
        inb.sent_at = inb.sent_at or msg.sent_at

    def _done(self, inb: Inbound, msg: KvDone, data: list) -> None:
        rid = inb.rid
        if msg.fail is not None:
            self._fail(rid, f"the prompt worker could not put the KV: {msg.fail}")
            return
        host = self._host
        layout = host.kv_layout
        if data:
            from ...engine.kv_cache import KVExport
            from ..shm import DTYPES

            meta = msg.meta
            shape = (layout.num_layers, *layout.layer_shape(inb.num_tokens - inb.skip))
            whole = None
            if (meta is not None and meta["dtype"] in DTYPES
                    and (meta["num_layers"], 2, meta["num_tokens"], meta["num_kv_heads"], meta["head_dim"]) == shape):
                whole = _as_kv(data[0], DTYPES[meta["dtype"]], shape)
            if whole is None:
                self._fail(rid, "KV shape does not match the request")
                return
            kv = KVExport(whole)
            try:
                for i in range(kv.num_layers):
                    host.write_kv_layer(rid, i, kv.layer(i), inb.skip)
                    inb.got.add(i)
            except UserError as e:
                self._fail(rid, str(e))
                return
            inb.nbytes += whole.numel() * whole.element_size()
        elif self.one_sided and msg.inplace_bytes is not None:
            inb.got.update(range(layout.num_layers))  # every layer written in place
            inb.nbytes += msg.inplace_bytes
        inb.sent_at = inb.sent_at or msg.sent_at
        if len(inb.got) != layout.num_layers:
            self._fail(rid, f"transfer incomplete: {len(inb.got)} of {layout.num_layers} layers arrived")
            return
        del self.inbound[rid]
        now = time.time()
        self.landed[rid] = Landed(msg.first_token, msg.mode, inb.nbytes, max(now - inb.sent_at, 0.0),
                                  max(now - msg.prefill_end, 0.0), msg.lp, inb.skip)

    # ---- deadlines -----------------------------------------------------------------------------
    def expire(self) -> int:
        """Report (`kv_fail`) every reservation past its deadline (the sender died or the link
        failed), and free it (tcp) or hold it until its writer is done (one-sided); free holds
        past hold_s. Returns the number of reservations that timed out."""
        now = time.monotonic()
        late = [i for i in self.inbound.values() if i.deadline < now]
        for inb in late:
            self._drop(inb, may_write=True)
            self.notify(KvFail(rid=inb.rid, reason=f"KV transfer timed out after {self.timeout_s:g} s"))
        for rid in [r for r, h in self.held.items() if h.until < now]:
            self._free(rid)
            self.forced += 1
        return len(late)

    # ---- the contract: scheduler role ------------------------------------------------------
    def get_finished(self) -> KVFinished:
        if not self._freed and not self.landed:
            return KVFinished()
        out = KVFinished([(rid, ld.first) for rid, ld in self.landed.items()], self._freed)
        self._freed = []
        self._starting.update(self.landed)
        self.landed = {}
        return out

    def load_started(self, request_id: str, error: str | None) -> None:
        ld = self._starting.pop(request_id, None)
        if ld is None:
            return
        if error is not None:
            self.notify(KvFail(rid=request_id, reason=error))
        else:
            self.notify(KvIn(rid=request_id, first_token=ld.first, nbytes=ld.nbytes, mode=ld.mode,
                             seconds=ld.seconds, exposed=ld.exposed, lp=ld.lp, skipped=ld.skipped or None))

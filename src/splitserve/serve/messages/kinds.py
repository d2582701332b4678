"""The message kinds: one frozen, slotted, keyword-only dataclass each (its wire name in `T`) and
the records inside them. The table of docs/architecture.md describes every field."""

from __future__ import annotations

from dataclasses import Field, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

from .params import WireParams
from .params import message_class as _msg

KvMode = Literal["layerwise", "serialized"]  # how a transfer's KV went: layer by layer, or whole

# Python attribute -> wire name, for the attributes named differently (the same in every message)
WIRE_NAMES: dict[str, str] = {
    "prompt_ids": "ids", "params": "p", "isolated": "iso", "threshold": "thr", "dest_addr": "addr",
    "kv_addr": "kv", "worker_id": "id", "first_token": "first", "nbytes": "bytes", "sent_at": "sent",
    "prefill_end": "end", "inplace_bytes": "inplace", "predicted": "pred", "resumed": "out",
}


class MalformedMessage(ValueError):
    """A header that is no valid message. `reason`: what is wrong, naming the kind and field;
    `kind`, `field`, `rid`: the message's "t", the field at fault, and its "rid" (a str) where known."""

    def __init__(self, reason: str, kind: str | None = None, field: str | None = None,
                 rid: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.kind, self.field, self.rid = reason, kind, field, rid


# ---- records inside messages -----------------------------------------------------------------
class OutItem(NamedTuple):
    """One request's share of an `out`: its new tokens, whether it finished, and why."""

    rid: str
    tokens: list[int]
    finished: bool
    reason: str | None


class StepChunk(NamedTuple):
    """A prefill chunk that starts in an engine step: the request and its prompt tokens in it."""

    rid: str
    n_tokens: int


class Message:
    """Base of every message class. `T`: the wire name (the header's "t")."""

    __slots__ = ()
    T: ClassVar[str]
    if TYPE_CHECKING:  # every message class is a dataclass (message_class): dataclasses.fields() takes it
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]


# ---- router -> worker ------------------------------------------------------------------------
@_msg
class Gen(Message):
    T: ClassVar[str] = "gen"
    rid: str
    prompt_ids: list[int]
    params: WireParams
    kind: Literal["full", "prefill"]
    isolated: bool = False
    predicted: int | None = None       # the router's predicted output tokens (--machine-scheduler ecoserve)
    dest: int | None = None            # kind prefill: required from here to threshold
    dest_ident: str | None = None
    dest_addr: str | None = None
    threshold: int | None = None
    region: dict | None = None         # kind prefill, one-sided transport
    blocks: list[int] | None = None
    skip: int | None = None            # kind prefill: leading prompt tokens the token worker holds (not sent)
    resumed: int | None = None         # the last ids are outputs made before a preemption (--recompute prompt-pool)


@_msg
class Expect(Message):
    T: ClassVar[str] = "expect"
    rid: str
    prompt_ids: list[int]
    params: WireParams
    src: int
    isolated: bool = False
    resumed: int | None = None         # the last ids are outputs made before a preemption (--recompute prompt-pool)


@_msg
class Cancel(Message):
    T: ClassVar[str] = "cancel"
    rid: str


@_msg
class Abort(Message):
    T: ClassVar[str] = "abort"
    rid: str
    prefill_sent: bool


@_msg
class PeerDown(Message):
    T: ClassVar[str] = "peer_down"
    peer: int


@_msg
class Ping(Message):
    T: ClassVar[str] = "ping"


@_msg
class Stop(Message):
    T: ClassVar[str] = "stop"


# ---- worker -> router ------------------------------------------------------------------------
@_msg
class Hello(Message):
    T: ClassVar[str] = "hello"
    worker_id: int
    pid: int
    kv_addr: str
    blocks: int
    block_size: int
    free: int
    max_len: int
    region: dict | None = None
    boot: str | None = None       # the host's boot id (Linux): the router trusts `step`'s `at` when it is its own


@_msg
class Heartbeat(Message):
    T: ClassVar[str] = "hb"
    worker_id: int
    free: int
    blocks: int
    reserved: int
    running: int
    rejected: int
    stray: int
    preempted: int


@_msg
class Out(Message):
    T: ClassVar[str] = "out"
    items: list[OutItem]
    lp: dict | None = None  # request id -> [its new tokens' logprob records, its prompt's] (those that ask)


@_msg
class Reserved(Message):
    T: ClassVar[str] = "reserved"
    rid: str
    ok: bool
    blocks: list[int] | None = None
    msg: str | None = None
    skip: int | None = None  # leading prompt tokens whose KV this worker's prefix cache holds already
    full: bool | None = None  # not ok only for want of room now (on demand: it may fit later)


@_msg
class KvIn(Message):
    T: ClassVar[str] = "kv_in"
    rid: str
    first_token: int
    nbytes: int
    mode: KvMode
    seconds: float
    exposed: float
    lp: list | None = None  # the first token's logprob records, as KvDone brought them
    skipped: int | None = None  # leading prompt tokens not sent: the token worker's prefix cache had them


@_msg
class KvFail(Message):
    T: ClassVar[str] = "kv_fail"
    rid: str
    reason: str


@_msg
class Err(Message):
    T: ClassVar[str] = "err"
    rid: str
    msg: str


@_msg
class StepFailed(Message):
    T: ClassVar[str] = "step_failed"
    rids: list[str]
    error: str


@_msg
class Step(Message):
    T: ClassVar[str] = "step"
    chunks: list[StepChunk]
    preempted: list[str]
    joined: list[str] = field(default_factory=list)
    sched: list | None = None     # the machine scheduler's own report of the step, left out when None
                                  # (policy/schedulers/base.py MachineScheduler.report; ecoserve's KV sizing)
    at: float | None = None       # the worker's time.perf_counter() when the step was formed
    cached: list[StepChunk] | None = None  # prompts starting: tokens from the prefix cache (left out when none start)
    grown: list[str] | None = None  # on demand: its decodes that took KV for it (left out when none)


# ---- worker -> worker (KV transport) ---------------------------------------------------------
@_msg
class KvStart(Message):
    T: ClassVar[str] = "kvs"
    rid: str


@_msg
class KvLayer(Message):
    T: ClassVar[str] = "kvl"
    rid: str
    layer: int
    sent_at: float
    inplace_bytes: int | None = None


@_msg
class KvDone(Message):
    T: ClassVar[str] = "kvd"
    rid: str
    first_token: int
    prefill_end: float
    mode: KvMode
    sent_at: float
    meta: dict | None = None
    inplace_bytes: int | None = None
    fail: str | None = None
    lp: list | None = None  # [the first token's logprob record, the prompt's records] where asked


@_msg
class KvDrop(Message):
    T: ClassVar[str] = "kvx"
    rid: str


MESSAGE_CLASSES = (Gen, Expect, Cancel, Abort, PeerDown, Ping, Stop,
            Hello, Heartbeat, Out, Reserved, KvIn, KvFail, Err, StepFailed, Step,
            KvStart, KvLayer, KvDone, KvDrop)
MESSAGES: dict[str, type[Message]] = {c.T: c for c in MESSAGE_CLASSES}
TO_WORKER = frozenset(c.T for c in MESSAGE_CLASSES[:7])
TO_ROUTER = frozenset(c.T for c in MESSAGE_CLASSES[7:16])
KV = frozenset(c.T for c in MESSAGE_CLASSES[16:])



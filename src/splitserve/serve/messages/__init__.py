"""The messages between the router and the workers, and between workers (KV), as typed classes.

One frozen dataclass per message kind (kinds.py; the sampling parameters they carry: params.py),
`encode(msg) -> dict` (the header for `Codec.encode`) and `decode(header) -> msg` (from
`Codec.decode`'s header, checked: codec.py, by the checkers of checks.py), and the router's `Stage`
of a request (stage.py, on its own). The modules import one way: params <- kinds <- checks <- codec.
protocol.py signs and verifies the frames; this package says what a header may hold. Every
message, its direction, fields and meaning: the message table of docs/architecture.md.

    frames = codec.encode(encode(Cancel(rid="7.0")), to=ident)            # send
    header, data = codec.decode(frames, sender=...)                       # receive
    msg = decode(header, TO_WORKER)    # MalformedMessage (a ValueError) if it is not a valid one
    match msg:
        case Gen(): ...
        case Cancel(rid=rid): ...
    who = header["_from"]              # the sender's name, where the caller needs it

API
---
* `encode(msg) -> dict`: the header, {"t": msg.T, wire name: value, ...}, optional fields that are
  None left out (TypeError for what is no message). Its values are what msgpack packs: str, int,
  float, bool, lists, maps, and the OutItem / StepChunk tuples (packed as arrays). It shares the
  message's lists (no copy) and does not check them: a message built in-process is trusted (the
  tests check decode(msgpack round trip of encode(m)) == m).
* `decode(header, kinds=None) -> Message`: the message of a header from Codec.decode. Raises
  `MalformedMessage` (a ValueError; `.reason` the text, `.kind`, `.field` and `.rid` where known)
  for: an unknown "t" (reason "unknown type ..."), a kind not in `kinds` where given (e.g.
  TO_WORKER on a worker's control socket; reason "unexpected type ..."), a missing required field,
  an unknown field, a value of the wrong type (bool is not int; an int is accepted as float and
  stored as float; NaN and infinities are refused) or out of range, and gen's per-kind fields.
  The reason names the kind and the field, e.g. "gen: field 'ids': expected a list of
  non-negative ints, got a list with item True", "gen: field 'p.top_k': missing", "hb: field
  'bogus': unknown field". A caller that gets one drops the message (and may answer `err` for
  `.rid`); Codec.decode has already authenticated it, so it is a bug or a version mismatch.
* `MESSAGES` (wire name -> class); `TO_WORKER`, `TO_ROUTER`, `KV`: frozensets of the wire names
  by direction, for decode's `kinds`; `WIRE_NAMES` (attribute -> wire name, where they differ).
* `WireParams.to_wire()` / `params_from_wire(map)` (checked; MalformedMessage of kind "p"):
  the "p" map alone (schema.prepare builds it, the worker turns it into SamplingParams).
* `OutItem(rid, tokens, finished, reason)`, `StepChunk(rid, n_tokens)`: NamedTuples. Step's `sched`
  (a machine scheduler's own report, policy/schedulers/base.py) is a list the codec leaves to the
  scheduler that reads it.
* `Stage`: a StrEnum (str(Stage.DECODE) == "decode"), each member's meaning in its __doc__.

Design choices
--------------
* Unknown fields are refused (a typo in a sender is caught at once; router and workers always
  run the same code), except "_from", which Codec.decode adds: decode ignores it, and a caller
  that needs the sender reads `header["_from"]` (a message object does not carry it, so that
  messages compare equal and a constructed message needs no sender).
* A field that is None on the Python side is left out of the header; decode takes a missing
  optional field or an explicit nil as its default.
* Lists and tuples: msgpack gives lists. Variable-length sequences (prompt_ids, blocks, tokens,
  rids, preempted, joined, items, chunks, stop_token_ids, logit_bias) are stored as lists, as
  msgpack made them (no copy); fixed-shape records are tuples: OutItem and StepChunk (NamedTuples, which msgpack packs
  as arrays, so `out` and `step` encode without touching their items) and logit-bias pairs
  (int, float). A list-valued field with a default (step's joined, p's logit_bias) defaults to
  a new empty list. decode accepts tuples where it takes lists (a tuple sequence becomes a
  list), so decode(encode(m)) == m also without msgpack in between. Messages are immutable (frozen) but
  not hashable where they hold lists.
* Cost: each class's table (_CHECKS: attribute -> checker) is compiled once at import into an
  encoder and a decoder for it (straight-line code: one lookup per field, the common case of each
  check inline, the header's size compared with the fields found to catch unknown ones; objects
  built through their slots, skipping the frozen __init__). Lists of ids are checked at C speed.
"""

from __future__ import annotations

from .codec import decode, encode, params_from_wire
from .kinds import (KV, MESSAGES, TO_ROUTER, TO_WORKER, WIRE_NAMES, Abort, Cancel, Err, Expect, Gen, Heartbeat, Hello,
                    KvDone, KvDrop, KvFail, KvIn, KvLayer, KvStart, MalformedMessage, Message, Out, OutItem, PeerDown,
                    Ping, Reserved, Step, StepChunk, StepFailed, Stop)
from .params import WireParams
from .stage import Stage

__all__ = [
    "KV", "MESSAGES", "TO_ROUTER", "TO_WORKER", "WIRE_NAMES",
    "Abort", "Cancel", "Err", "Expect", "Gen", "Heartbeat", "Hello", "KvDone", "KvDrop", "KvFail", "KvIn",
    "KvLayer", "KvStart", "MalformedMessage", "Message", "Out", "OutItem", "PeerDown", "Ping", "Reserved",
    "Stage", "Step", "StepChunk", "StepFailed", "Stop", "WireParams",
    "decode", "encode", "params_from_wire",
]

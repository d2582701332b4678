"""Encoding and decoding of message headers, checked: per-kind tables of checkers (checks.py),
compiled once at import into straight-line decoders and encoders (see the package docstring's
"Cost")."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from typing import Any, Callable, Container

from .checks import (BadValue, any_list, boolean, int_at_least, integer, kv_meta, logit_bias, logprob_pair,
                     logprob_pairs, mapping, natural, nonneg_number, number, one_of, out_items, positive,
                     step_chunks, text, texts, token_ids, type_name)
from .kinds import (MESSAGE_CLASSES, MESSAGES, WIRE_NAMES, Abort, Cancel, Err, Expect, Gen, Heartbeat, Hello,
                    KvDone, KvDrop, KvFail, KvIn, KvLayer, KvStart, MalformedMessage, Message, Out, PeerDown, Ping,
                    Reserved, Step, StepFailed, Stop)
from .params import WireParams

# A checker's test of the common case, inlined by the decoders (the checker runs only when it
# fails: to convert, as an int to float, or to raise with the reason)
_FAST = {
    text: "type({v}) is str", boolean: "type({v}) is bool", integer: "type({v}) is int",
    natural: "type({v}) is int and {v} >= 0", positive: "type({v}) is int and {v} >= 1",
    number: "type({v}) is float and -_INF < {v} < _INF", nonneg_number: "type({v}) is float and 0.0 <= {v} < _INF",
}


def _sub(wire: str, e: BadValue) -> str:
    return wire if e.field is None else f"{wire}.{e.field}"


def _unknown(h: dict, known: frozenset) -> BadValue:
    return BadValue("unknown field", next(str(k) for k in h if k not in known))


def _decoder(cls: type, checks: dict[str, Callable[[Any], Any]]) -> Callable[[dict], Any]:
    """The function map -> checked instance of `cls` (BadValue naming the field otherwise), compiled
    once from its field table `checks`: a header (or "p" map) is read with one lookup per field,
    the common case of each check inline, then its size tells whether it held an unknown field."""
    if sorted(f.name for f in fields(cls)) != sorted(checks):
        raise AssertionError(f"{cls.__name__}: the checkers do not match the fields")
    header = issubclass(cls, Message)  # a header also holds "t" (and "_from" after Codec.decode)
    ns: dict[str, Any] = {"BadValue": BadValue, "_sub": _sub, "_unknown": _unknown, "_MISS": MISSING, "_INF": math.inf,
                          "cls": cls, "_new": object.__new__}
    required = [f for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    known = {WIRE_NAMES.get(f.name, f.name) for f in fields(cls)} | ({"t", "_from"} if header else set())
    ns["_KNOWN"] = frozenset(known)
    body = ["def dec(h):"]
    n0 = len(required) + header
    body.append(f"    n = {n0} + ('_from' in h)" if header else f"    n = {n0}")
    if required:
        body.append("    try:")
        body += [f"        v_{f.name} = h[{WIRE_NAMES.get(f.name, f.name)!r}]" for f in required]
        body += ["    except KeyError as e:", "        raise BadValue('missing', e.args[0]) from None"]

    def check(f, indent: str) -> list[str]:
        v, w, chk = f"v_{f.name}", WIRE_NAMES.get(f.name, f.name), checks[f.name]
        ns[f"_c_{f.name}"] = chk
        call = [f"{indent}try:", f"{indent}    {v} = _c_{f.name}({v})", f"{indent}except BadValue as e:",
                f"{indent}    raise BadValue(e.why, _sub({w!r}, e)) from None"]
        fast = _FAST.get(chk)
        if fast is None:
            return call
        return [f"{indent}if not ({fast.format(v=v)}):", *("    " + line for line in call)]

    for f in fields(cls):
        if f in required:
            body += check(f, "    ")
            continue
        w = WIRE_NAMES.get(f.name, f.name)
        if f.default is not MISSING:
            ns[f"_d_{f.name}"] = f.default
            default = f"_d_{f.name}"
        else:
            ns[f"_f_{f.name}"] = f.default_factory
            default = f"_f_{f.name}()"
        body += [f"    v_{f.name} = h.get({w!r}, _MISS)", f"    if v_{f.name} is _MISS:",
                 f"        v_{f.name} = {default}", "    else:", "        n += 1"]
        if f.default is None:  # nil: the default
            body += [f"        if v_{f.name} is not None:", *check(f, "            ")]
        else:
            body += check(f, "        ")
    # build it without __init__: a frozen dataclass's sets each field through object.__setattr__;
    # its slots' own descriptors cost a third (there is no __post_init__ to run)
    body += ["    if len(h) != n:", "        raise _unknown(h, _KNOWN)", "    o = _new(cls)"]
    for f in fields(cls):
        ns[f"_s_{f.name}"] = getattr(cls, f.name).__set__
        body.append(f"    _s_{f.name}(o, v_{f.name})")
    body.append("    return o")
    exec("\n".join(body), ns)  # noqa: S102 - the source is made of field names only
    return ns["dec"]


# ---- the field tables ------------------------------------------------------------------------
# Per class: attribute -> checker (value -> value as stored, or BadValue). A field is required iff it
# has no default; a field whose default is None also takes nil on the wire (as absent).
_PARAMS_CHECKS = {"max_tokens": positive, "temperature": nonneg_number, "top_p": number, "top_k": int_at_least(-1),
                  "ignore_eos": boolean, "stop_token_ids": token_ids, "seed": integer, "presence_penalty": number,
                  "frequency_penalty": number, "repetition_penalty": number, "logit_bias": logit_bias,
                  "logprobs": natural, "prompt_logprobs": natural, "grammar": text, "min_p": number,
                  "min_tokens": natural}
_decode_params = _decoder(WireParams, _PARAMS_CHECKS)


def _params(v: Any) -> WireParams:
    """The checker of a "p" map: its compiled WireParams decoder."""
    if type(v) is not dict:
        raise BadValue(f"expected a map, got {type_name(v)}")
    return _decode_params(v)


_CHECKS: dict[type, dict[str, Callable[[Any], Any]]] = {
    Gen: {"rid": text, "prompt_ids": token_ids, "params": _params, "kind": one_of("full", "prefill"),
          "isolated": boolean, "predicted": positive, "dest": natural, "dest_ident": text, "dest_addr": text,
          "threshold": natural, "region": mapping, "blocks": token_ids, "skip": natural, "resumed": positive},
    Expect: {"rid": text, "prompt_ids": token_ids, "params": _params, "src": natural, "isolated": boolean,
             "resumed": positive},
    Cancel: {"rid": text},
    Abort: {"rid": text, "prefill_sent": boolean},
    PeerDown: {"peer": natural},
    Ping: {},
    Stop: {},
    Hello: {"worker_id": natural, "pid": natural, "kv_addr": text, "blocks": natural, "block_size": positive,
            "free": natural, "max_len": positive, "region": mapping, "boot": text},
    Heartbeat: {"worker_id": natural, "free": natural, "blocks": natural, "reserved": natural, "running": natural,
                "rejected": natural, "stray": natural, "preempted": natural},
    Out: {"items": out_items, "lp": logprob_pairs},
    Reserved: {"rid": text, "ok": boolean, "blocks": token_ids, "msg": text, "skip": natural, "full": boolean},
    KvIn: {"rid": text, "first_token": natural, "nbytes": natural, "mode": one_of("layerwise", "serialized"),
           "seconds": nonneg_number, "exposed": nonneg_number, "lp": logprob_pair, "skipped": natural},
    KvFail: {"rid": text, "reason": text},
    Err: {"rid": text, "msg": text},
    StepFailed: {"rids": texts, "error": text},
    Step: {"chunks": step_chunks, "preempted": texts, "joined": texts, "sched": any_list, "at": nonneg_number,
           "cached": step_chunks, "grown": texts},
    KvStart: {"rid": text},
    KvLayer: {"rid": text, "layer": natural, "sent_at": nonneg_number, "inplace_bytes": natural},
    KvDone: {"rid": text, "first_token": natural, "prefill_end": nonneg_number,
             "mode": one_of("layerwise", "serialized"), "sent_at": nonneg_number, "meta": kv_meta,
             "inplace_bytes": natural, "fail": text, "lp": logprob_pair},
    KvDrop: {"rid": text},
}


_DECODERS = {cls: _decoder(cls, checks) for cls, checks in _CHECKS.items()}


def _fail(kind: str, field: str | None, why: str, h: Any) -> MalformedMessage:
    rid = h.get("rid") if type(h) is dict else None
    where = f"{kind}: field {field!r}: " if field is not None else f"{kind}: "
    return MalformedMessage(where + why, kind, field, rid if type(rid) is str else None)


_PREFILL_ONLY = ("dest", "dest_ident", "addr", "thr", "region", "blocks", "skip")
_PREFILL_NEEDS = (("dest", "dest"), ("dest_ident", "dest_ident"), ("addr", "dest_addr"), ("thr", "threshold"))


def _check_gen(m: Gen, h: dict) -> None:
    if m.kind == "prefill":
        for wire, attr in _PREFILL_NEEDS:
            if getattr(m, attr) is None:
                raise _fail("gen", wire, "missing (kind 'prefill')", h)
    else:
        for wire in _PREFILL_ONLY:
            if h.get(wire) is not None:
                raise _fail("gen", wire, "only for kind 'prefill'", h)


# ---- the API ---------------------------------------------------------------------------------
def decode(header: dict, kinds: Container[str] | None = None) -> Message:
    """The checked message of a header from Codec.decode ("_from" ignored: read it from the
    header). `kinds`: the wire names accepted here (e.g. TO_WORKER), or None for any kind.
    MalformedMessage otherwise (see the module docstring)."""
    if type(header) is not dict:
        raise MalformedMessage(f"a header must be a map, got {type_name(header)}")
    t = header.get("t")
    if type(t) is not str or (cls := MESSAGES.get(t)) is None:
        raise MalformedMessage(f"unknown type {t!r}", None, "t")
    if kinds is not None and t not in kinds:
        raise _fail(t, None, f"unexpected type {t!r} here", header)
    try:
        msg = _DECODERS[cls](header)
    except BadValue as e:
        raise _fail(t, e.field, e.why, header) from None
    if cls is Gen:
        _check_gen(msg, header)
    return msg


def _encoder(cls: type[Message]) -> Callable[[Any], dict]:
    """The function msg -> header of `cls`, compiled once from its fields: a dict display of "t"
    and the fields without a None default, then one `if` per field with a None default."""
    always: list[tuple[str, str]] = []
    optional: list[tuple[str, str]] = []
    for f in fields(cls):
        wire = WIRE_NAMES.get(f.name, f.name)
        value = "m.params.to_wire()" if f.name == "params" else f"m.{f.name}"
        (optional if f.default is None else always).append((wire, value))
    lines = ["def enc(m):", "    d = {" + ", ".join(f"{w!r}: {v}" for w, v in [("t", repr(cls.T)), *always]) + "}"]
    for w, v in optional:
        lines += [f"    if {v} is not None:", f"        d[{w!r}] = {v}"]
    lines.append("    return d")
    ns: dict[str, Any] = {}
    exec("\n".join(lines), ns)  # noqa: S102 - the source is made of field names only
    return ns["enc"]


_ENCODERS: dict[type[Message], Callable[[Any], dict]] = {cls: _encoder(cls) for cls in MESSAGE_CLASSES}


def encode(msg: Message) -> dict:
    """The header of `msg` for Codec.encode: {"t": msg.T, wire name: value, ...}; optional fields
    that are None left out. Not checked (see the module docstring); shares the message's lists."""
    try:
        enc = _ENCODERS[type(msg)]
    except KeyError:
        raise TypeError(f"not a message: {type(msg).__name__}") from None
    return enc(msg)


def params_from_wire(d: Any) -> WireParams:
    """The checked WireParams of a wire map; MalformedMessage (kind "p") otherwise."""
    try:
        return _params(d)
    except BadValue as e:
        raise _fail("p", e.field, e.why, d) from None

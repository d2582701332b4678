"""Encoding and decoding of message headers, checked: per-kind tables of checkers (checks.py),
compiled once at import into straight-line decoders and encoders (see the package docstring's
"Cost")."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from typing import Any, Callable, Container

from .checks import (_Bad, _bool, _chunks, _enum, _float, _float_nn, _got, _ids, _int, _int_at_least, _items, _list,
                     _lp, _lps, _map, _meta, _nat, _pos, _str, _strs, _bias)
from .kinds import (_CLASSES, MESSAGES, WIRE_NAMES, Abort, Cancel, Err, Expect, Gen, Heartbeat, Hello, KvDone, KvDrop,
                    KvFail, KvIn, KvLayer, KvStart, MalformedMessage, Message, Out, PeerDown, Ping, Reserved,
                    Step, StepFailed, Stop)
from .params import WireParams

# A checker's test of the common case, inlined by the decoders (the checker runs only when it
# fails: to convert, as an int to float, or to raise with the reason)
_FAST = {
    _str: "type({v}) is str", _bool: "type({v}) is bool", _int: "type({v}) is int",
    _nat: "type({v}) is int and {v} >= 0", _pos: "type({v}) is int and {v} >= 1",
    _float: "type({v}) is float and -_INF < {v} < _INF", _float_nn: "type({v}) is float and 0.0 <= {v} < _INF",
}


def _sub(wire: str, e: _Bad) -> str:
    return wire if e.field is None else f"{wire}.{e.field}"


def _unknown(h: dict, known: frozenset) -> _Bad:
    return _Bad("unknown field", next(str(k) for k in h if k not in known))


def _decoder(cls: type, checks: dict[str, Callable[[Any], Any]]) -> Callable[[dict], Any]:
    """The function map -> checked instance of `cls` (_Bad naming the field otherwise), compiled
    once from its field table `checks`: a header (or "p" map) is read with one lookup per field,
    the common case of each check inline, then its size tells whether it held an unknown field."""
    if sorted(f.name for f in fields(cls)) != sorted(checks):
        raise AssertionError(f"{cls.__name__}: the checkers do not match the fields")
    header = issubclass(cls, Message)  # a header also holds "t" (and "_from" after Codec.decode)
    ns: dict[str, Any] = {"_Bad": _Bad, "_sub": _sub, "_unknown": _unknown, "_MISS": MISSING, "_INF": math.inf,
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
        body += ["    except KeyError as e:", "        raise _Bad('missing', e.args[0]) from None"]

    def check(f, indent: str) -> list[str]:
        v, w, chk = f"v_{f.name}", WIRE_NAMES.get(f.name, f.name), checks[f.name]
        ns[f"_c_{f.name}"] = chk
        call = [f"{indent}try:", f"{indent}    {v} = _c_{f.name}({v})", f"{indent}except _Bad as e:",
                f"{indent}    raise _Bad(e.why, _sub({w!r}, e)) from None"]
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
# Per class: attribute -> checker (value -> value as stored, or _Bad). A field is required iff it
# has no default; a field whose default is None also takes nil on the wire (as absent).
_PARAMS_CHECKS = {"max_tokens": _pos, "temperature": _float_nn, "top_p": _float, "top_k": _int_at_least(-1),
                  "ignore_eos": _bool, "stop_token_ids": _ids, "seed": _int, "presence_penalty": _float,
                  "frequency_penalty": _float, "repetition_penalty": _float, "logit_bias": _bias,
                  "logprobs": _nat, "prompt_logprobs": _nat, "grammar": _str}
_decode_params = _decoder(WireParams, _PARAMS_CHECKS)


def _params(v: Any) -> WireParams:
    """The checker of a "p" map: its compiled WireParams decoder."""
    if type(v) is not dict:
        raise _Bad(f"expected a map, got {_got(v)}")
    return _decode_params(v)


_CHECKS: dict[type, dict[str, Callable[[Any], Any]]] = {
    Gen: {"rid": _str, "prompt_ids": _ids, "params": _params, "kind": _enum("full", "prefill"), "isolated": _bool,
          "predicted": _pos, "dest": _nat, "dest_ident": _str, "dest_addr": _str, "threshold": _nat, "region": _map, "blocks": _ids,
          "skip": _nat, "resumed": _pos},
    Expect: {"rid": _str, "prompt_ids": _ids, "params": _params, "src": _nat, "isolated": _bool, "resumed": _pos},
    Cancel: {"rid": _str},
    Abort: {"rid": _str, "prefill_sent": _bool},
    PeerDown: {"peer": _nat},
    Ping: {},
    Stop: {},
    Hello: {"worker_id": _nat, "pid": _nat, "kv_addr": _str, "blocks": _nat, "block_size": _pos, "free": _nat,
            "max_len": _pos, "region": _map, "boot": _str},
    Heartbeat: {"worker_id": _nat, "free": _nat, "blocks": _nat, "reserved": _nat, "running": _nat,
                "rejected": _nat, "stray": _nat, "preempted": _nat},
    Out: {"items": _items, "lp": _lps},
    Reserved: {"rid": _str, "ok": _bool, "blocks": _ids, "msg": _str, "skip": _nat, "full": _bool},
    KvIn: {"rid": _str, "first_token": _nat, "nbytes": _nat, "mode": _enum("layerwise", "serialized"),
           "seconds": _float_nn, "exposed": _float_nn, "lp": _lp, "skipped": _nat},
    KvFail: {"rid": _str, "reason": _str},
    Err: {"rid": _str, "msg": _str},
    StepFailed: {"rids": _strs, "error": _str},
    Step: {"chunks": _chunks, "preempted": _strs, "joined": _strs, "sched": _list, "at": _float_nn, "cached": _chunks,
           "grown": _strs},
    KvStart: {"rid": _str},
    KvLayer: {"rid": _str, "layer": _nat, "sent_at": _float_nn, "inplace_bytes": _nat},
    KvDone: {"rid": _str, "first_token": _nat, "prefill_end": _float_nn, "mode": _enum("layerwise", "serialized"),
             "sent_at": _float_nn, "meta": _meta, "inplace_bytes": _nat, "fail": _str, "lp": _lp},
    KvDrop: {"rid": _str},
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
        raise MalformedMessage(f"a header must be a map, got {_got(header)}")
    t = header.get("t")
    cls = MESSAGES.get(t) if type(t) is str else None
    if cls is None:
        raise MalformedMessage(f"unknown type {t!r}", None, "t")
    if kinds is not None and t not in kinds:
        raise _fail(t, None, f"unexpected type {t!r} here", header)
    try:
        msg = _DECODERS[cls](header)
    except _Bad as e:
        raise _fail(t, e.field, e.why, header) from None
    if cls is Gen:
        _check_gen(msg, header)
    return msg


def _encoder(cls: type) -> Callable[[Any], dict]:
    """The function msg -> header of `cls`, compiled once from its fields: a dict display of "t"
    and the fields without a None default, then one `if` per field with a None default."""
    always, optional = [], []
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


_ENCODERS = {cls: _encoder(cls) for cls in _CLASSES}


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
    except _Bad as e:
        raise _fail("p", e.field, e.why, d) from None

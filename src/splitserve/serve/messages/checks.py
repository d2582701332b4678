"""The checkers of header values: each takes a value from the wire and returns it as stored, or
raises BadValue saying what was expected. The common case of the simple ones is inlined by the
compiled decoders (codec.py's _FAST). The checker of "p" maps is codec.py's `_params` (it runs the
compiled WireParams decoder)."""

from __future__ import annotations

import math
from array import array
from operator import countOf
from typing import Any, Callable, Sequence

from .kinds import OutItem, StepChunk

# ---- checkers: value -> value as stored, or BadValue(what was expected) ----------------------------
class BadValue(Exception):
    """A checker's complaint: `why`, and `field` (a sub-field, e.g. of "p") where it has one."""

    def __init__(self, why: str, field: str | None = None) -> None:
        super().__init__(why)
        self.why, self.field = why, field


def type_name(v: Any) -> str:
    return type(v).__name__


def text(v: Any) -> str:
    if type(v) is str:
        return v
    raise BadValue(f"expected a string, got {type_name(v)}")


def boolean(v: Any) -> bool:
    if type(v) is bool:
        return v
    raise BadValue(f"expected a bool, got {type_name(v)}")


def int_at_least(lo: int | None) -> Callable[[Any], int]:
    what = "an int" if lo is None else "a non-negative int" if lo == 0 else f"an int >= {lo}"

    def check(v: Any) -> int:
        if type(v) is int and (lo is None or v >= lo):
            return v
        raise BadValue(f"expected {what}, got {v!r}" if type(v) is int else f"expected {what}, got {type_name(v)}")
    return check


integer = int_at_least(None)
natural = int_at_least(0)
positive = int_at_least(1)


def _float_at_least(lo: float | None) -> Callable[[Any], float]:
    what = "a finite number" if lo is None else "a finite number >= 0" if lo == 0 else f"a finite number >= {lo}"
    isfinite = math.isfinite

    def check(v: Any) -> float:
        t = type(v)
        if t is float:
            if isfinite(v) and (lo is None or v >= lo):
                return v
        elif t is int:
            if lo is None or v >= lo:
                return float(v)
        else:
            raise BadValue(f"expected {what}, got {type_name(v)}")
        raise BadValue(f"expected {what}, got {v!r}")
    return check


number = _float_at_least(None)
nonneg_number = _float_at_least(0.0)


def one_of(*values: str) -> Callable[[Any], str]:
    allowed = frozenset(values)
    what = " or ".join(repr(x) for x in values)

    def check(v: Any) -> str:
        if type(v) is str and v in allowed:
            return v
        raise BadValue(f"expected {what}, got {v!r}" if type(v) is str else f"expected {what}, got {type_name(v)}")
    return check


def _seq(v: Any, what: str) -> list:
    """v as a list (a tuple is copied into one), or BadValue."""
    if type(v) is list:
        return v
    if isinstance(v, tuple):
        return list(v)
    raise BadValue(f"expected {what}, got {type_name(v)}")


def texts(v: Any) -> list[str]:
    if type(v) is not list:
        v = _seq(v, "a list of strings")
    if countOf(map(type, v), str) == len(v):
        return v
    bad = next(x for x in v if type(x) is not str)
    raise BadValue(f"expected a list of strings, got a list with item {bad!r}")


def mapping(v: Any) -> dict:
    """An opaque map with string keys (a KV region handle)."""
    if type(v) is not dict:
        raise BadValue(f"expected a map with string keys, got {type_name(v)}")
    if countOf(map(type, v), str) != len(v):
        raise BadValue(f"expected a map with string keys, got key {next(k for k in v if type(k) is not str)!r}")
    return v


_META = {"num_layers": natural, "num_tokens": natural, "num_kv_heads": natural, "head_dim": natural, "dtype": text}


def kv_meta(v: Any) -> dict:
    if type(v) is not dict:
        raise BadValue(f"expected a map, got {type_name(v)}")
    if v.keys() != _META.keys():
        raise BadValue(f"expected the keys {sorted(_META)}, got {sorted(map(str, v))}")
    for k, check in _META.items():
        try:
            check(v[k])
        except BadValue as e:
            raise BadValue(f"key {k!r}: {e}") from None
    return v


def _ids_ok(v: list) -> bool:
    """Whether the list v holds only non-negative ints (exact ints, no bools) below 2**64."""
    n = len(v)
    if n == 1:
        x = v[0]
        return type(x) is int and 0 <= x < 1 << 64
    if countOf(map(type, v), int) != n:  # every item an int (a bool's type is bool)
        return False
    try:
        array("Q", v)  # and each in [0, 2**64): at C speed
        return True
    except OverflowError:
        return False


_IDS = "a list of non-negative ints"


def token_ids(v: Any) -> list[int]:
    """A list of non-negative ints (token ids, block ids)."""
    if type(v) is not list:
        v = _seq(v, _IDS)
    if _ids_ok(v):
        return v
    bad = next(x for x in v if type(x) is not int or not 0 <= x < 1 << 64)
    raise BadValue(f"expected {_IDS}, got a list with item {bad!r}")


_ITEM = "[rid: str, tokens: list[int], finished: bool, reason: str | None]"
_new = tuple.__new__


def out_items(v: Any) -> list[OutItem]:
    out: list[OutItem]
    if type(v) is list:  # the common case, as msgpack gives it: one pass, no copies
        out = []
        append = out.append
        for it in v:
            if type(it) is list and len(it) == 4:
                rid, toks, fin, reason = it
                if (type(rid) is str and type(fin) is bool and (reason is None or type(reason) is str)
                        and type(toks) is list and (len(toks) == 1 and type(toks[0]) is int
                                                    and 0 <= toks[0] < 1 << 64 or _ids_ok(toks))):
                    append(_new(OutItem, it))
                    continue
            break
        else:
            return out
    out = []  # tuples to convert, or an error to name
    for i, it in enumerate(_seq(v, f"a list of {_ITEM}")):
        if (type(it) is list or isinstance(it, tuple)) and len(it) == 4:
            rid, toks, fin, reason = it
            if type(rid) is str and type(fin) is bool and (reason is None or type(reason) is str):
                try:
                    out.append(_new(OutItem, (rid, token_ids(toks), fin, reason)))
                    continue
                except BadValue as e:
                    raise BadValue(f"item {i}: tokens: {e.why}") from None
        raise BadValue(f"item {i}: expected {_ITEM}, got {it!r:.80}")
    return out


_RECORD = "[token: int, logprob: number, rank: int >= 1, top: list of [token: int, logprob: number]]"


def _logprob(v: Any) -> float:
    if type(v) is float and v == v or type(v) is int:
        return float(v)
    raise BadValue(f"expected a logprob (a number, -inf allowed), got {v!r:.40}")


def _records(v: Any) -> list:
    """Log-probability records (engine/logprobs.py), as lists."""
    out = []
    for i, r in enumerate(_seq(v, f"a list of {_RECORD}")):
        if (type(r) is list or isinstance(r, tuple)) and len(r) == 4:
            tok, lp, rank, top = r
            if type(tok) is int and tok >= 0 and type(rank) is int and rank >= 1:
                try:
                    out.append([tok, _logprob(lp), rank,
                                [[t, _logprob(x)] for t, x in (_pair(p) for p in _seq(top, "a list"))]])
                    continue
                except BadValue:
                    pass
        raise BadValue(f"record {i}: expected {_RECORD}, got {r!r:.80}")
    return out


def _pair(p: Any) -> Sequence[Any]:
    if (type(p) is list or isinstance(p, tuple)) and len(p) == 2 and type(p[0]) is int and p[0] >= 0:
        return p
    raise BadValue("a top entry")


def logprob_pair(v: Any) -> list:
    """One request's log-probabilities in a message: [its new tokens' records or nil, its prompt's
    records or nil] (the prompt's come with its first output token only)."""
    v = _seq(v, "[token records or nil, prompt records or nil]")
    if len(v) != 2:
        raise BadValue(f"expected [token records or nil, prompt records or nil], got {len(v)} items")
    return [None if x is None else _records(x) for x in v]


def logprob_pairs(v: Any) -> dict:
    """request id -> its log-probabilities in an `out` (logprob_pair)."""
    if type(v) is not dict:
        raise BadValue(f"expected a map of request id -> logprobs, got {type_name(v)}")
    out = {}
    for rid, x in v.items():
        if type(rid) is not str:
            raise BadValue(f"expected request ids as keys, got {rid!r:.40}")
        try:
            out[rid] = logprob_pair(x)
        except BadValue as e:
            raise BadValue(f"{rid}: {e.why}") from None
    return out


def step_chunks(v: Any) -> list[StepChunk]:
    if type(v) is not list:
        v = _seq(v, "a list of [rid: str, n: int]")
    out = []
    for i, c in enumerate(v):
        if (type(c) is list or isinstance(c, tuple)) and len(c) == 2:
            rid, n = c
            if type(rid) is str and type(n) is int and n >= 0:
                out.append(_new(StepChunk, (rid, n)))
                continue
        raise BadValue(f"item {i}: expected [rid: str, n: non-negative int], got {c!r:.80}")
    return out


def any_list(v: Any) -> list:
    """A list, read by whoever made it (a machine scheduler's own report: its scheduler checks it)."""
    return v if type(v) is list else _seq(v, "a list")


def logit_bias(v: Any) -> list[tuple[int, float]]:
    if type(v) is not list:
        v = _seq(v, "a list of [token: int, bias: float]")
    out = []
    for i, pair in enumerate(v):
        if (type(pair) is list or isinstance(pair, tuple)) and len(pair) == 2:
            tok, b = pair
            if type(tok) is int and tok >= 0:
                try:
                    out.append((tok, number(b)))
                    continue
                except BadValue:
                    pass
        raise BadValue(f"item {i}: expected [token: non-negative int, bias: finite number], got {pair!r:.80}")
    return out


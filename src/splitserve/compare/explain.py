"""A claim's paragraph filled from one run: compare/claims.toml's `why.<workload>` is a list of
sentences, each a template whose every figure is a name of compare/facts.py in braces
({goodput_rps}, {vs.vllm}), the run's value put in its place. A sentence that holds only in some
runs carries a condition on the run's figures, `when`: "a OP b" strings (a: a name; b: a name, a
number or a 'quoted word'; OP: < <= > >= == !=), all of which must hold, and may carry
`otherwise`, the sentence used when they do not. A sentence (or its `otherwise`) naming a figure
this run lacks (a system not compared, one without a goodput) is left out.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import facts as F

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
CONDITION = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(<=|>=|==|!=|<|>)\s*(\S.*?)\s*$")
OPS: dict[str, Callable[[Any, Any], bool]] = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
       "==": operator.eq, "!=": operator.ne}


@dataclass(frozen=True, slots=True)
class Sentence:
    text: str
    when: tuple[str, ...] = ()
    otherwise: str = ""


def sentence(entry: str | dict) -> Sentence:
    """A claims.toml entry: a bare string, or {text, when, otherwise}."""
    if isinstance(entry, str):
        return Sentence(" ".join(entry.split()))
    return Sentence(" ".join(entry["text"].split()), tuple(entry.get("when", ())),
                    " ".join(entry.get("otherwise", "").split()))


def _operand(s: str) -> tuple[str, str | float]:
    """('word', w) for 'w'; ('number', x) for a number; ('name', n) otherwise."""
    if len(s) >= 2 and s[0] == s[-1] == "'":
        return "word", s[1:-1]
    try:
        return "number", float(s)
    except ValueError:
        return "name", s


def problems(s: Sentence) -> list[str]:
    """What is wrong with a sentence: names facts.py does not know (a typo), conditions that do not
    parse, braces that are not a placeholder."""
    known, out = F.known(), []
    for t in (s.text, s.otherwise):
        out += [f"unknown figure {{{n}}}" for n in PLACEHOLDER.findall(t) if n not in known]
        if "{" in PLACEHOLDER.sub("", t) or "}" in PLACEHOLDER.sub("", t):
            out.append(f"unmatched brace in {t[:60]!r}")
    for c in s.when:
        m = CONDITION.match(c)
        if not m:
            out.append(f"condition {c!r} is not 'a OP b'")
            continue
        a, op, b = m.groups()
        kind, v = _operand(b)
        out += [f"unknown figure {n!r} in {c!r}" for n in (a, v if kind == "name" else None)
                if n is not None and n not in known]
        if kind == "word" and op not in ("==", "!="):
            out.append(f"{c!r}: a word compares with == or != only")
        if a in known and (F.spec(a) == "s") != (kind == "word" or kind == "name" and v in known
                                                 and F.spec(v) == "s"):
            out.append(f"{c!r}: compares a word with a number")
    return out


def holds(s: Sentence, facts: dict) -> bool | None:
    """Whether every condition holds on `facts`; None when one names a figure the run lacks."""
    for c in s.when:
        m = CONDITION.match(c)
        if m is None:  # `check` refuses such a sentence first
            raise ValueError(f"condition {c!r} is not 'a OP b'")
        a, op, b = m.groups()
        kind, v = _operand(b)
        if a not in facts or (kind == "name" and v not in facts):
            return None
        rhs = facts[v] if kind == "name" else v
        if not OPS[op](facts[a], rhs):
            return False
    return True


def fill(t: str, facts: dict) -> str | None:
    """`t` with every placeholder replaced by its figure; None when the run lacks one."""
    names = PLACEHOLDER.findall(t)
    if any(n not in facts for n in names):
        return None
    return PLACEHOLDER.sub(lambda m: F.text(m.group(1), facts[m.group(1)]), t)


def paragraph(sentences: list[Sentence], facts: dict) -> str:
    """The sentences that hold on this run's `facts`, filled, in order."""
    out = []
    for s in sentences:
        ok = holds(s, facts)
        t = s.text if ok else s.otherwise if ok is False else ""
        filled = fill(t, facts) if t else None
        if filled:
            out.append(filled)
    return " ".join(out)

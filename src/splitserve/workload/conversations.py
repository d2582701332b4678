"""Workloads whose prompts share prefixes: multi-turn conversations, and a shared system prompt.

A conversation is `turns` requests. Its first prompt is the system prompt (the same for every
conversation of a run) and a user message; turn t's prompt is turn t-1's prompt, its reply and a
new user message, so the history grows and each turn's prompt begins with the whole of the one
before. Turn t+1 leaves `think` seconds after turn t's last token reaches the client (a closed
loop per conversation), so its arrival is known only when turn t ends: whoever drives the run
asks `follow(turn, reply, end)` for it (the simulator, sim/prefix.py; bench, bench/conversations.py).
Conversations start at Poisson arrivals, `rps / turns` a second, so that turns arrive at about
`rps` while replies are quick. `sysprompt` is conversations of one turn: single requests sharing
a system prompt.

Every conversation draws its sizes and user messages from its own generator (seed,
conversation), so a turn is the same whatever order the driver asks for them in: user messages
and replies of uniform lengths in [lo, hi], think times exponential with mean `think`, token ids
in [TOKEN_MIN, TOKEN_MAX] (valid for any vocabulary, the byte-level `tiny` one included). The
reply a turn carries is the one generated: bench sends the server's tokens back; the simulator,
which generates none, stands in a seeded reply of the same length (`stand_in`), so its blocks are
named differently from the live run's but the same blocks are shared. A conversation ends early
when its next prompt and reply would pass `max_context`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..errors import UserError

TOKEN_MIN, TOKEN_MAX = 3, 258
_START, _TURNS, _SYSTEM, _REPLY = 0xC0, 0xC1, 0xC2, 0xC3   # seed salts of the generators


@dataclass(frozen=True, slots=True)
class Shape:
    turns: int = 10
    system: int = 0                          # system prompt tokens (shared by every conversation)
    user: tuple[int, int] = (64, 256)        # user message tokens, uniform in [lo, hi]
    reply: tuple[int, int] = (64, 256)       # reply tokens (the output), uniform in [lo, hi]
    think: float = 2.0                       # mean seconds from a reply to the next turn

    def describe(self) -> str:
        return (f"{self.turns} turns, system {self.system}, user {self.user[0]}-{self.user[1]}, "
                f"reply {self.reply[0]}-{self.reply[1]} tokens, think {self.think:g} s")


SHAPES = {"multiturn": Shape(), "sysprompt": Shape(turns=1, system=1024, user=(32, 256), reply=(32, 256))}
DEFAULT_RPS = {"multiturn": 2.0, "sysprompt": 2.0}


def parse_shape(base: Shape, text: str) -> Shape:
    """`base` with the fields `text` gives: "turns=4,system=0,user=32:96,reply=16:48,think=1"."""
    kw: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, val = part.partition("=")
        try:
            if key in ("turns", "system"):
                kw[key] = int(val)
            elif key == "think":
                kw[key] = float(val)
            elif key in ("user", "reply"):
                lo, _, hi = val.partition(":")
                kw[key] = (int(lo), int(hi or lo))
            else:
                raise UserError(f"conversation shape: unknown field {key!r} (turns, system, user, reply, think)")
        except ValueError:
            raise UserError(f"conversation shape: {part!r} is not a number (e.g. turns=4,user=32:96,think=1)") from None
    s = replace(base, **kw)
    if s.turns < 1 or s.system < 0 or not 1 <= s.user[0] <= s.user[1] or not 1 <= s.reply[0] <= s.reply[1]:
        raise UserError(f"conversation shape {text!r}: turns >= 1, system >= 0, 1 <= lo <= hi for user and reply")
    if not (math.isfinite(s.think) and s.think >= 0):
        raise UserError(f"conversation shape {text!r}: think must be seconds >= 0")
    return s


@dataclass(frozen=True, slots=True)
class Turn:
    arrival: float            # seconds from the start of the run
    prompt_tokens: int
    output_tokens: int
    prompt: list[int]         # the prompt's token ids
    conversation: int
    index: int                # 0: the conversation's first turn


class _Plan(NamedTuple):
    users: list[list[int]]    # each turn's user message
    replies: list[int]        # each turn's reply length
    thinks: list[float]


@dataclass(slots=True)
class Conversations:
    """The first turns in arrival order (iterate), and each later turn once the one before ends
    (`follow`). Attributes as workload.Workload's, for summaries."""

    name: str
    shape: Shape
    rps: float
    duration: float
    seed: int
    max_context: int | None = None
    arrivals: str = "poisson"
    system_ids: list[int] | None = None

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, _SYSTEM])
        self.system_ids = rng.integers(TOKEN_MIN, TOKEN_MAX + 1, self.shape.system).tolist()

    def describe(self) -> str:
        return (f"{self.name} ({self.shape.describe()}), conversations starting at {self.rps / self.shape.turns:g}/s "
                f"(turns at about {self.rps:g} req/s) for {self.duration:g} s, seed {self.seed}")

    def _plan(self, c: int) -> _Plan:
        s = self.shape
        rng = np.random.default_rng([self.seed, _TURNS, c])
        users = rng.integers(s.user[0], s.user[1] + 1, s.turns).tolist()
        replies = rng.integers(s.reply[0], s.reply[1] + 1, s.turns).tolist()
        thinks = rng.exponential(s.think, s.turns).tolist() if s.think > 0 else [0.0] * s.turns
        ids = [rng.integers(TOKEN_MIN, TOKEN_MAX + 1, n).tolist() for n in users]
        return _Plan(ids, replies, thinks)

    def _turn(self, c: int, i: int, arrival: float, history: list[int], p: _Plan) -> Turn | None:
        prompt = history + p.users[i]
        out = p.replies[i]
        if self.max_context is not None and len(prompt) + out > self.max_context:
            return None
        return Turn(arrival, len(prompt), out, prompt, c, i)

    def __iter__(self) -> Iterator[Turn]:
        rng = np.random.default_rng([self.seed, _START])
        rate = self.rps / self.shape.turns
        t, c = 0.0, 0
        while True:
            t += float(rng.exponential(1.0 / rate))
            if t >= self.duration:
                return
            turn = self._turn(c, 0, t, list(self.system_ids or ()), self._plan(c))
            c += 1
            if turn is None:
                raise UserError(f"{self.name}: a first turn ({self.shape.system} system + up to "
                                f"{self.shape.user[1]} user + {self.shape.reply[1]} reply tokens) passes the "
                                f"context of {self.max_context} tokens; shorten the conversation shape")
            yield turn

    def follow(self, turn: Turn, reply: list[int], end: float) -> Turn | None:
        """The turn after `turn`, whose reply was `reply` and reached the client at `end`; None
        after the last turn (or when it would pass the context)."""
        i = turn.index + 1
        if i >= self.shape.turns:
            return None
        p = self._plan(turn.conversation)
        return self._turn(turn.conversation, i, end + p.thinks[turn.index], turn.prompt + reply, p)

    def stand_in(self, turn: Turn) -> list[int]:
        """A seeded reply of the turn's output length, for a driver that generates no tokens."""
        rng = np.random.default_rng([self.seed, _REPLY, turn.conversation, turn.index])
        return rng.integers(TOKEN_MIN, TOKEN_MAX + 1, turn.output_tokens).tolist()


def make_conversations(source: str, *, rps: float | None, duration: float | None, seed: int,
                       max_context: int | None = None, shape: str | None = None) -> Conversations:
    s = SHAPES[source] if not shape else parse_shape(SHAPES[source], shape)
    rps = DEFAULT_RPS[source] if rps is None else rps
    return Conversations(source, s, rps, 60.0 if duration is None else duration, seed, max_context)

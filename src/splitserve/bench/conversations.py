"""The closed-loop sender of conversations (`--workload multiturn` / `sysprompt`:
workload/conversations.py `Conversations`).

Each conversation's first turn leaves at its arrival (Poisson starts within `--duration`); when a
turn's `[DONE]` arrives, its next turn is `follow(turn, reply, end)`: the reply is the token ids the
server streamed back (`choices[].token_ids`), so the next prompt is exactly the history the
server's prefix cache holds, and `end` is when `[DONE]` came (seconds from the run's start); the
next turn leaves at its own arrival (`end` + its think time). Every turn is one request, sent and
measured as the open-loop sender's (client.py `run_one`: the same `RequestRecord`, with its
conversation and turn, and the same `Collector`), its prompt as token ids on /v1/completions.

A turn that fails (or is rejected) ends its conversation: the turns it would still have had are
not sent and are counted (`Collector.not_sent`, summary.json `bench.turns_not_sent`). `--duration`
bounds the conversations' starts only: the run ends when every conversation has ended.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from ..workload.conversations import Conversations, Turn
from .client import Target, run_one, http_client, request_body
from .collector import Collector, RequestRecord
from .plan import PlannedRequest


def turns_after(conv: Conversations, turn: Turn) -> int:
    """How many turns `turn`'s conversation has after it, replies of their planned length (as
    the server sends with ignore_eos) standing in for the server's."""
    n = 0
    nxt = conv.follow(turn, conv.stand_in(turn), turn.arrival)
    while nxt is not None:
        n += 1
        nxt = conv.follow(nxt, conv.stand_in(nxt), nxt.arrival)
    return n


def planned_turns(conv: Conversations) -> int:
    """Every conversation's turns, replies of their planned length (the progress line's total)."""
    return sum(1 + turns_after(conv, t) for t in conv)


def first_requests(conv: Conversations) -> list[PlannedRequest]:
    """The first turns as planned requests (the server's context check takes these)."""
    return [PlannedRequest(i, t.arrival, t.prompt_tokens, t.output_tokens, t.prompt) for i, t in enumerate(conv)]


async def converse(conv: Conversations, target: Target, collector: Collector,
                   on_start: Callable[[float], None] | None = None) -> float:
    """Send every conversation, each turn after the one before; return when all have ended: the
    wall time in seconds from the run's start to the last completion."""
    tasks: set[asyncio.Task] = set()
    slots = asyncio.Semaphore(target.max_concurrency) if target.max_concurrency else None
    index = itertools.count()
    async with http_client(target) as client:
        t0 = time.perf_counter()
        if on_start is not None:
            on_start(t0)

        async def send(turn: Turn) -> None:
            delay = t0 + turn.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = RequestRecord(next(index), turn.arrival, time.perf_counter() - t0, turn.prompt_tokens,
                                turn.output_tokens, conversation=turn.conversation, turn=turn.index)
            collector.start(rec)
            reply: list[int] = []
            body = request_body(target, turn.prompt, turn.output_tokens)
            await run_one(client, target, body, rec, t0, collector, slots, reply)
            if rec.outcome != "completed":
                collector.not_sent += turns_after(conv, turn)
                return
            assert rec.end is not None, "run_one sets when the request ended"
            nxt = conv.follow(turn, reply, rec.end)
            if nxt is not None:
                launch(nxt)

        def launch(turn: Turn) -> None:
            task = asyncio.create_task(send(turn))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        for turn in conv:                      # the first turns, each launched at its arrival
            delay = t0 + turn.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            launch(turn)
        while tasks:
            done, _ = await asyncio.wait(set(tasks), return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()                  # a bug in the loop itself is not lost in a task
        return time.perf_counter() - t0

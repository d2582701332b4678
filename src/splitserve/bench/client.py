"""The open-loop sender and what it measures at the client.

Requests leave at their scheduled arrival times whatever the server is doing (open loop): one
dispatcher sleeps until each arrival and starts a task; all tasks share one `httpx.AsyncClient`.
Latencies are measured from the *scheduled* send time, so a late send (an overloaded client or a
full connection pool) shows up as latency instead of silently thinning the load (no coordinated
omission); the lateness itself is reported as `send_lag_s`.

Every request ends exactly once, in `Collector.finish` (collector.py), as completed, failed (with
a reason) or rejected (HTTP 429/503: the server shed it). Latency histograms take completed requests only
(the population the simulator's summary describes): TTFT = scheduled send -> first token chunk,
TBT = every gap between consecutive token chunks (a chunk of k tokens counts as k gaps of 1/k of
its gap; extra tokens in the first chunk add none), E2E = scheduled send -> `[DONE]`, TPOT =
(E2E - TTFT) / (tokens - 1) per request of at least 2 tokens (metrics.py).

`--max-concurrency N` (vLLM's): a request that arrives while N are in flight waits in the client
for one to end (FIFO); its latencies then count from when it left, as vLLM counts them, and the
wait shows in `send_lag_s`. The client counts what it has in flight (`Collector.active`) and keeps
the largest count (`peak_in_flight`), so the limit is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .collector import Collector, RequestRecord
from .plan import PlannedRequest
from .sse import DONE, StreamError, chunk_output, chunk_tokens, parse_line, usage_cached, usage_tokens

REJECT_STATUSES = (429, 503)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Target:
    url: str                         # full endpoint, .../v1/completions or .../v1/chat/completions
    model: str | None
    api_key: str | None
    timeout: float                   # whole request, seconds
    max_connections: int
    ignore_eos: bool = True
    chat: bool = False               # the chat endpoint: the prompt text is one user message
    max_concurrency: int | None = None
    save_outputs: bool = False


def request_body(target: Target, prompt: list[int] | str, max_tokens: int) -> dict:
    """The JSON body of one streaming, greedy request (chat: `prompt` is the user message)."""
    body: dict[str, Any]
    if target.chat:
        body = {"messages": [{"role": "user", "content": prompt}]}
    else:
        body = {"prompt": prompt}
    body.update({"max_tokens": max_tokens, "temperature": 0, "stream": True,
                 "stream_options": {"include_usage": True}})
    if target.ignore_eos:
        body["ignore_eos"] = True          # vLLM extension; harmless where unknown
    if target.model is not None:
        body["model"] = target.model
    return body


@dataclass(slots=True)
class _Reading:
    """One response's event stream as it is read into `rec`: the tokens counted from its chunks,
    the count its usage gives, and when the last token chunk came (times from `t_sched`); the
    generated token ids into `reply` when given (a conversation's next turn carries them)."""

    rec: RequestRecord
    t_sched: float
    gaps: list[float]
    save_outputs: bool
    counted: int = 0
    usage: int | None = None
    last: float | None = None
    reply: list[int] | None = None

    def add(self, event) -> bool:
        """Take one event (parse_line's); True at `[DONE]`, which ends the request."""
        rec = self.rec
        if event is DONE:
            if rec.ttft is None:
                rec.outcome, rec.reason = "failed", "no_tokens: [DONE] before any token"
                return True
            now = time.perf_counter()
            rec.e2e = now - self.t_sched
            rec.tokens = self.counted
            if self.usage is not None:
                if self.usage != self.counted:
                    rec.reason = f"usage says {self.usage} tokens, {self.counted} chunks counted"
                rec.tokens = self.usage
            if self.reply is not None and len(self.reply) != self.counted:
                rec.outcome, rec.reason = "failed", ("no_token_ids: the server sent no choices[].token_ids, "
                                                     "which a conversation's next turn carries")
                return True
            rec.outcome = "completed"
            return True
        k = chunk_tokens(event)
        u = usage_tokens(event)
        if u is not None:
            self.usage = u
        u = usage_tokens(event, "prompt_tokens")
        if u is not None:
            rec.usage_prompt_tokens = u
        u = usage_cached(event)
        if u is not None:
            rec.cached_tokens = u
        if self.save_outputs:
            ids, text = chunk_output(event)
            assert rec.output_ids is not None and rec.output_text is not None, "_stream_one starts both"
            rec.output_ids += ids
            rec.output_text += text
        if self.reply is not None:
            self.reply += chunk_output(event)[0]
        if k:
            now = time.perf_counter()
            if self.last is None:
                rec.ttft = now - self.t_sched
            else:
                g = (now - self.last) / k
                self.gaps.extend([g] * k)
            self.last = now
            self.counted += k
        return False


async def _stream_one(client, target: Target, body: dict, rec: RequestRecord, t_sched: float,
                      gaps: list[float], reply: list[int] | None = None) -> None:
    """Send one request and fill `rec`: outcome, reason, times (relative to t_sched), tokens
    (and the token ids generated into `reply`, when given)."""
    import httpx

    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else None
    started = False                  # got a 200 response head: a later break is a dropped stream
    reading = _Reading(rec, t_sched, gaps, target.save_outputs, reply=reply)
    if target.save_outputs:
        rec.prompt = body["messages"][0]["content"] if target.chat else body["prompt"]
        rec.output_ids, rec.output_text = [], ""
    try:
        async with asyncio.timeout(target.timeout):
            async with client.stream("POST", target.url, json=body, headers=headers) as resp:
                rec.status = resp.status_code
                if resp.status_code != 200:
                    text = (await resp.aread())[:200].decode("utf-8", "replace").strip()
                    if resp.status_code in REJECT_STATUSES:
                        rec.outcome, rec.reason = "rejected", f"http_{resp.status_code}"
                    else:
                        rec.outcome = "failed"
                        rec.reason = f"http_{resp.status_code}: {text}" if text else f"http_{resp.status_code}"
                    return
                started = True
                async for line in resp.aiter_lines():
                    event = parse_line(line)
                    if event is not None and reading.add(event):
                        return
                rec.outcome, rec.reason = "failed", "no_done: stream ended without data: [DONE]"
    except TimeoutError:
        rec.outcome, rec.reason = "failed", f"timeout: no [DONE] within {target.timeout:g} s"
    except StreamError as e:
        rec.outcome, rec.reason = "failed", str(e)
    except httpx.TimeoutException as e:
        rec.outcome, rec.reason = "failed", f"timeout: {type(e).__name__}"
    except httpx.ConnectError as e:
        rec.outcome, rec.reason = "failed", f"connect_error: {e}"
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        kind = "stream_dropped" if started else "connection_error"
        rec.outcome, rec.reason = "failed", f"{kind}: {type(e).__name__}: {e}"
    except httpx.HTTPError as e:
        rec.outcome, rec.reason = "failed", f"{type(e).__name__}: {e}"
    finally:
        if rec.outcome == "pending":          # cancelled or an unexpected exception
            rec.outcome, rec.reason = "failed", "client_error: request did not finish"
        rec.tokens = rec.tokens or reading.counted


async def run_one(client, target, body, rec, t0, collector: Collector,
                   slots: asyncio.Semaphore | None = None, reply: list[int] | None = None) -> None:
    gaps: list[float] = []
    t_sched = t0 + rec.arrival
    held = began = False
    try:
        if slots is not None:                  # --max-concurrency: wait for a slot, then count from here
            await slots.acquire()
            held = True
            t_sched = time.perf_counter()
            rec.sent = t_sched - t0
        collector.begin(rec)
        began = True
        await _stream_one(client, target, body, rec, t_sched, gaps, reply)
    except Exception as e:  # noqa: BLE001 -- one request's task: a bug or an odd error fails it, logged, not the run
        logger.exception("request %d: unexpected client error", rec.index)
        if rec.outcome in ("pending", "completed"):
            rec.outcome = "failed"
        rec.reason = f"client_error: {type(e).__name__}: {e}"
    finally:
        rec.end = time.perf_counter() - t0
        if began:
            collector.active -= 1
        if held and slots is not None:
            slots.release()
        if rec.outcome == "pending":           # cancelled while waiting for a slot
            rec.outcome, rec.reason = "failed", "client_error: request did not finish"
        collector.finish(rec, gaps)


def http_client(target: Target):
    """The one `httpx.AsyncClient` a run's requests share."""
    import httpx

    limits = httpx.Limits(max_connections=target.max_connections,
                          max_keepalive_connections=target.max_connections)
    timeout = httpx.Timeout(target.timeout, connect=min(target.timeout, 30.0))
    return httpx.AsyncClient(limits=limits, timeout=timeout)


async def replay(plan: Iterable[PlannedRequest], target: Target, make_prompt: Callable[[int], list[int]],
                 collector: Collector, on_start: Callable[[float], None] | None = None) -> float:
    """Send every planned request at its arrival time; return when all have finished. Returns
    the wall time in seconds from the first scheduled instant to the last completion. A planned
    request's own `prompt` is sent when it has one, else `make_prompt(prompt_tokens)`."""
    tasks: set[asyncio.Task] = set()
    slots = asyncio.Semaphore(target.max_concurrency) if target.max_concurrency else None
    async with http_client(target) as client:
        t0 = time.perf_counter()
        if on_start is not None:
            on_start(t0)
        for req in plan:
            prompt = req.prompt if req.prompt is not None else make_prompt(req.prompt_tokens)
            body = request_body(target, prompt, req.max_tokens)
            delay = t0 + req.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = RequestRecord(req.index, req.arrival, time.perf_counter() - t0,
                                req.prompt_tokens, req.max_tokens)
            collector.start(rec)
            task = asyncio.create_task(run_one(client, target, body, rec, t0, collector, slots))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.wait(set(tasks))
        return time.perf_counter() - t0

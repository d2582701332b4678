"""The open-loop sender and what it measures at the client.

Requests leave at their scheduled arrival times whatever the server is doing (open loop): one
dispatcher sleeps until each arrival and starts a task; all tasks share one `httpx.AsyncClient`.
Latencies are measured from the *scheduled* send time, so a late send (an overloaded client or a
full connection pool) shows up as latency instead of silently thinning the load (no coordinated
omission); the lateness itself is reported as `send_lag_s`.

Every request ends exactly once, in `Collector.finish`, as completed, failed (with a reason) or
rejected (HTTP 429/503: the server shed it). Latency histograms take completed requests only
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
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..report.histogram import Histogram
from .plan import PlannedRequest
from .metrics import GoodputSLO, tpot
from .sse import DONE, StreamError, chunk_output, chunk_tokens, parse_line, usage_tokens

REJECT_STATUSES = (429, 503)


@dataclass(slots=True)
class RequestRecord:
    index: int
    arrival: float               # scheduled, seconds after start
    sent: float                  # when the task really started, seconds after start
    prompt_tokens: int
    max_tokens: int
    outcome: str = "pending"     # completed | failed | rejected
    reason: str | None = None
    status: int | None = None
    ttft: float | None = None
    e2e: float | None = None
    tokens: int = 0              # counted from chunks (or usage when it says more precisely)
    end: float | None = None     # seconds after start
    tpot: float | None = None    # (e2e - ttft) / (tokens - 1), completed requests of >= 2 tokens
    max_tbt: float | None = None  # its largest gap between two tokens
    good: bool | None = None     # met every --goodput limit (None: no --goodput)
    usage_prompt_tokens: int | None = None   # what the server says it prefilled (usage)
    prompt: str | list | None = None         # with --save-outputs: what was sent
    output_ids: list | None = None           # with --save-outputs: the token ids streamed
    output_text: str | None = None           # with --save-outputs: the text streamed


@dataclass(slots=True)
class Collector:
    total: int
    keep_records: bool = True
    goodput: GoodputSLO | None = None
    sent: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0
    tokens: int = 0
    short_outputs: int = 0           # completed with fewer tokens than max_tokens
    usage_mismatch: int = 0          # usage.completion_tokens != chunks counted
    errors: Counter = field(default_factory=Counter)
    rejected_by_status: Counter = field(default_factory=Counter)
    first_error: str | None = None
    good: int = 0                    # completed and within every --goodput limit
    input_tokens: int = 0            # prompt tokens of completed requests
    output_tokens: int = 0           # output tokens of completed requests
    prompt_tokens_off: int = 0       # usage.prompt_tokens != the planned prompt length
    no_prompt_usage: int = 0         # completed without usage.prompt_tokens
    active: int = 0                  # requests on the wire now
    peak_in_flight: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    tbt: Histogram = field(default_factory=Histogram)
    tpot: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    send_lag: Histogram = field(default_factory=Histogram)
    first_arrival: float | None = None
    last_arrival: float | None = None
    last_end: float | None = None
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.completed + self.failed + self.rejected

    @property
    def in_flight(self) -> int:
        return self.sent - self.done

    def start(self, rec: RequestRecord) -> None:
        self.sent += 1
        if self.first_arrival is None:
            self.first_arrival = rec.arrival
        self.last_arrival = rec.arrival

    def begin(self, rec: RequestRecord) -> None:
        """The request leaves (`rec.sent` is final)."""
        self.send_lag.add(max(rec.sent - rec.arrival, 0.0))
        self.active += 1
        self.peak_in_flight = max(self.peak_in_flight, self.active)

    def finish(self, rec: RequestRecord, gaps: list[float]) -> None:
        assert rec.outcome in ("completed", "failed", "rejected"), rec.outcome
        self.tokens += rec.tokens
        if rec.end is not None:
            self.last_end = rec.end if self.last_end is None else max(self.last_end, rec.end)
        if rec.outcome == "completed":
            self.completed += 1
            self.ttft.add(rec.ttft)
            self.e2e.add(rec.e2e)
            for g in gaps:
                self.tbt.add(g)
            rec.max_tbt = max(gaps) if gaps else None
            rec.tpot = tpot(rec.ttft, rec.e2e, rec.tokens)
            if rec.tpot is not None:
                self.tpot.add(rec.tpot)
            self.input_tokens += rec.prompt_tokens
            self.output_tokens += rec.tokens
            if rec.usage_prompt_tokens is None:
                self.no_prompt_usage += 1
            elif rec.usage_prompt_tokens != rec.prompt_tokens:
                self.prompt_tokens_off += 1
            if self.goodput is not None:
                rec.good = self.goodput.meets(rec.ttft, rec.tpot, rec.max_tbt, rec.e2e)
                self.good += rec.good
            if rec.tokens < rec.max_tokens:
                self.short_outputs += 1
            if rec.reason:                       # usage disagreed with the chunks counted
                self.usage_mismatch += 1
        elif rec.outcome == "rejected":
            self.rejected += 1
            self.rejected_by_status[str(rec.status)] += 1
        else:
            self.failed += 1
            kind = rec.reason.split(":", 1)[0] if rec.reason else "unknown"
        if rec.outcome != "completed" and self.goodput is not None:
            rec.good = False
        if rec.outcome == "failed":
            self.errors[kind] += 1
            if self.first_error is None:
                self.first_error = rec.reason
        if self.keep_records:
            self.records.append(rec)


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


async def _stream_one(client, target: Target, body: dict, rec: RequestRecord, t_sched: float,
                      gaps: list[float]) -> None:
    """Send one request and fill `rec`: outcome, reason, times (relative to t_sched), tokens."""
    import httpx

    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else None
    started = False                  # got a 200 response head: a later break is a dropped stream
    counted = 0
    usage = None
    if target.save_outputs:
        rec.prompt = body["messages"][0]["content"] if target.chat else body["prompt"]
        rec.output_ids, rec.output_text = [], ""
    last = None
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
                    if event is None:
                        continue
                    if event is DONE:
                        if rec.ttft is None:
                            rec.outcome, rec.reason = "failed", "no_tokens: [DONE] before any token"
                            return
                        now = time.perf_counter()
                        rec.e2e = now - t_sched
                        rec.tokens = counted
                        if usage is not None:
                            if usage != counted:
                                rec.reason = f"usage says {usage} tokens, {counted} chunks counted"
                            rec.tokens = usage
                        rec.outcome = "completed"
                        return
                    k = chunk_tokens(event)
                    u = usage_tokens(event)
                    if u is not None:
                        usage = u
                    u = usage_tokens(event, "prompt_tokens")
                    if u is not None:
                        rec.usage_prompt_tokens = u
                    if target.save_outputs:
                        ids, text = chunk_output(event)
                        rec.output_ids += ids
                        rec.output_text += text
                    if k:
                        now = time.perf_counter()
                        if last is None:
                            rec.ttft = now - t_sched
                        else:
                            g = (now - last) / k
                            gaps.extend([g] * k)
                        last = now
                        counted += k
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
        rec.tokens = rec.tokens or counted


async def _run_one(client, target, body, rec, t0, collector: Collector,
                   slots: asyncio.Semaphore | None = None) -> None:
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
        await _stream_one(client, target, body, rec, t_sched, gaps)
    except Exception as e:                     # never lose a request to a bug or an odd error
        if rec.outcome in ("pending", "completed"):
            rec.outcome = "failed"
        rec.reason = f"client_error: {type(e).__name__}: {e}"
    finally:
        rec.end = time.perf_counter() - t0
        if began:
            collector.active -= 1
        if held:
            slots.release()
        if rec.outcome == "pending":           # cancelled while waiting for a slot
            rec.outcome, rec.reason = "failed", "client_error: request did not finish"
        collector.finish(rec, gaps)


async def replay(plan: Iterable[PlannedRequest], target: Target, make_prompt: Callable[[int], list[int]],
                 collector: Collector, on_start: Callable[[float], None] | None = None) -> float:
    """Send every planned request at its arrival time; return when all have finished. Returns
    the wall time in seconds from the first scheduled instant to the last completion. A planned
    request's own `prompt` is sent when it has one, else `make_prompt(prompt_tokens)`."""
    import httpx

    limits = httpx.Limits(max_connections=target.max_connections,
                          max_keepalive_connections=target.max_connections)
    timeout = httpx.Timeout(target.timeout, connect=min(target.timeout, 30.0))
    tasks: set[asyncio.Task] = set()
    slots = asyncio.Semaphore(target.max_concurrency) if target.max_concurrency else None
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
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
            task = asyncio.create_task(_run_one(client, target, body, rec, t0, collector, slots))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.wait(set(tasks))
        return time.perf_counter() - t0

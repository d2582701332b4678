"""What the client measures: one `RequestRecord` per request, and the `Collector` that ends each
exactly once (`finish`: completed, failed with a reason, or rejected) and keeps the counts and the
latency histograms of completed requests (TTFT, TBT, TPOT, E2E; the send lag of every request)
that summary.py turns into summary.json."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..report.histogram import Histogram
from .metrics import GoodputSLO, tpot


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
    cached_tokens: int = 0                   # of those, from its prefix cache (usage.prompt_tokens_details)
    conversation: int | None = None          # a conversation's turn (workload/conversations.py): which,
    turn: int | None = None                  # and its index there (0: the first)
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
    cached_tokens: int = 0           # prompt tokens of completed requests the server's prefix cache gave
    prompt_tokens_off: int = 0       # usage.prompt_tokens != the planned prompt length
    no_prompt_usage: int = 0         # completed without usage.prompt_tokens
    not_sent: int = 0                # conversations: turns not sent, their conversation ended by a failed turn
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
        # open loop: in arrival order; a conversation's turns: about in arrival order
        self.first_arrival = rec.arrival if self.first_arrival is None else min(self.first_arrival, rec.arrival)
        self.last_arrival = rec.arrival if self.last_arrival is None else max(self.last_arrival, rec.arrival)

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
            ttft, e2e = rec.ttft, rec.e2e
            assert ttft is not None and e2e is not None, "a completed request has its first and last token times"
            self.completed += 1
            self.ttft.add(ttft)
            self.e2e.add(e2e)
            for g in gaps:
                self.tbt.add(g)
            rec.max_tbt = max(gaps) if gaps else None
            rec.tpot = tpot(rec.ttft, rec.e2e, rec.tokens)
            if rec.tpot is not None:
                self.tpot.add(rec.tpot)
            self.input_tokens += rec.prompt_tokens
            self.output_tokens += rec.tokens
            self.cached_tokens += rec.cached_tokens
            if rec.usage_prompt_tokens is None:
                self.no_prompt_usage += 1
            elif rec.usage_prompt_tokens != rec.prompt_tokens:
                self.prompt_tokens_off += 1
            if self.goodput is not None:
                rec.good = self.goodput.meets(ttft, rec.tpot, rec.max_tbt, e2e)
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

"""A whole live benchmark: validate, ask the server its limits, plan, replay, summarise, write.

`run_bench(BenchOptions(...))` returns the summary dict and writes `out/summary.json` and
`out/requests.jsonl` (one line per request: schedule, outcome, reason, TTFT, TPOT, E2E, tokens).
Before anything is sent, `GET /v1/models` names the model and its context, and a plan the server
would refuse (an unknown model, prompt + output over the context) is refused here unless
`--no-server-check` (or clipped, `--clip-to-context`). After the run, `failure_message` says
whether more than `--max-failure-ratio` of the requests did not complete. Requests come from the
simulator's workloads, `random` or `sharegpt` (datasets.py), conversations sent turn by turn
(conversations.py), as token ids or text (prompts.py); arrivals from arrivals.py.

The options and their checks: options.py; the server's answers before the run: server_check.py;
the plan of each source: planning.py. This module: the run itself and its verdict. docs/bench.md
describes every option.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from ..heap import frozen_heap
from .options import ENDPOINTS, BenchOptions, base_url, validate
from .planning import Plan, make_plan
from .server_check import choose_model, preflight

if TYPE_CHECKING:
    from .collector import Collector, RequestRecord

SAVED_ONLY = ("prompt", "output_ids", "output_text")   # requests.jsonl keys written with --save-outputs only
CONVERSATION_ONLY = ("conversation", "turn")             # ... and with a conversation workload only


def run_bench(o: BenchOptions, return_records: bool = False):
    """The summary dict; with `return_records`, `(summary, records)` (one `RequestRecord` per
    request, in index order; empty unless `o.keep_records`)."""
    from .client import Collector
    from .metrics import parse_goodput, parse_percentiles
    from .summary import bench_summary

    validate(o)
    goodput = parse_goodput(o.goodput)
    percentiles = parse_percentiles(o.percentiles)
    base = base_url(o.url)
    if o.dataset == "sharegpt":
        from .datasets import read_sharegpt

        assert o.dataset_path is not None, "validate() requires --dataset-path with --dataset sharegpt"
        read_sharegpt(o.dataset_path)        # a bad file is refused before the server is asked
    models = preflight(base, o.api_key)
    model, ctx = choose_model(models, o.model, base, o.server_check)
    plan, tokenize_calls = make_plan(o, base, model, ctx)
    collector = Collector(plan.total, keep_records=o.keep_records, goodput=goodput)
    wall = _send(o, plan, base, model, collector)
    options = _run_options(o, plan, ctx, tokenize_calls, collector)
    summary = bench_summary(collector, plan.workload, url=base, model=model, wall_s=wall, options=options,
                            percentiles=percentiles)
    records = sorted(collector.records, key=lambda r: r.index)
    if o.out is not None:
        from ..report.summary import write_summary

        write_summary(summary, o.out)
        if o.keep_records:
            _write_records(Path(o.out) / "requests.jsonl", records, o.save_outputs, plan.conversations is not None)
    if return_records:
        return summary, records
    return summary


def _send(o: BenchOptions, plan: Plan, base: str, model: str | None, collector: Collector) -> float:
    """Send the plan (open loop, or a conversation's turns one after another); the wall time in
    seconds."""
    from .client import Target, replay
    from .plan import PromptMaker

    target = Target(base + ENDPOINTS[o.endpoint], model, o.api_key, o.timeout, o.max_connections, o.ignore_eos,
                    chat=o.endpoint == "chat", max_concurrency=o.max_concurrency, save_outputs=o.save_outputs)
    if plan.conversations is not None:
        from .conversations import converse

        sender = converse(plan.conversations, target, collector)
    else:
        prompts = PromptMaker(o.seed, o.token_id_min, o.token_id_max)
        sender = replay(plan.requests(), target, prompts, collector)
    with frozen_heap():  # no full pass of the collector over the plan and the imports while timing (heap.py)
        if o.progress and sys.stderr.isatty():
            wall = asyncio.run(_with_progress(sender, collector))
        else:
            wall = asyncio.run(sender)
    assert collector.done == collector.sent, (collector.done, collector.sent)
    assert plan.conversations is not None or collector.sent == plan.total, (collector.sent, plan.total)
    return wall


def _run_options(o: BenchOptions, plan: Plan, ctx: int | None, tokenize_calls: int, collector: Collector) -> dict:
    """summary.json's `bench` options: what the run was asked and what it planned."""
    options = {"endpoint": ENDPOINTS[o.endpoint], "seed": o.seed, "arrivals": plan.arrivals,
               "max_prompt_tokens": o.max_prompt_tokens, "max_tokens_cap": o.max_tokens_cap,
               "max_context": o.max_context, "token_id_range": [o.token_id_min, o.token_id_max],
               "timeout_s": o.timeout, "ignore_eos": o.ignore_eos, "prompt_format": o.fmt,
               "dataset": o.dataset, "burstiness": o.burstiness, "max_concurrency": o.max_concurrency,
               "num_prompts": o.num_prompts, "server_max_model_len": ctx, "clip_to_context": o.clip_to_context,
               "server_check": o.server_check, "tokenize_calls": tokenize_calls}
    if plan.conversations is not None:
        conv = plan.conversations
        options.update({"conversation": conv.shape.describe(), "conversations": sum(1 for _ in conv),
                        "turns_not_sent": collector.not_sent})
    return options


def _write_records(path: Path, records: list[RequestRecord], save_outputs: bool, conversations: bool) -> None:
    """requests.jsonl: one line a request, without the keys of what the run did not do (saved
    outputs, conversations)."""
    left_out = (SAVED_ONLY if not save_outputs else ()) + (CONVERSATION_ONLY if not conversations else ())
    with path.open("w") as f:
        for rec in records:
            d = asdict(rec)
            for k in left_out:
                del d[k]
            f.write(json.dumps(d) + "\n")


def failure_message(summary: dict, max_failure_ratio: float) -> str | None:
    """The one line to exit with when more than `max_failure_ratio` of the requests did not
    complete (failed or rejected), naming the count and the first failure; else None."""
    n, b = summary["requests"], summary["bench"]
    bad = summary["failed"] + b["rejected"]
    if not n or bad / n <= max_failure_ratio:
        return None
    first = b["first_error"] or next((f"http_{k} (rejected)" for k in b["rejected_by_status"]), "unknown")
    return (f"{bad:,} of {n:,} requests did not complete ({summary['failed']:,} failed, {b['rejected']:,} "
            f"rejected; more than --max-failure-ratio {max_failure_ratio:g}); first: {first}")


async def _with_progress(coro, c):
    import time

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    def line(t0: float) -> Text:
        return Text(f"bench: sent {c.sent:,}/{c.total:,}  done {c.done:,}  in flight {c.in_flight:,}  "
                    f"errors {c.failed:,}  rejected {c.rejected:,}  elapsed {time.perf_counter() - t0:,.1f} s")

    t0 = time.perf_counter()
    with Live(line(t0), console=Console(stderr=True), transient=True, auto_refresh=False) as live:
        task = asyncio.ensure_future(coro)
        while not task.done():
            await asyncio.wait({task}, timeout=0.25)
            live.update(line(t0), refresh=True)
        return task.result()

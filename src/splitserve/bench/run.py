"""A whole live benchmark: validate, ask the server its limits, plan, replay, summarise, write.

`run_bench(BenchOptions(...))` returns the summary dict and writes `out/summary.json` and
`out/requests.jsonl` (one line per request: schedule, outcome, reason, TTFT, TPOT, E2E, tokens).

Before anything is sent: `GET /v1/models` names the model (the first listed, unless `--model`)
and its context (`max_model_len`, vLLM's field). Unless `--no-server-check`, an unknown `--model`
is refused, and so is a plan whose prompt + output exceeds the context (one line saying how many
and the longest), since the server would refuse each of them; `--clip-to-context` clips every
request to the context instead (as `--max-context`, with the server's number). After the run,
`failure_message` says whether more than `--max-failure-ratio` of the requests did not complete
(the command then exits 1 with that one line).

Sources of requests (`--dataset`): `workload` (`--workload`: coding, conversation or an Azure
trace, the simulator's requests), `random` and `sharegpt` (datasets.py); arrivals: the
workload's own, or gamma with `--burstiness` at `--rps` (arrivals.py). Prompts (`--prompt-format`):
token ids (seeded, plan.PromptMaker) or text of the same token count (prompts.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import UserError

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
ENDPOINT = ENDPOINTS["completions"]
DATASETS = ("workload", "random", "sharegpt")
SAVED_ONLY = ("prompt", "output_ids", "output_text")   # requests.jsonl keys written with --save-outputs only


@dataclass(slots=True)
class BenchOptions:
    url: str
    workload: str = "coding"
    rps: float = 1.0
    duration: float | None = 10.0
    out: str | Path | None = None
    seed: int = 0
    arrivals: str = "auto"
    model: str | None = None
    api_key: str | None = None
    max_tokens_cap: int | None = None
    max_prompt_tokens: int | None = None
    max_context: int | None = None
    token_id_min: int = 1
    token_id_max: int = 255
    timeout: float = 300.0
    max_connections: int = 1000
    ignore_eos: bool = True
    progress: bool = False
    keep_records: bool = True
    endpoint: str = "completions"
    prompt_format: str | None = None          # ids | text; None: ids for completions, text for chat
    dataset: str = "workload"
    dataset_path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    num_prompts: int | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    goodput: list[str] | None = None
    percentiles: str = "50,90,99"
    server_check: bool = True
    clip_to_context: bool = False
    save_outputs: bool = False

    @property
    def fmt(self) -> str:
        return self.prompt_format or ("text" if self.endpoint == "chat" else "ids")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(msg)


def base_url(url: str) -> str:
    """`http://host:port` (a trailing `/v1`, `/v1/completions` or `/v1/chat/completions` is
    accepted and dropped)."""
    u = url.strip().rstrip("/")
    parts = urlsplit(u)
    _check(parts.scheme in ("http", "https") and bool(parts.netloc),
           f"--url must look like http://HOST:PORT, got {url!r}")
    for tail in (*ENDPOINTS.values(), "/v1"):
        if u.endswith(tail):
            u = u[: -len(tail)]
            break
    return u


def validate(o: BenchOptions) -> None:
    _check(math.isfinite(o.rps) and o.rps > 0, f"--rps must be a positive number, got {o.rps:g}")
    _check(o.duration is not None or o.num_prompts is not None, "give --duration (seconds of arrivals) or --num-prompts")
    _check(o.duration is None or (math.isfinite(o.duration) and o.duration > 0),
           f"--duration must be positive seconds, got {o.duration}")
    _check(o.num_prompts is None or o.num_prompts >= 1, f"--num-prompts must be at least 1, got {o.num_prompts}")
    _check(math.isfinite(o.timeout) and o.timeout > 0, f"--timeout must be positive seconds, got {o.timeout:g}")
    _check(o.max_tokens_cap is None or o.max_tokens_cap >= 1,
           f"--max-tokens-cap must be at least 1, got {o.max_tokens_cap}")
    _check(o.max_prompt_tokens is None or o.max_prompt_tokens >= 1,
           f"--max-prompt-tokens must be at least 1, got {o.max_prompt_tokens}")
    _check(0 <= o.token_id_min <= o.token_id_max,
           f"token ids must satisfy 0 <= --token-id-min <= --token-id-max, got {o.token_id_min}..{o.token_id_max}")
    _check(o.max_connections >= 1, f"--max-connections must be at least 1, got {o.max_connections}")
    _check(o.endpoint in ENDPOINTS, f"--endpoint must be completions or chat, got {o.endpoint!r}")
    _check(o.prompt_format in (None, "ids", "text"), f"--prompt-format must be ids or text, got {o.prompt_format!r}")
    _check(not (o.endpoint == "chat" and o.fmt == "ids"),
           "--endpoint chat sends text messages: use --prompt-format text (the default for chat)")
    _check(o.dataset in DATASETS, f"--dataset must be one of {', '.join(DATASETS)}, got {o.dataset!r}")
    _check((o.dataset == "sharegpt") == (o.dataset_path is not None),
           "--dataset sharegpt needs --dataset-path FILE.json" if o.dataset == "sharegpt"
           else "--dataset-path goes with --dataset sharegpt")
    _check(math.isfinite(o.burstiness) and o.burstiness > 0, f"--burstiness must be positive, got {o.burstiness:g}")
    _check(o.max_concurrency is None or o.max_concurrency >= 1,
           f"--max-concurrency must be at least 1, got {o.max_concurrency}")


def preflight(base: str, api_key: str | None, timeout: float = 5.0) -> list[dict]:
    """Fail early, in one line, when nothing answers at `base`; return the served models
    (`GET /v1/models`'s `data`, each a dict with an `id`; empty when the server does not list them)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        r = httpx.get(base + "/v1/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise UserError(f"cannot reach the server at {base}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise UserError(f"the server at {base} refused the API key (HTTP {r.status_code}); give --api-key")
    if r.status_code != 200:
        return []
    try:
        return [m for m in r.json().get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError):
        return []


def choose_model(models: list[dict], wanted: str | None, base: str, check: bool) -> tuple[str | None, int | None]:
    """(model name to send, its context length or None)."""
    if wanted is None:
        m = models[0] if models else None
    else:
        m = next((x for x in models if x["id"] == wanted), None)
        if m is None and models and check:
            raise UserError(f"the server at {base} does not serve the model '{wanted}' (it serves: "
                            f"{', '.join(x['id'] for x in models)}); fix --model, or send anyway with --no-server-check")
    name = wanted if wanted is not None else (m["id"] if m else None)
    ctx = m.get("max_model_len") if m else None
    return name, ctx if isinstance(ctx, int) and ctx > 0 else None


def check_context(plan: Iterable, ctx: int) -> None:
    """Refuse (one line) a plan with a request whose prompt + output exceeds `ctx`."""
    over = total = 0
    longest = None
    for r in plan:
        total += 1
        n = r.prompt_tokens + r.max_tokens
        if n > ctx:
            over += 1
            if longest is None or n > longest[0] + longest[1]:
                longest = (r.prompt_tokens, r.max_tokens)
    if over:
        raise UserError(f"{over:,} of {total:,} requests need more than the server's context of {ctx:,} tokens "
                        f"(the longest: {longest[0]:,} prompt + {longest[1]:,} output tokens); cap them with "
                        f"--max-prompt-tokens and --max-tokens-cap, clip them with --clip-to-context, or send "
                        f"them anyway with --no-server-check")


@dataclass(slots=True)
class Plan:
    """What a run sends: `requests()` iterates the planned requests (again each call)."""
    requests: Callable[[], Iterable]
    total: int
    workload: dict                    # summary.json's `workload`: name, rps, duration_s
    arrivals: str


def _arrival_times(o: BenchOptions) -> list[float]:
    from .arrivals import gamma_arrivals

    return list(gamma_arrivals(o.rps, o.burstiness, o.seed, duration=o.duration, count=o.num_prompts))


def _workload_plan(o: BenchOptions, max_context: int | None) -> Plan:
    from ..workload import make_workload
    from .plan import Caps, PlannedRequest, plan_requests

    caps = Caps(o.max_prompt_tokens, o.max_tokens_cap)
    if o.burstiness == 1.0:
        wl = make_workload(o.workload, rps=float(o.rps), duration=o.duration, seed=o.seed, arrivals=o.arrivals,
                           max_context=max_context, max_requests=o.num_prompts)
        total = sum(1 for _ in wl)
        return Plan(lambda: plan_requests(wl, caps), total,
                    {"name": wl.name, "rps": wl.rps, "duration_s": wl.duration}, wl.arrivals)
    # the workload's sizes in its order, at gamma arrivals: Poisson-like sources only
    wl = make_workload(o.workload, rps=float(o.rps), duration=None, seed=o.seed,
                       arrivals="poisson" if o.arrivals == "auto" else o.arrivals,
                       max_context=max_context, max_requests=2**62)
    _check(wl.arrivals == "poisson", "--burstiness reshapes Poisson arrivals; a trace replayed at its own "
                                     "timestamps has none: add --arrivals poisson")
    times = _arrival_times(o)
    sizes = [(p.prompt_tokens, p.max_tokens) for p, _ in zip(plan_requests(wl, caps), times)]
    reqs = [PlannedRequest(i, t, p, m) for i, (t, (p, m)) in enumerate(zip(times, sizes))]
    return Plan(lambda: reqs, len(reqs), {"name": wl.name, "rps": float(o.rps), "duration_s": o.duration},
                f"gamma(burstiness={o.burstiness:g})")


def _random_plan(o: BenchOptions, max_context: int | None) -> Plan:
    from .datasets import random_sizes
    from .plan import Caps, PlannedRequest, capped

    times = _arrival_times(o)
    caps = Caps(o.max_prompt_tokens, o.max_tokens_cap)
    sizes = random_sizes(len(times), o.random_input_len, o.random_output_len, o.random_range_ratio, o.seed)
    reqs = [PlannedRequest(i, t, *capped(p, m, caps, max_context)) for i, (t, (p, m)) in enumerate(zip(times, sizes))]
    name = f"random(in={o.random_input_len},out={o.random_output_len},ratio={o.random_range_ratio:g})"
    return Plan(lambda: reqs, len(reqs), {"name": name, "rps": float(o.rps), "duration_s": o.duration},
                f"gamma(burstiness={o.burstiness:g})")


async def _sharegpt_plan(o: BenchOptions, max_context: int | None, tok, texts) -> tuple[Plan, dict]:
    """The plan (prompts as ids, or as text where uncapped) and {index: source text} of the
    text prompts a cap shortened (made by `texts` after the context check)."""
    from .datasets import MIN_SHAREGPT_TOKENS, read_sharegpt, sharegpt_order
    from .plan import Caps, PlannedRequest, capped

    convs = read_sharegpt(o.dataset_path)
    order = sharegpt_order(len(convs), o.seed)
    times = _arrival_times(o)
    caps = Caps(o.max_prompt_tokens, o.max_tokens_cap)

    async def sized(i: int):
        c = convs[i]
        reply = len(await tok.ids(c.reply, add_special_tokens=False))
        if o.fmt == "ids":
            ids = await tok.ids(c.prompt, add_special_tokens=True)
            return (ids, len(ids), reply, c.prompt)
        return (c.prompt, await tok.count(c.prompt), reply, c.prompt)

    usable: list = []
    cache: dict[int, tuple] = {}
    k = 0
    while len(usable) < len(times):
        if k >= len(order) and not usable:
            raise UserError(f"--dataset-path {o.dataset_path}: no conversation has a prompt and a reply of at "
                            f"least {MIN_SHAREGPT_TOKENS} tokens")
        batch = [order[(k + j) % len(order)] for j in range(min(64, len(times) - len(usable)))]
        k += len(batch)
        todo = [i for i in dict.fromkeys(batch) if i not in cache]
        for i, got in zip(todo, await asyncio.gather(*(sized(i) for i in todo))):
            cache[i] = got
        usable += [cache[i] for i in batch if cache[i][1] >= MIN_SHAREGPT_TOKENS and cache[i][2] >= MIN_SHAREGPT_TOKENS]
    reqs, sources = [], {}
    for idx, (t, (prompt, n, reply, text)) in enumerate(zip(times, usable)):
        p, m = capped(n, reply, caps, max_context)
        if o.fmt == "ids":
            prompt = prompt[:p]
        elif p != n:
            prompt, sources[idx] = None, text
        reqs.append(PlannedRequest(idx, t, p, m, prompt))
    name = f"sharegpt:{Path(o.dataset_path).name}"
    return Plan(lambda: reqs, len(reqs), {"name": name, "rps": float(o.rps), "duration_s": o.duration},
                f"gamma(burstiness={o.burstiness:g})"), sources


async def _with_server_tokenizer(base: str, model: str | None, o: BenchOptions, fn):
    import httpx

    from .prompts import ServerTokenizer, TextPrompts

    headers = {"Authorization": f"Bearer {o.api_key}"} if o.api_key else None
    async with httpx.AsyncClient(timeout=httpx.Timeout(o.timeout, connect=min(o.timeout, 30.0))) as client:
        tok = ServerTokenizer(client, base, model, headers, chat=o.endpoint == "chat")
        result = await fn(tok, TextPrompts(tok, o.seed))
        return result, tok.calls


def make_plan(o: BenchOptions, base: str, model: str | None, ctx: int | None) -> tuple[Plan, int]:
    """The checked plan, text prompts made; and the number of tokenize calls it took."""
    from .plan import PlannedRequest

    max_context = o.max_context
    if o.clip_to_context:
        _check(ctx is not None, f"the server at {base} does not report its context (max_model_len in "
                                f"GET /v1/models): give --max-context instead of --clip-to-context")
        max_context = ctx if max_context is None else min(max_context, ctx)

    async def build(tok, texts):
        sources: dict = {}
        if o.dataset == "sharegpt":
            plan, sources = await _sharegpt_plan(o, max_context, tok, texts)
        else:
            plan = _workload_plan(o, max_context) if o.dataset == "workload" else _random_plan(o, max_context)
        _check(plan.total > 0, f"the workload has no requests in {o.duration} s at {o.rps:g} req/s; "
                               f"give a longer --duration or a higher --rps")
        if o.server_check and ctx is not None:
            check_context(plan.requests(), ctx)
        if o.fmt == "text" and o.dataset != "sharegpt" or sources:
            reqs = list(plan.requests())
            todo = [r for r in reqs if r.prompt is None]
            made = await texts.make_all([(r.prompt_tokens, sources.get(r.index)) for r in todo])
            by_index = {r.index: PlannedRequest(r.index, r.arrival, n, r.max_tokens, text)
                        for r, (text, n) in zip(todo, made)}
            reqs = [by_index.get(r.index, r) for r in reqs]
            plan = Plan(lambda: reqs, plan.total, plan.workload, plan.arrivals)
        return plan

    needs_server = o.fmt == "text" or o.dataset == "sharegpt"
    if not needs_server:
        return asyncio.run(build(None, None)), 0
    return asyncio.run(_with_server_tokenizer(base, model, o, build))


def run_bench(o: BenchOptions, return_records: bool = False):
    """The summary dict; with `return_records`, `(summary, records)` (one `RequestRecord` per
    request, in index order; empty unless `o.keep_records`)."""
    from .client import Collector, Target, replay
    from .metrics import parse_goodput, parse_percentiles
    from .plan import PromptMaker
    from .summary import bench_summary

    validate(o)
    goodput = parse_goodput(o.goodput)
    percentiles = parse_percentiles(o.percentiles)
    base = base_url(o.url)
    if o.dataset == "sharegpt":
        from .datasets import read_sharegpt

        read_sharegpt(o.dataset_path)        # a bad file is refused before the server is asked
    models = preflight(base, o.api_key)
    model, ctx = choose_model(models, o.model, base, o.server_check)
    plan, tokenize_calls = make_plan(o, base, model, ctx)
    target = Target(base + ENDPOINTS[o.endpoint], model, o.api_key, o.timeout, o.max_connections, o.ignore_eos,
                    chat=o.endpoint == "chat", max_concurrency=o.max_concurrency, save_outputs=o.save_outputs)
    collector = Collector(plan.total, keep_records=o.keep_records, goodput=goodput)
    prompts = PromptMaker(o.seed, o.token_id_min, o.token_id_max)

    if o.progress and sys.stderr.isatty():
        wall = asyncio.run(_with_progress(replay(plan.requests(), target, prompts, collector), collector))
    else:
        wall = asyncio.run(replay(plan.requests(), target, prompts, collector))
    assert collector.done == collector.sent == plan.total, (collector.done, collector.sent, plan.total)

    options = {"endpoint": ENDPOINTS[o.endpoint], "seed": o.seed, "arrivals": plan.arrivals,
               "max_prompt_tokens": o.max_prompt_tokens, "max_tokens_cap": o.max_tokens_cap,
               "max_context": o.max_context, "token_id_range": [o.token_id_min, o.token_id_max],
               "timeout_s": o.timeout, "ignore_eos": o.ignore_eos, "prompt_format": o.fmt,
               "dataset": o.dataset, "burstiness": o.burstiness, "max_concurrency": o.max_concurrency,
               "num_prompts": o.num_prompts, "server_max_model_len": ctx, "clip_to_context": o.clip_to_context,
               "server_check": o.server_check, "tokenize_calls": tokenize_calls}
    summary = bench_summary(collector, plan.workload, url=base, model=model, wall_s=wall, options=options,
                            percentiles=percentiles)
    if o.out is not None:
        from ..report.summary import write_summary

        write_summary(summary, o.out)
        if o.keep_records:
            with (Path(o.out) / "requests.jsonl").open("w") as f:
                for rec in sorted(collector.records, key=lambda r: r.index):
                    d = asdict(rec)
                    if not o.save_outputs:
                        for k in SAVED_ONLY:
                            del d[k]
                    f.write(json.dumps(d) + "\n")
    if return_records:
        return summary, sorted(collector.records, key=lambda r: r.index)
    return summary


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

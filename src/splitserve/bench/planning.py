"""What a run sends, as a `Plan`: the requests of `--dataset` (the simulator's workload, random
sizes, or ShareGPT conversations through the server's tokenizer) at their arrivals (the
workload's own, or gamma with `--burstiness`), capped, checked against the server's context, and
with text prompts made where `--prompt-format text` asks for them (`make_plan`). A conversation
workload's plan is its `Conversations` (sent closed-loop, conversations.py) and its first turns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..workload import request_workload
from ..workload.conversations import SHAPES, Conversations
from .options import BenchOptions, check
from .server_check import check_context


@dataclass(slots=True)
class Plan:
    """What a run sends: `requests()` iterates the planned requests (again each call)."""
    requests: Callable[[], Iterable]
    total: int
    workload: dict                    # summary.json's `workload`: name, rps, duration_s
    arrivals: str
    conversations: Conversations | None = None  # multiturn, sysprompt; requests() its first turns


def _arrival_times(o: BenchOptions) -> list[float]:
    from .arrivals import gamma_arrivals

    return list(gamma_arrivals(o.rps, o.burstiness, o.seed, duration=o.duration, count=o.num_prompts))


def workload_plan(o: BenchOptions, max_context: int | None) -> Plan:
    from .plan import Caps, PlannedRequest, plan_requests

    caps = Caps(o.max_prompt_tokens, o.max_tokens_cap)
    if o.workload in SHAPES:
        return _conversation_plan(o, max_context)
    if o.burstiness == 1.0:
        wl = request_workload(o.workload, rps=float(o.rps), duration=o.duration, seed=o.seed,
                              arrivals=o.arrivals, max_context=max_context, max_requests=o.num_prompts)
        total = sum(1 for _ in wl)
        return Plan(lambda: plan_requests(wl, caps), total,
                    {"name": wl.name, "rps": wl.rps, "duration_s": wl.duration}, wl.arrivals)
    # the workload's sizes in its order, at gamma arrivals: Poisson-like sources only
    wl = request_workload(o.workload, rps=float(o.rps), duration=None, seed=o.seed,
                          arrivals="poisson" if o.arrivals == "auto" else o.arrivals,
                          max_context=max_context, max_requests=2**62)
    check(wl.arrivals == "poisson", "--burstiness reshapes Poisson arrivals; a trace replayed at its own "
                                     "timestamps has none: add --arrivals poisson")
    times = _arrival_times(o)
    sizes = [(p.prompt_tokens, p.max_tokens) for p, _ in zip(plan_requests(wl, caps), times)]
    reqs = [PlannedRequest(i, t, p, m) for i, (t, (p, m)) in enumerate(zip(times, sizes))]
    return Plan(lambda: reqs, len(reqs), {"name": wl.name, "rps": float(o.rps), "duration_s": o.duration},
                f"gamma(burstiness={o.burstiness:g})")


def _conversation_plan(o: BenchOptions, max_context: int | None) -> Plan:
    from ..workload import make_workload
    from .conversations import first_requests, planned_turns

    conv = make_workload(o.workload, rps=float(o.rps), duration=o.duration, seed=o.seed, max_context=max_context,
                         conversation=o.conversation)
    if not isinstance(conv, Conversations):
        raise AssertionError(f"{o.workload} is requests, not conversations")
    return Plan(lambda: first_requests(conv), planned_turns(conv),
                {"name": conv.name, "rps": conv.rps, "duration_s": conv.duration},
                "poisson starts, closed-loop turns", conv)


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

    path = o.dataset_path
    assert path is not None, "validate() requires --dataset-path with --dataset sharegpt"
    convs = read_sharegpt(path)
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
    name = f"sharegpt:{Path(path).name}"
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
        if ctx is None:
            raise UserError(f"the server at {base} does not report its context (max_model_len in "
                            f"GET /v1/models): give --max-context instead of --clip-to-context")
        max_context = ctx if max_context is None else min(max_context, ctx)

    async def build(tok, texts) -> Plan:
        sources: dict = {}
        if o.dataset == "sharegpt":
            plan, sources = await _sharegpt_plan(o, max_context, tok, texts)
        else:
            plan = workload_plan(o, max_context) if o.dataset == "workload" else _random_plan(o, max_context)
        check(plan.total > 0, f"the workload has no requests in {o.duration} s at {o.rps:g} req/s; "
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

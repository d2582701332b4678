"""A whole live benchmark: validate, check the server answers, replay, summarise, write.

`run_bench(BenchOptions(...))` returns the summary dict and writes `out/summary.json` and
`out/requests.jsonl` (one line per request: schedule, outcome, reason, TTFT, E2E, tokens).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import UserError

ENDPOINT = "/v1/completions"


@dataclass(slots=True)
class BenchOptions:
    url: str
    workload: str = "coding"
    rps: float = 1.0
    duration: float = 10.0
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


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(msg)


def base_url(url: str) -> str:
    """`http://host:port` (a trailing `/v1` or `/v1/completions` is accepted and dropped)."""
    u = url.strip().rstrip("/")
    parts = urlsplit(u)
    _check(parts.scheme in ("http", "https") and bool(parts.netloc),
           f"--url must look like http://HOST:PORT, got {url!r}")
    for tail in (ENDPOINT, "/v1"):
        if u.endswith(tail):
            u = u[: -len(tail)]
            break
    return u


def validate(o: BenchOptions) -> None:
    _check(math.isfinite(o.rps) and o.rps > 0, f"--rps must be a positive number, got {o.rps:g}")
    _check(math.isfinite(o.duration) and o.duration > 0,
           f"--duration must be positive seconds, got {o.duration:g}")
    _check(math.isfinite(o.timeout) and o.timeout > 0, f"--timeout must be positive seconds, got {o.timeout:g}")
    _check(o.max_tokens_cap is None or o.max_tokens_cap >= 1,
           f"--max-tokens-cap must be at least 1, got {o.max_tokens_cap}")
    _check(o.max_prompt_tokens is None or o.max_prompt_tokens >= 1,
           f"--max-prompt-tokens must be at least 1, got {o.max_prompt_tokens}")
    _check(0 <= o.token_id_min <= o.token_id_max,
           f"token ids must satisfy 0 <= --token-id-min <= --token-id-max, got {o.token_id_min}..{o.token_id_max}")
    _check(o.max_connections >= 1, f"--max-connections must be at least 1, got {o.max_connections}")


def preflight(base: str, api_key: str | None, timeout: float = 5.0) -> list[str]:
    """Fail early, in one line, when nothing answers at `base`; return the served model ids
    (`GET /v1/models`; empty when the server does not list them)."""
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
        return [m["id"] for m in r.json().get("data", []) if isinstance(m, dict) and "id" in m]
    except (ValueError, AttributeError):
        return []


def run_bench(o: BenchOptions, return_records: bool = False):
    """The summary dict; with `return_records`, `(summary, records)` (one `RequestRecord` per
    request, in index order; empty unless `o.keep_records`)."""
    from ..workload import make_workload
    from .client import Collector, Target, replay
    from .plan import Caps, PromptMaker, plan_requests
    from .summary import bench_summary

    validate(o)
    base = base_url(o.url)
    wl = make_workload(o.workload, rps=float(o.rps), duration=float(o.duration), seed=o.seed, arrivals=o.arrivals,
                       max_context=o.max_context)
    total = sum(1 for _ in wl)
    _check(total > 0, f"the workload has no requests in {o.duration:g} s at {o.rps:g} req/s; "
                      f"give a longer --duration or a higher --rps")
    models = preflight(base, o.api_key)
    model = o.model if o.model is not None else (models[0] if models else None)
    target = Target(base + ENDPOINT, model, o.api_key, o.timeout, o.max_connections, o.ignore_eos)
    collector = Collector(total, keep_records=o.keep_records)
    plan = plan_requests(wl, Caps(o.max_prompt_tokens, o.max_tokens_cap))
    prompts = PromptMaker(o.seed, o.token_id_min, o.token_id_max)

    if o.progress and sys.stderr.isatty():
        wall = asyncio.run(_with_progress(replay(plan, target, prompts, collector), collector))
    else:
        wall = asyncio.run(replay(plan, target, prompts, collector))
    assert collector.done == collector.sent == total, (collector.done, collector.sent, total)

    options = {"endpoint": ENDPOINT, "seed": o.seed, "arrivals": wl.arrivals,
               "max_prompt_tokens": o.max_prompt_tokens, "max_tokens_cap": o.max_tokens_cap,
               "max_context": o.max_context, "token_id_range": [o.token_id_min, o.token_id_max],
               "timeout_s": o.timeout, "ignore_eos": o.ignore_eos}
    summary = bench_summary(collector, wl, url=base, model=model, wall_s=wall, options=options)
    if o.out is not None:
        from ..report.summary import write_summary

        write_summary(summary, o.out)
        if o.keep_records:
            with (Path(o.out) / "requests.jsonl").open("w") as f:
                for rec in sorted(collector.records, key=lambda r: r.index):
                    f.write(json.dumps(asdict(rec)) + "\n")
    if return_records:
        return summary, sorted(collector.records, key=lambda r: r.index)
    return summary


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

"""What the serving path adds to the engine: a live `splitserve serve` with one mixed worker,
unloaded, answering sequential streaming requests of one shape, against the same engine's times
alone: the steps the worker logged for the same requests, so that both sides of each difference
are timed in the same seconds (against the profile's rows, timed minutes before, a few ms of
overhead would drown in the host's drift).

- step overhead: per engine step, outside the model (the worker's loop: messages in and out,
  reports, polling; the router relaying each step's tokens): median live TBT - the median decode
  step of the same requests (the worker's step log);
- request overhead: per request, once (HTTP, checks, routing, the hops to the worker and back):
  median live TTFT - the median prompt step of the same requests - one step overhead;
- background CPU: per request, the CPU seconds that serve's processes (front end, router, the
  worker outside its engine steps) and the client spend, other than the engine steps themselves
  (Linux: from /proc; 0 elsewhere).

The first two are at least 0. The simulator adds the first to every step of a measured machine
and the second to each request's TTFT and E2E; the third takes its share of the host's cores from
the workers when they are all busy (twin/machine.py).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import httpx

PROMPT = 512
TOKENS = 16
REQUESTS = 8


def probe(url: str, model: str, prompt: int = PROMPT, tokens: int = TOKENS, n: int = REQUESTS) -> tuple[float, float]:
    """(median TTFT, median mean gap between tokens) of n sequential streaming requests, after one
    warm-up."""
    ttfts, gaps = [], []
    with httpx.Client(timeout=120) as c:
        for i in range(n + 1):
            body = {"model": model, "prompt": [(7 * i + j) % 250 + 3 for j in range(prompt)], "max_tokens": tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": True}
            t0 = time.perf_counter()
            first = None
            with c.stream("POST", url + "/v1/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line.startswith("data: {") and first is None:
                        first = time.perf_counter() - t0
            total = time.perf_counter() - t0
            if first is None:
                raise RuntimeError(f"{url}: a streamed completion sent no data")
            if i > 0:
                ttfts.append(first)
                gaps.append((total - first) / (tokens - 1))
            time.sleep(0.2)
    return statistics.median(ttfts), statistics.median(gaps)


def measure_path(facts: dict, prompt_ms: float, token_ms: float, out: Path) -> dict:
    """Serve (baseline, 1 mixed worker, as the profile's engine) and probe it; the overheads."""
    from .run import TwinSpec, serving

    from .steps import read_steps

    with serving(TwinSpec(design="baseline", machines=1), SimpleNamespace(facts=facts), out) as (url, pid):
        probe(url, facts["model"], n=1)  # warm the path up
        start, cpu0, own0 = time.time(), tree_cpu(pid), time.process_time()
        ttft, gap = probe(url, facts["model"])
        cpu = tree_cpu(pid) - cpu0 + time.process_time() - own0
    logged = [s for s in read_steps(out / "steps") if s.start >= start]
    prompt_s = statistics.median([s.seconds for s in logged if s.prompt_tokens] or [prompt_ms / 1e3])
    token_s = statistics.median([s.seconds for s in logged if s.decodes and not s.prompt_tokens] or [token_ms / 1e3])
    step = max(0.0, gap - token_s)
    return {"step_overhead_s": step, "request_overhead_s": max(0.0, ttft - prompt_s - step),
            "background_cpu_s": max(0.0, cpu - sum(s.seconds for s in logged)) / (REQUESTS + 1) if cpu > 0 else 0.0,
            "live_ttft_s": ttft, "live_tbt_s": gap, "live_prompt_step_s": prompt_s, "live_decode_step_s": token_s,
            "alone_prompt_s": prompt_ms / 1e3, "alone_token_s": token_ms / 1e3,
            "how": f"serve, 1 mixed worker, unloaded: {REQUESTS} sequential streaming requests of {PROMPT} prompt "
                   f"tokens and {TOKENS} output tokens, medians, against the same requests' logged steps; "
                   "background CPU: serve's processes and this client, less the engine steps, per request"}


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) so far of process `root` and every live descendant (serve
    starts its workers in sessions of their own) (Linux /proc; 0.0 where there is none)."""
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats: dict[int, tuple[int, int]] = {}  # pid -> (parent, cpu ticks)
    try:
        entries = [d for d in Path("/proc").iterdir() if d.name.isdigit()]
    except OSError:
        return 0.0
    for d in entries:
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        stats[int(d.name)] = (int(f[1]), int(f[11]) + int(f[12]))
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo += children.get(pid, [])
    return total / hz
